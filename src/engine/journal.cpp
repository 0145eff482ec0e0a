#include "engine/journal.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <set>

#include "core/fsutil.hpp"
#include "core/hash.hpp"

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

}  // namespace

json Journal::to_json() const {
  json segs = json::array();
  for (const auto& s : segments) {
    json outputs = json::array();
    for (const auto& r : s.output_rows) outputs.push_back({r.begin, r.end});
    segs.push_back({{"file", s.file}, {"rows", {s.rows.begin, s.rows.end}}, {"outputs", outputs}});
  }
  json sums = json::array();
  for (auto c : checksums) sums.push_back(hex64(c));
  json spool_list = json::array();
  for (const auto& sp : spools) spool_list.push_back({{"output", sp.output}, {"file", sp.file}, {"state", to_hex(sp.state)}});
  return {{"spools", spool_list}, {"format", "qstage-journal-1"}, {"key", key}, {"rows", rows}, {"tile_rows", tile_rows},
          {"committed_rows", committed_rows}, {"segments", segs}, {"checksums", sums},
          {"reduction", to_hex(reduction)}, {"appended", appended}, {"buckets", buckets}, {"attempts", attempts}, {"wall_seconds", wall_seconds},
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
    out.segments.push_back(std::move(seg));
  }
  for (const auto& c : j.at("checksums")) out.checksums.push_back(parse_hex64(c.get<std::string>()));
  // (In a journal file the state is in its side file, which StepWork::load reads; a journal
  // broadcast between ranks carries it inline.)
  out.reduction = from_hex(j.value("reduction", std::string()));
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
  std::string text;
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
        for (const auto& s : j.segments) usable = usable && fs::exists(dir_ / s.file);
        for (const auto& s : j.segments) usable = usable && s.output_rows.size() == spec.outputs.size();
        for (const auto& sp : j.spools) usable = usable && fs::exists(dir_ / sp.file);
        if (!usable) spdlog::info("discarding earlier progress in {}: it belongs to other parameters or inputs",
                                  dir_.string());
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
      // refine_plan's measurements, the earlier passes of the step (they record their key), and
      // what a stage of several passes keeps between them (stage-*: sci.solve's spaces)
      return (name.rfind("plan-", 0) == 0 && name.size() > 10 && name.substr(name.size() - 5) == ".json") ||
             name == kPassState || name.rfind("pass-", 0) == 0 || name.rfind("stage-", 0) == 0;
    };
    for (const auto& entry : fs::directory_iterator(dir_))
      if (!keep.count(entry.path().filename().string()) && !planned(entry.path().filename().string()))
        fs::remove_all(entry.path());
    fsutil::fsync_dir(dir_);
    text = j.to_json().dump();
  }
  return Journal::from_json(json::parse(comm_.broadcast(text)));
}

// The fold's state is binary and may be large (a partial per output row): it goes to a side file
// named by the committed rows, written (atomically) before the journal that names it, so a kill
// between the two leaves the old journal with its old file. Its size and hash are checked on load.
void StepWork::save(const Journal& journal) const {
  json j = journal.to_json();
  j.erase("reduction");
  std::string current;
  if (!journal.reduction.empty()) {
    current = fmt::format("reduction-{}.bin", journal.committed_rows);
    fsutil::write_file_atomic(dir_ / current, journal.reduction);
    j["reduction_file"] = current;
    j["reduction_bytes"] = journal.reduction.size();
    j["reduction_hash"] = hash_bytes(journal.reduction);
  }
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
