#include "engine/journal.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "core/fsutil.hpp"
#include "core/hash.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"

namespace qstage::engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reduction state is binary; store it as hex so the journal stays plain JSON.
std::string to_hex(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string from_hex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

// Journals since the format of 2026-12 carry a hash of their own text and per-segment checksums.
constexpr const char* kFormat = "qstage-journal-2";

// Outputs whose rows the segments hold (engine/output_sinks.cpp's RowsSink); coded chunks go to
// spools, exchanged ones to bucket files.
bool in_segments(const OutputDecl& out) {
  return out.kind == OutputKind::rows || (out.kind == OutputKind::appended && out.buckets == 0);
}

}  // namespace

std::string self_hash(json j) {
  j.erase("hash");
  return hash_bytes(j.dump());
}

std::string journal_problem(const Journal& j, const PassSpec& spec) {
  if (j.committed_rows > j.rows) return fmt::format("committed_rows {} is beyond the pass's {} rows", j.committed_rows, j.rows);
  const bool segmented = std::any_of(spec.outputs.begin(), spec.outputs.end(), in_segments);
  if (!segmented || j.committed_rows == 0) {
    if (!j.segments.empty() && !segmented) return "it names segments, but the pass writes none";
    if (j.committed_rows == 0 && !j.segments.empty()) return "it names segments, but no rows are committed";
    return "";
  }
  // The segments cover [0, committed_rows) in order, and each output's rows follow on.
  std::uint64_t row = 0;
  std::vector<std::uint64_t> out_row(spec.outputs.size(), 0);
  for (const auto& seg : j.segments) {
    if (seg.rows.begin != row || seg.rows.end < seg.rows.begin)
      return fmt::format("segment {} holds rows [{}, {}), after rows up to {}", seg.file, seg.rows.begin, seg.rows.end, row);
    for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
      if (!in_segments(spec.outputs[o])) continue;
      const RowRange r = seg.output_rows.at(o);
      if (r.begin != out_row[o] || r.end < r.begin ||
          (spec.outputs[o].kind == OutputKind::rows && (r.begin != seg.rows.begin || r.end != seg.rows.end)))
        return fmt::format("segment {} places rows [{}, {}) of '{}' out of order", seg.file, r.begin, r.end,
                           spec.outputs[o].name);
      out_row[o] = r.end;
    }
    row = seg.rows.end;
  }
  if (row != j.committed_rows)
    return fmt::format("committed_rows is {}, but its segments hold rows up to {}", j.committed_rows, row);
  for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
    if (spec.outputs[o].kind == OutputKind::appended &&
        std::accumulate(j.appended[o].begin(), j.appended[o].end(), std::uint64_t{0}) != out_row[o])
      return fmt::format("its batches appended other rows of '{}' than its segments hold", spec.outputs[o].name);
    if (!in_segments(spec.outputs[o]) ||
        std::any_of(j.segments.begin(), j.segments.end(), [](const Segment& s) { return s.checksums.empty(); }))
      continue;
    std::uint64_t sum = 0;
    for (const auto& seg : j.segments) sum += seg.checksums.at(o);  // wraps modulo 2^64
    if (sum != j.checksums.at(o))
      return fmt::format("the checksum of '{}' is not the sum of its segments'", spec.outputs[o].name);
  }
  return "";
}

std::optional<BadSegment> first_bad_segment(const Journal& j, const PassSpec& spec, const fs::path& dir) {
  for (std::size_t k = 0; k < j.segments.size(); ++k) {
    const Segment& seg = j.segments[k];
    try {
      const h5::File file = h5::File::open(dir / seg.file, h5::Mode::read_only);
      for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
        if (!in_segments(spec.outputs[o])) continue;
        const RowRange r = seg.output_rows.at(o);
        const h5::Dataset d = file.open_dataset(spec.outputs[o].name);
        const h5::Shape shape = d.shape();
        if (shape.empty() || shape[0] != r.size())
          return BadSegment{k, fmt::format("holds {} rows of '{}'; its journal recorded {}", shape.empty() ? 0 : shape[0],
                                           spec.outputs[o].name, r.size())};
        if (!seg.checksums.empty() && h5::qsum64_of_rows(d, r.size(), r.begin) != seg.checksums.at(o))
          return BadSegment{k, fmt::format("rows [{}, {}) of '{}' do not match their checksum", r.begin, r.end,
                                           spec.outputs[o].name)};
      }
    } catch (const std::exception& e) {
      return BadSegment{k, fmt::format("cannot be read ({})", e.what())};
    }
  }
  return std::nullopt;
}

json Journal::to_json() const {
  json segs = json::array();
  for (const auto& s : segments) {
    json outputs = json::array();
    for (const auto& r : s.output_rows) outputs.push_back({r.begin, r.end});
    json seg = {{"file", s.file}, {"rows", {s.rows.begin, s.rows.end}}, {"outputs", outputs}};
    if (!s.checksums.empty()) {
      seg["sums"] = json::array();
      for (auto c : s.checksums) seg["sums"].push_back(hex64(c));
    }
    segs.push_back(std::move(seg));
  }
  json sums = json::array();
  for (auto c : checksums) sums.push_back(hex64(c));
  json spool_list = json::array();
  for (const auto& sp : spools) spool_list.push_back({{"output", sp.output}, {"file", sp.file}, {"state", to_hex(sp.state)}});
  return {{"spools", spool_list}, {"format", kFormat}, {"key", key}, {"rows", rows}, {"tile_rows", tile_rows},
          {"committed_rows", committed_rows}, {"segments", segs}, {"checksums", sums},
          {"appended", appended}, {"buckets", buckets}, {"attempts", attempts}, {"wall_seconds", wall_seconds},
          {"compute_seconds", compute_seconds}};
}

Journal Journal::from_json(const json& j) {
  Journal out;
  out.key = j.at("key").get<std::string>();
  out.rows = j.at("rows").get<std::uint64_t>();
  out.tile_rows = j.at("tile_rows").get<std::uint64_t>();
  out.committed_rows = j.at("committed_rows").get<std::uint64_t>();
  for (const auto& s : j.at("segments")) {
    Segment seg{s.at("file").get<std::string>(), {s.at("rows")[0].get<std::uint64_t>(), s.at("rows")[1].get<std::uint64_t>()}, {}};
    for (const auto& r : s.value("outputs", json::array()))
      seg.output_rows.push_back({r[0].get<std::uint64_t>(), r[1].get<std::uint64_t>()});
    for (const auto& c : s.value("sums", json::array())) seg.checksums.push_back(parse_hex64(c.get<std::string>()));
    out.segments.push_back(std::move(seg));
  }
  for (const auto& c : j.at("checksums")) out.checksums.push_back(parse_hex64(c.get<std::string>()));
  // (The fold's state is not in the JSON: in a journal file it is in its side file, which
  // StepWork::load reads; between ranks it stays on rank 0, the only rank that folds.)
  out.appended = j.value("appended", std::vector<std::vector<std::uint64_t>>{});
  out.buckets = j.value("buckets", std::vector<std::vector<std::uint64_t>>{});
  for (const auto& sp : j.value("spools", json::array()))
    out.spools.push_back({sp.at("output").get<std::string>(), sp.at("file").get<std::string>(),
                          from_hex(sp.at("state").get<std::string>())});
  out.attempts = j.value("attempts", 0);
  out.wall_seconds = j.value("wall_seconds", 0.0);
  out.compute_seconds = j.value("compute_seconds", 0.0);
  return out;
}

StepWork::StepWork(fs::path dir, std::string key, const mpi::Comm& comm)
    : dir_(std::move(dir)), key_(std::move(key)), comm_(comm) {}

Journal StepWork::load(const PassSpec& spec) {
  std::string text, reduction;
  if (comm_.root()) {
    fs::create_directories(dir_);
    Journal j;
    const fs::path path = dir_ / "journal.json";
    bool usable = false;
    std::string reduction_file;  // the side file the journal names, if any
    if (fs::exists(path)) {
      try {
        const json text = json::parse(fsutil::read_file(path));
        j = Journal::from_json(text);
        usable = j.key == key_ && j.rows == spec.rows && j.tile_rows == spec.tile_rows &&
                 j.checksums.size() == spec.outputs.size() && j.appended.size() == spec.outputs.size() &&
                 j.buckets.size() == spec.outputs.size();
        if (usable && text.contains("reduction_file")) {
          reduction_file = text.at("reduction_file").get<std::string>();
          j.reduction = read_reduction(text);
        }
        for (const auto& s : j.segments) usable = usable && s.output_rows.size() == spec.outputs.size();
        for (const auto& s : j.segments) usable = usable && (s.checksums.empty() || s.checksums.size() == spec.outputs.size());
        if (!usable) spdlog::info("discarding earlier progress in {}: it belongs to other parameters or inputs",
                                  dir_.string());
        else if (const std::string problem = verify(text, j, spec); !problem.empty()) {
          spdlog::warn("discarding the earlier progress in {}: {}; the pass starts again", dir_.string(), problem);
          usable = false;
        }
      } catch (const std::exception& e) {
        usable = false;
        spdlog::warn("discarding unreadable journal {}: {}", path.string(), e.what());
      }
    }
    if (!usable) {
      j = Journal{};
      j.key = key_;
      j.rows = spec.rows;
      j.tile_rows = spec.tile_rows;
      j.checksums.assign(spec.outputs.size(), 0);
      j.appended.assign(spec.outputs.size(), {});
      j.buckets.assign(spec.outputs.size(), {});
    }
    // Anything the journal does not name is not trusted: half-written segments, a segment
    // renamed just before a kill, an interrupted merge.
    std::set<std::string> keep{"journal.json"};
    if (usable && !reduction_file.empty()) keep.insert(reduction_file);
    for (const auto& s : j.segments) keep.insert(s.file);
    for (const auto& sp : j.spools) keep.insert(sp.file);
    for (std::size_t o = 0; o < j.buckets.size(); ++o)
      for (std::size_t b = 0; b < j.buckets[o].size(); ++b) keep.insert(bucket_file(o, b));
    auto planned = [](const std::string& name) {
      // a run's measurements (plan-*), the earlier passes of the step (they record their key), and
      // what a stage of several passes keeps between them (stage-*: sci.solve's spaces)
      return (name.rfind("plan-", 0) == 0 && name.size() > 10 && name.substr(name.size() - 5) == ".json") ||
             name == kRunState || name.rfind("pass-", 0) == 0 || name.rfind("stage-", 0) == 0;
    };
    for (const auto& entry : fs::directory_iterator(dir_))
      if (!keep.count(entry.path().filename().string()) && !planned(entry.path().filename().string()))
        fs::remove_all(entry.path());
    fsutil::fsync_dir(dir_);
    text = j.to_json().dump();
    reduction = std::move(j.reduction);
  }
  Journal out = Journal::from_json(json::parse(comm_.broadcast(text)));
  out.reduction = std::move(reduction);  // (rank 0's; empty elsewhere)
  return out;
}

// The fold's state is binary and may be large (a partial per output row): it goes to a side file
// named by the committed rows, written (atomically) before the journal that names it, so a kill
// between the two leaves the old journal with its old file. Its size and hash are checked on load.
// A journal is trusted as far as it and its files agree: its own hash (an edited or damaged
// journal), its segments against its rows and checksums, every spool it names present, and every
// segment's rows against their checksums. A segment that fails takes the rows from it on with it
// where nothing else depends on them (plain row outputs, no fold), else the whole pass. Returns
// why the journal cannot be used (empty: it can, possibly cut back to its good segments).
std::string StepWork::verify(const json& text, Journal& j, const PassSpec& spec) const {
  if (text.contains("hash") ? text.at("hash").get<std::string>() != self_hash(text)
                            : text.value("format", "") != "qstage-journal-1")
    return "journal.json does not match its own hash (edited or damaged)";
  if (std::string problem = journal_problem(j, spec); !problem.empty()) return "journal.json is inconsistent: " + problem;
  for (const auto& s : j.segments)
    if (!fs::exists(dir_ / s.file)) return fmt::format("its segment {} is missing", s.file);
  for (const auto& sp : j.spools)
    if (!fs::exists(dir_ / sp.file)) return fmt::format("its chunk spool {} is missing", sp.file);
  const auto bad = first_bad_segment(j, spec, dir_);
  if (!bad) return "";
  const Segment& seg = j.segments[bad->index];
  const bool cut_back_possible =
      j.reduction.empty() && j.spools.empty() && !seg.checksums.empty() &&
      std::all_of(spec.outputs.begin(), spec.outputs.end(), [](const OutputDecl& o) { return o.kind == OutputKind::rows; });
  if (!cut_back_possible) return fmt::format("its segment {} {}", seg.file, bad->why);
  spdlog::warn("segment {} of {} {}: recomputing rows [{}, {})", seg.file, dir_.string(), bad->why, seg.rows.begin,
               j.committed_rows);
  j.committed_rows = seg.rows.begin;
  j.segments.resize(bad->index);
  for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
    j.checksums[o] = 0;
    for (const auto& kept : j.segments) j.checksums[o] += kept.checksums.at(o);
  }
  save(j);
  return "";
}

void StepWork::save(const Journal& journal) const {
  json j = journal.to_json();
  std::string current;
  if (!journal.reduction.empty()) {
    current = fmt::format("reduction-{}.bin", journal.committed_rows);
    fsutil::write_file_atomic(dir_ / current, journal.reduction);
    j["reduction_file"] = current;
    j["reduction_bytes"] = journal.reduction.size();
    j["reduction_hash"] = hash_bytes(journal.reduction);
  }
  j["hash"] = self_hash(j);
  fsutil::write_file_atomic(dir_ / "journal.json", j.dump(1));
  // The journal now names `current`: earlier side files are not needed any more.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("reduction-", 0) == 0 && name != current) fs::remove(entry.path(), ec);
  }
}

std::string StepWork::read_reduction(const json& journal) const {
  const std::string file = journal.at("reduction_file").get<std::string>();
  std::string bytes = fsutil::read_file(dir_ / file);
  if (bytes.size() != journal.at("reduction_bytes").get<std::uint64_t>() ||
      hash_bytes(bytes) != journal.at("reduction_hash").get<std::string>())
    throw std::runtime_error(fmt::format("{} does not hold the state its journal recorded", file));
  return bytes;
}

void StepWork::remove() const {
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec) spdlog::warn("could not remove {}: {}", dir_.string(), ec.message());
}

std::string StepWork::pass_folder(int index) { return fmt::format("pass-{}", index); }

std::string StepWork::bucket_file(std::size_t output, std::size_t bucket) {
  return fmt::format("bucket-{}-{:06}.bin", output, bucket);
}

fs::path StepWork::segment_path(std::size_t index) const { return dir_ / fmt::format("seg-{:06}.h5", index); }

void StepWork::save_progress(const json& progress) const {
  try {
    fsutil::write_file_atomic(dir_ / "progress.json", progress.dump());
  } catch (const std::exception& e) {
    spdlog::debug("could not write progress: {}", e.what());
  }
}

}  // namespace qstage::engine
