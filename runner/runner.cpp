#include "runner/runner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>

#include "core/affinity.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/serial.hpp"
#include "core/signals.hpp"
#include "core/units.hpp"
#include "engine/checkpoint_pace.hpp"
#include "engine/stream_engine.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"
#include "runner/manifest.hpp"
#include "runner/planner.hpp"
#include "runner/progress.hpp"
#include "runner/run_lock.hpp"
#include "stages/common/kept.hpp"
#include "stages/common/stage.hpp"

namespace qstage::runner {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

fs::path default_run_dir(const std::string& workflow) { return fs::path("qstage-runs") / workflow; }

namespace {

// Runs `check` on rank 0; if it returns a message, every rank throws InputError with it.
template <typename F>
void collective_check(const mpi::Comm& comm, F&& check) {
  std::string message;
  if (comm.root()) {
    try {
      message = check();
    } catch (const InputError& e) {
      message = e.what();
    }
  }
  message = comm.broadcast(message);
  if (!message.empty()) throw InputError(message);
}

// True if `dir` holds nothing but what an interrupted first `qstage run` leaves before its
// manifest exists (empty outputs/ and steps/, logs, temporary files): it can be taken as new.
bool only_our_skeleton(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "logs" || name == "manifest.json.tmp" || name == "spec.yaml" || name == "spec.yaml.tmp" ||
        name == RunDirLock::kFile)
      continue;
    if ((name == "outputs" || name == "steps") && fs::is_empty(entry.path(), ec)) continue;
    return false;
  }
  return true;
}

// What a run replaces in the run directory as it starts: kept so that a step whose input turns
// out to be bad while it runs can put it back, and `resume` then replays the spec that was
// accepted rather than the rejected one.
struct RunDirBefore {
  std::optional<std::string> spec_text;  // spec.yaml's bytes (none: a new directory)
  json manifest = nullptr;               // the manifest as it was (null: none)
};

// Creates or checks the run directory and takes its lock (rank 0 holds it for the whole run).
// Nothing in it is changed if it belongs to another spec, or if another run holds it.
void prepare_run_dir(const spec::Workflow& wf, const RunDir& dir, const mpi::Comm& comm,
                     std::optional<RunDirLock>& lock, RunDirBefore& before) {
  collective_check(comm, [&]() -> std::string {
    std::error_code ec;
    if (fs::exists(dir.root, ec) && !fs::is_directory(dir.root, ec))
      return fmt::format("run directory '{}' is a file; expected a directory", dir.root.string());
    auto manifest = Manifest::load(dir.root);
    if (manifest) {
      if (manifest->workflow() != wf.name)
        return fmt::format("run directory '{}' holds workflow '{}' (from {}); this spec is workflow '{}'; expected a "
                           "new directory (--run-dir) or the same workflow",
                           dir.root.string(), manifest->workflow(), manifest->data().value("spec_source", "?"), wf.name);
    } else if (fs::exists(dir.root, ec) && !only_our_skeleton(dir.root)) {
      return fmt::format("run directory '{}' exists, is not empty and has no manifest.json; expected a new or empty "
                         "directory, or one made by qstage",
                         dir.root.string());
    }
    try {
      fs::create_directories(dir.root);
      std::string holder;
      lock = RunDirLock::acquire(dir.root, holder);
      if (!lock)
        return fmt::format("run directory '{}' is in use by {}; expected one run at a time in a directory (wait for "
                           "it to end, or stop it with SIGTERM first)",
                           dir.root.string(), holder);
      manifest = Manifest::load(dir.root);  // (as the lock's holder left it, if one just ended)
      before.manifest = manifest ? manifest->data() : json(nullptr);
      if (fs::exists(dir.spec())) before.spec_text = fsutil::read_file(dir.spec());
      fs::create_directories(dir.root / "outputs");
      fs::create_directories(dir.root / "steps");
      fs::create_directories(dir.logs());
    } catch (const fs::filesystem_error& e) {
      return fmt::format("cannot create run directory '{}': {}; expected a directory qstage may write (--run-dir)",
                         dir.root.string(), e.code().message());
    }
    Manifest m = manifest ? *manifest : Manifest::create(wf.name);
    m.data()["spec_source"] = wf.source;
    m.data()["spec_dir"] = wf.base_dir.string();
    m.data()["qstage_version"] = QSTAGE_VERSION;
    fsutil::write_file_atomic(dir.spec(), wf.text);
    m.save(dir.root);
    return "";
  });
}

std::string plural(std::uint64_t n, const char* word) { return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s"); }

// Why a step must run, from its previous record; empty if the record says it is done with this key.
std::string rerun_reason(const json* record, const std::string& key, const json& params, const json& compress_output,
                         const json& input_hashes, bool output_exists) {
  if (!record || record->empty()) return "new step";
  const std::string state = record->value("state", "");
  if (record->value("key", "") == key) {
    if (state == "done") return output_exists ? "" : "its output file is missing";
    return state == "stopped" || state == "running" ? "resuming an interrupted run" : "retrying after a failure";
  }
  std::vector<std::string> changes;
  const json old_params = record->value("params", json::object());
  for (auto it = params.begin(); it != params.end(); ++it)
    if (!old_params.contains(it.key()) || old_params[it.key()] != it.value())
      changes.push_back(fmt::format("{} {} -> {}", it.key(), old_params.contains(it.key()) ? old_params[it.key()].dump()
                                                                                          : "(unset)",
                                    it.value().dump()));
  if (!changes.empty()) return fmt::format("parameters changed: {}", fmt::join(changes, ", "));
  const json old_compress = record->value("compress_output", json());
  if (old_compress != compress_output)
    return fmt::format("compress_output changed: {} -> {}", old_compress.is_null() ? "(unset)" : old_compress.dump(),
                       compress_output.is_null() ? "(unset)" : compress_output.dump());
  const json old_inputs = record->value("inputs", json::object());
  for (auto it = input_hashes.begin(); it != input_hashes.end(); ++it)
    if (!old_inputs.contains(it.key()) || old_inputs[it.key()].value("hash", "") != it.value().value("hash", ""))
      changes.push_back(fmt::format("input '{}' ({})", it.key(), it.value().value("source", "?")));
  if (!changes.empty()) return fmt::format("inputs changed: {}", fmt::join(changes, ", "));
  return "the stage's version changed";
}

class WorkflowRun {
 public:
  WorkflowRun(const spec::Workflow& wf, const RunOptions& options, const mpi::Comm& comm, RunDir dir)
      : wf_(wf), options_(options), comm_(comm), dir_(std::move(dir)) {}

  // Builds the backend and checks every step's batch plan against the budgets (before anything
  // is written).
  void setup(std::vector<PlannedStep>& planned) {
    BackendOptions bo = options_.backend;
    bo.local_rank = comm_.local_rank();
    bo.local_size = comm_.local_size();
    const auto device_memory = options_.device_memory ? options_.device_memory : wf_.options.device_memory;
    const auto host_memory = options_.host_memory ? options_.host_memory : wf_.options.host_memory;
    if (device_memory) bo.device_memory = parse_budget(*device_memory, "device memory budget");
    if (host_memory) bo.host_memory = parse_budget(*host_memory, "host memory budget");
    const auto backend_started = std::chrono::steady_clock::now();
    backend_ = make_backend(bo);
    if (!device_memory) {
      // Ranks that landed on the same GPU (more ranks than GPUs on a host; not where the launcher
      // gives each rank its own GPU through CUDA_VISIBLE_DEVICES) share its default budget.
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      const std::string bus = backend_->pci_bus_id(), mine = std::string(host) + "/" + bus;
      const auto all = comm_.allgather(mine);
      const auto sharing = static_cast<int>(std::count(all.begin(), all.end(), mine));
      if (!bus.empty() && sharing > 1) {
        bo.gpu_sharing = sharing;
        backend_.reset();
        backend_ = make_backend(bo);
      }
    }
    backend_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - backend_started).count();
    device_text_ = comm_.broadcast(backend_->description());
    bind_near_device(bo.bind);
    engine::EngineOptions eo;
    eo.slots = options_.slots;
    const std::string interval = options_.checkpoint_interval.value_or(wf_.options.checkpoint_interval.value_or("2m"));
    auto parsed = parse_duration(interval, "checkpoint interval");
    eo.checkpoint_seconds = parsed ? std::optional<double>(parsed->count()) : std::nullopt;
    checkpoint_seconds_ = eo.checkpoint_seconds;
    eo.max_batch_rows = options_.max_batch_rows.value_or(wf_.options.max_batch_rows.value_or(0));
    engine_ = std::make_unique<engine::StreamEngine>(*backend_, comm_, eo);
    // Check every step's batch plan against the budgets before running any of them.
    for (auto& p : planned) {
      try {
        engine_->plan(p.plan.pass);
      } catch (const InputError& e) {
        throw InputError(fmt::format("step '{}' ({}): {}", p.step->id, p.step->stage, e.what()));
      }
    }
  }

  void run(std::vector<PlannedStep>& planned) {
    const auto& eo_interval = checkpoint_seconds_;
    if (comm_.root()) {
      spdlog::info("workflow '{}': {} in {} on {} ({} {}; device budget {}, host budget {}; checkpoint every {})",
                   wf_.name, plural(wf_.steps.size(), "step"), dir_.root.string(), device_text_, comm_.size(),
                   comm_.size() == 1 ? "rank" : "ranks", format_bytes(static_cast<double>(backend_->device_budget().limit())),
                   format_bytes(static_cast<double>(backend_->host_budget().limit())),
                   eo_interval ? format_duration(*eo_interval) : std::string("never"));
      spdlog::debug("start-up: MPI_Init {:.3f} s, backend {:.3f} s", mpi::Session::init_seconds(), backend_seconds_);
    }
    for (auto& p : planned) {
      // Collective: a signal may reach the ranks at different moments.
      if (comm_.any(signals::stop_requested() != 0))
        throw StopRequested(fmt::format("stopped by {} before step '{}'", signals::signal_name(signals::stop_requested()),
                                        p.step->id));
      run_step(p);
    }
  }

 private:
  // The content hash of each input, as recorded in the manifest (rank 0).
  json input_hashes(const PlannedStep& p, Manifest& m) {
    json out = json::object();
    for (const auto& [slot, in] : p.inputs) {
      json entry;
      if (!in.ref.step.empty()) {
        const json* rec = m.find_step(in.ref.step);
        // A computed output (a network, a plan) is one thing: its whole content decides. Else the
        // dataset's checksum, but a measurement's (stages::is_measured), which differs from run
        // to run: it is identified by the key of the step that measured it.
        std::string sum = rec ? rec->value("content", "") : "";
        if (sum.empty() && rec) {
          const json measured = rec->value("measured", json::array());
          sum = std::find(measured.begin(), measured.end(), in.dataset) != measured.end()
                    ? "measured by step key " + rec->value("key", "")
                    : rec->value("checksums", json::object()).value(in.dataset, "");
        }
        entry = {{"source", fmt::format("step {}:{}", in.ref.step, in.dataset)},
                 {"hash", hash_bytes(json{{"qsum64", sum}, {"dtype", h5::dtype_name(in.info.layout.dtype)}, {"shape", in.info.layout.shape}}.dump())}};
      } else {
        entry = {{"source", fmt::format("{}:{}", in.ref.file.string(), in.dataset)},
                 {"hash", hash_bytes(json{{"file", cached_file_hash(in.ref.file, m)}, {"dataset", in.dataset}}.dump())}};
      }
      out[slot] = entry;
    }
    for (const auto& [pointer, file] : p.step->files)
      out["file:" + pointer] = {{"source", file.string()}, {"hash", cached_file_hash(file, m)}};
    return out;
  }

  // Hashing a large input file is costly: reuse the hash while its size and mtime are unchanged.
  static std::string cached_file_hash(const fs::path& file, Manifest& m) {
    if (fs::is_directory(file)) {  // a folder parameter: the names and contents of its files
      std::map<std::string, std::string> files;
      for (const auto& entry : fs::directory_iterator(file))
        if (entry.is_regular_file()) files[entry.path().filename().string()] = cached_file_hash(entry.path(), m);
      return hash_bytes(json(files).dump());
    }
    const auto size = fs::file_size(file);
    const auto mtime = fs::last_write_time(file).time_since_epoch().count();
    json& cache = m.data()["file_hashes"][file.string()];
    if (cache.is_object() && cache.value("size", std::uintmax_t{0}) == size && cache.value("mtime", decltype(mtime){0}) == mtime)
      return cache["hash"].get<std::string>();
    const std::string h = hash_file(file);
    cache = {{"size", size}, {"mtime", mtime}, {"hash", h}};
    return h;
  }

  // A committed output whose key matches (e.g. written just before a kill, before the manifest
  // was updated) is complete - it only ever appears by an atomic rename - so it is adopted.
  // Its record's checksums and measurements.
  static std::optional<json> adoptable(const fs::path& output, const std::string& key) {
    if (!h5::File::is_hdf5(output)) return std::nullopt;
    try {
      h5::File f = h5::File::open(output, h5::Mode::read_only);
      if (stages::step_key_of(f) != key) return std::nullopt;
      json sums = json::object(), measured = json::array();
      for (const auto& path : f.dataset_paths()) {
        h5::Dataset d = f.open_dataset(path);
        if (d.has_attribute("qsum64")) sums[path.substr(1)] = d.string_attribute("qsum64");
        else if (d.has_attribute("stored_xxh64")) sums[path.substr(1)] = d.string_attribute("stored_xxh64");
        if (stages::is_measured(d)) measured.push_back(path.substr(1));
      }
      json found = {{"checksums", sums}};
      if (!measured.empty()) found["measured"] = measured;
      if (f.has_attribute("qstage.content")) found["content"] = f.string_attribute("qstage.content");
      return found;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  void run_step(PlannedStep& p) {
    const spec::Step& step = *p.step;
    const fs::path output = dir_.output(step.id);
    std::string key;
    json hashes;
    // Rank 0 decides (it owns the manifest); every rank follows.
    json decision;
    if (comm_.root()) {
      Manifest m = *Manifest::load(dir_.root);
      hashes = input_hashes(p, m);
      // Only content hashes enter the key; the sources are for people.
      json key_inputs = json::object();
      for (auto it = hashes.begin(); it != hashes.end(); ++it) key_inputs[it.key()] = it.value()["hash"];
      json key_fields = {{"stage", step.stage}, {"version", step.impl->info().version}, {"params", step.params},
                         {"inputs", key_inputs}};
      if (!step.compress_output.is_null()) key_fields["compress_output"] = step.compress_output;  // (older keys stay)
      key = hash_bytes(key_fields.dump());
      std::string reason =
          rerun_reason(m.find_step(step.id), key, step.params, step.compress_output, hashes, fs::exists(output));
      // Verified before it is trusted: a damaged output is recomputed, never adopted.
      bool damaged = false;
      if (reason.empty()) {
        if (const std::string problem = output_problem(output, *m.find_step(step.id)); !problem.empty()) {
          spdlog::warn("step '{}': its output {} {}; recomputing it", step.id, output.string(), problem);
          reason = "its committed output " + problem;
          damaged = true;
        }
      }
      std::optional<json> adopted = reason.empty() || damaged ? std::nullopt : adoptable(output, key);
      decision = {{"key", key}, {"hashes", hashes}, {"reason", reason}, {"adopt", adopted ? *adopted : json(nullptr)}};
      if (adopted) {
        json& rec = m.step(step.id);
        rec.update({{"stage", step.stage}, {"version", step.impl->info().version}, {"state", "done"}, {"key", key},
                    {"params", step.params}, {"inputs", hashes}, {"output", fs::relative(output, dir_.root).string()},
                    {"checksums", adopted->at("checksums")}, {"output_bytes", fs::file_size(output)},
                    {"finished", utc_now()}});
        for (const char* field : {"content", "measured"}) {
          if (adopted->contains(field)) rec[field] = adopted->at(field);
          else rec.erase(field);
        }
      } else if (!reason.empty()) {
        json& rec = m.step(step.id);
        rec.update({{"stage", step.stage}, {"version", step.impl->info().version}, {"state", "running"}, {"key", key},
                    {"params", step.params}, {"inputs", hashes}, {"started", utc_now()}});
        if (step.compress_output.is_null()) rec.erase("compress_output");
        else rec["compress_output"] = step.compress_output;
      }
      m.save(dir_.root);
    }
    decision = json::parse(comm_.broadcast(decision.dump()));
    key = decision["key"].get<std::string>();
    hashes = decision["hashes"];
    const std::string reason = decision["reason"].get<std::string>();
    if (reason.empty()) {
      if (comm_.root()) {
        spdlog::info("step '{}' ({}): up to date, skipped", step.id, step.stage);
        remove_leftovers(step.id, output);  // a kill after the manifest update leaves these
      }
      return;
    }
    if (!decision["adopt"].is_null()) {
      if (comm_.root()) {
        spdlog::info("step '{}' ({}): its complete output was already committed; recorded", step.id, step.stage);
        remove_leftovers(step.id, output);
      }
      return;
    }
    if (comm_.root()) {
      spdlog::info("step '{}' ({}): running ({})", step.id, step.stage, reason);
      std::error_code ec;
      fs::remove(fsutil::temp_path(output), ec);  // an interrupted merge's file is never reused
    }
    comm_.barrier();
    try {
      execute(p, key, hashes, output);
    } catch (const StopRequested& e) {
      // A stop a stage took at a safe point of its own before any pass (reading its inputs,
      // building its problem) says where; one the runner recorded already goes on as it is.
      if (std::string_view(e.what()).rfind("stopped by ", 0) == 0) throw;
      stopped(step.id, "", 0, 0, json::object(), e.what());
    }
  }

  // A step's opened inputs, on every rank.
  struct OpenInputs {
    std::vector<h5::File> files;
    std::map<std::string, h5::Dataset> datasets;
    std::map<std::string, const h5::Dataset*> by_slot;
  };

  OpenInputs open_inputs(const PlannedStep& p) {
    OpenInputs in;
    for (const auto& [slot, ref] : p.inputs) {
      const fs::path path = ref.ref.step.empty() ? ref.ref.file : dir_.output(ref.ref.step);
      in.files.push_back(h5::File::open(path, h5::Mode::read_only, comm_.get()));
      in.datasets[slot] = in.files.back().open_dataset(ref.dataset);
    }
    for (auto& [slot, d] : in.datasets) in.by_slot[slot] = &d;
    return in;
  }

  // The outputs of a step's earlier passes that its later passes stream, opened read-only for as
  // long as the step runs (a pass's output file is complete once the pass is).
  struct EarlierPassOutputs {
    std::map<int, h5::File> files;
    std::map<std::string, h5::Dataset> datasets;   // by streamed-input name
    std::map<std::string, h5::RowFiles> exchanged;  // the same, for exchanged outputs (read in place)
  };

  // Binds a pass's streamed inputs: a step input's slot name, or an earlier pass's output
  // (stages::earlier_pass_input), which is opened here on every rank.
  void bind_inputs(engine::PassSpec& pass, const std::vector<std::string>& sources, const OpenInputs& in,
                   const stages::StepContext& context, EarlierPassOutputs& earlier) {
    for (size_t i = 0; i < pass.inputs.size(); ++i) {
      const std::string& source = sources.at(i);
      if (const auto ref = stages::parse_earlier_pass_input(source)) {
        if (const auto x = earlier.exchanged.find(source); x != earlier.exchanged.end()) {
          pass.inputs[i].files = &x->second;
          continue;
        }
        auto d = earlier.datasets.find(source);
        if (d == earlier.datasets.end()) {
          auto f = earlier.files.find(ref->pass);
          if (f == earlier.files.end())
            f = earlier.files
                    .emplace(ref->pass, h5::File::open(stages::prior_pass_output(context, ref->pass), h5::Mode::read_only,
                                                       comm_.get()))
                    .first;
          if (auto files = engine::exchanged_output(f->second, ref->dataset)) {
            pass.inputs[i].files = &earlier.exchanged.emplace(source, std::move(*files)).first->second;
            continue;
          }
          d = earlier.datasets.emplace(source, f->second.open_dataset(ref->dataset)).first;
        }
        pass.inputs[i].dataset = &d->second;
      } else {
        pass.inputs[i].dataset = in.by_slot.at(source);
      }
    }
  }

  // What a step's earlier runs committed of its run (rank 0 reads it, every rank gets it): the
  // passes done, the wall seconds and the run's state (StepRun::save). A state of another key
  // (parameters or inputs changed) is not used. (Each pass's folder checks its journal's key
  // itself, as the output pass's does.)
  struct CommittedRun {
    int passes_done = 0;
    double wall_seconds = 0;
    std::string state;  // StepRun::save()'s bytes; empty: nothing committed
    bool found = false;
  };

  // The file: a magic line, a JSON header (key, passes done, wall seconds, the state's size and
  // hash, and the header's own hash), then the state's bytes. Written atomically by rank 0.
  static constexpr std::string_view kRunStateMagic = "qstage-run-state-1\n";

  CommittedRun load_committed_run(const std::string& id, const std::string& key) {
    CommittedRun c;
    std::string header;
    if (comm_.root()) {
      const fs::path file = dir_.work(id) / engine::StepWork::kRunState;
      std::error_code ec;
      if (fs::exists(file, ec)) try {
          const std::string bytes = fsutil::read_file(file);
          if (!bytes.starts_with(kRunStateMagic)) throw std::runtime_error("it is not a qstage run state");
          const std::size_t newline = bytes.find('\n', kRunStateMagic.size());
          if (newline == std::string::npos) throw std::runtime_error("its header is cut short");
          const json j = json::parse(bytes.substr(kRunStateMagic.size(), newline - kRunStateMagic.size()));
          if (j.at("hash").get<std::string>() != engine::self_hash(j))
            throw std::runtime_error("its header does not match its own hash (edited or damaged)");
          std::string state = bytes.substr(newline + 1);
          if (state.size() != j.at("state_bytes").get<std::uint64_t>() || hash_bytes(state) != j.at("state_hash").get<std::string>())
            throw std::runtime_error("its state does not match its header (cut short or damaged)");
          if (j.at("key").get<std::string>() == key) {
            c = {j.at("passes_done").get<int>(), j.at("wall_seconds").get<double>(), std::move(state), true};
          }
        } catch (const std::exception& e) {
          spdlog::warn("discarding unreadable {}: {}", file.string(), e.what());
        }
      header = json{{"passes_done", c.passes_done}, {"wall_seconds", c.wall_seconds}, {"found", c.found}}.dump();
    }
    const json j = json::parse(comm_.broadcast(header));
    c.passes_done = j.at("passes_done").get<int>();
    c.wall_seconds = j.at("wall_seconds").get<double>();
    c.found = j.at("found").get<bool>();
    c.state = comm_.broadcast(c.state);
    // (a stage of host work, e.g. selected CI on resident data, may commit state without a pass)
    if (c.found && comm_.root())
      spdlog::info("step '{}': resumed from the state an earlier run committed ({} of its passes done)", id, c.passes_done);
    return c;
  }

  // The step's run-state file, and its bytes for a state (rank 0 replaces it atomically: after a
  // pass, at a commit point, or in the background after a commit point of host work).
  fs::path run_state_file(const std::string& id) {
    fs::create_directories(dir_.work(id));
    return dir_.work(id) / engine::StepWork::kRunState;
  }
  static std::string run_state_bytes(const std::string& key, int passes_done, double wall_seconds, const std::string& state) {
    json j = {{"key", key}, {"passes_done", passes_done}, {"wall_seconds", wall_seconds},
              {"state_bytes", state.size()}, {"state_hash", hash_bytes(state)}};
    j["hash"] = engine::self_hash(j);
    return std::string(kRunStateMagic) + j.dump() + "\n" + state;
  }

  // An InputError, CheckFailed or StopRequested that a unit of a run met on some ranks, agreed
  // over all (the lowest rank's message); any other exception goes on (and aborts the job).
  struct UnitOutcome {
    std::string input_error, check_failure, stop;
  };
  template <typename F>
  UnitOutcome agreed(F&& unit) {
    UnitOutcome o;
    try {
      unit();
    } catch (const InputError& e) {
      o.input_error = e.what();
    } catch (const CheckFailed& e) {
      o.check_failure = e.what();
    } catch (const StopRequested& e) {
      o.stop = e.what();
    }
    if (comm_.size() == 1) return o;
    // (one collective: each rank's three messages, the lowest rank's non-empty one of each kind)
    Packer mine;
    mine.put_string(o.input_error), mine.put_string(o.check_failure), mine.put_string(o.stop);
    UnitOutcome agreed;
    for (const std::string& bytes : comm_.allgather(mine.take())) {
      Unpacker in(bytes);
      for (std::string* kind : {&agreed.input_error, &agreed.check_failure, &agreed.stop}) {
        std::string message = in.get_string();
        if (kind->empty()) *kind = std::move(message);
      }
    }
    return agreed;
  }
  // Ends the step with an agreed error, naming it (and `where`, a pass, if any).
  void fail_on(const UnitOutcome& o, const spec::Step& step, const std::string& where = "") {
    if (o.input_error.empty() && o.check_failure.empty()) return;
    record_failure(step.id);
    const std::string at = fmt::format("step '{}' ({}){}", step.id, step.stage, where.empty() ? "" : ", " + where);
    if (!o.input_error.empty()) throw InputError(fmt::format("{}: {}", at, o.input_error));
    throw CheckFailed(fmt::format("{}: {}", at, o.check_failure));
  }

  // The step's run, started on every rank and brought to the state its earlier runs committed.
  // (A state the run cannot load is discarded: `committed` then says nothing was committed.)
  std::unique_ptr<stages::StepRun> start_run(const spec::Step& step, const stages::StepContext& context,
                                             CommittedRun& committed) {
    std::unique_ptr<stages::StepRun> run;
    fail_on(agreed([&] { run = step.impl->start(context); }), step);
    if (!committed.found) return run;
    std::string unusable;
    const UnitOutcome o = agreed([&] {
      try {
        run->load(committed.state);
      } catch (const InputError&) {
        throw;
      } catch (const std::exception& e) {
        unusable = e.what();
      }
    });
    // A state whose passes' outputs are gone (an operating-system crash between a pass's end and
    // the next commit point may keep an older state than the deletions it allowed).
    if (unusable.empty() && o.input_error.empty() && comm_.root())
      for (int k = std::max(0, run->first_live_pass()); k < committed.passes_done; ++k)
        if (!fs::exists(stages::prior_pass_output(context, k))) {
          unusable = fmt::format("the output of its pass {}, which it reads, is gone", k + 1);
          break;
        }
    fail_on(o, step);
    if (comm_.any(!unusable.empty())) {  // (every rank loads the same bytes, but be sure all agree)
      if (comm_.root())
        spdlog::warn("step '{}': discarding the state an earlier run committed ({}); the step starts again", step.id,
                     unusable.empty() ? "another rank could not load it" : unusable);
      fail_on(agreed([&] { run = step.impl->start(context); }), step);
      committed = CommittedRun{};
    }
    return run;
  }

  // Drives a run through the units before its output pass: each pass streamed in its own folder
  // of the step's work directory, checkpointed and resumed as the output pass is; host work done
  // by the run itself. The run's state is saved after each pass, and after host work at commit
  // points; a stop ends the step (StopRequested) with the state committed.
  void run_units(const spec::Step& step, stages::StepRun& run, const stages::StepContext& context, const OpenInputs& in,
                 EarlierPassOutputs& earlier, const std::string& key, int& passes_done) {
    // Durability at commits, not per pass: a pass's end (its output, its journal, the stage's
    // files, the run's state) is written without waiting for the disk, and made durable at a
    // commit point: at the run's checkpoint interval, at a stop, and before the output pass. A
    // killed process loses nothing by it; an operating-system crash loses the passes since the
    // last commit point, which a resumed run computes again (the same bits).
    const fsutil::DeferredDurability deferred;
    engine::CheckpointPace pace(checkpoint_seconds_, Clock::now());
    // (collective: save() may gather what the ranks hold; the wall time is the ranks' longest)
    // Once saved, the state needs no pass before run.first_live_pass(): those go at once.
    int dropped = 0;  // (passes before it are gone)
    // (rank 0: a commit point of host work writes its state here while the run goes on; every
    // other write of the state waits for it first, so the file never goes back to an older state)
    fsutil::BackgroundWrites background;
    auto save = [&]() {
      const std::string state = run.save();
      const double wall = step_clock_.seconds(&comm_);
      if (comm_.root()) {
        background.wait();
        fsutil::write_file_atomic(run_state_file(step.id), run_state_bytes(key, passes_done, wall, state));
      }
      comm_.barrier();
      dropped = drop_passes(step, earlier, dropped, std::min(run.first_live_pass(), passes_done));
    };
    // (every rank's files of the step, e.g. exchanged buckets, durable before the state naming them)
    auto sync_work = [&]() {
      fsutil::sync_tree(dir_.work(step.id));
      comm_.barrier();
    };
    auto commit_point = [&]() {
      const auto t = Clock::now();
      sync_work();
      const fsutil::DurableNow durable;
      save();
      pace.committed(t);
    };
    // A commit point between units of host work: the state copied aside (StepRun::save) and
    // written and made durable on rank 0's background thread while the next units run. A kill
    // before it lands leaves the state of the commit point before, which resumes to the same
    // bytes. (No pass is dropped for it: the next save, which waits for it, drops them.)
    auto commit_in_background = [&]() {
      const auto t = Clock::now();
      sync_work();
      const std::string state = run.save();
      const double wall = step_clock_.seconds(&comm_);
      if (comm_.root()) {
        background.write(run_state_file(step.id), run_state_bytes(key, passes_done, wall, state));
        spdlog::debug("step '{}': commit point of host work, a state of {} written in the background ({:.3f} s on the "
                      "run's thread)", step.id, format_bytes(static_cast<double>(state.size())),
                      std::chrono::duration<double>(Clock::now() - t).count());
      }
      pace.committed(t);
    };
    engine::StepWork step_work(dir_.work(step.id), key, comm_);  // (host work's progress file)
    std::unique_ptr<ProgressReporter> host_reporter;
    std::string host_unit;  // (what host_reporter counts, and to how many)
    std::uint64_t host_total = 0;
    bool ran = false;  // (a pass, in this run)
    while (!run.done()) {
      std::optional<stages::StepPass> pass;
      const UnitOutcome o = agreed([&] { pass = run.next(); });
      if (!o.input_error.empty() || !o.check_failure.empty()) {
        if (host_reporter) host_reporter->finish();
        fail_on(o, step);
      }
      if (!o.stop.empty()) {  // (a run's own safe point inside its host work: it keeps no progress)
        if (host_reporter) host_reporter->finish();
        stopped(step.id, "", 0, 0, json::object(), o.stop);
      }
      if (!pass) {  // a unit of host work
        const stages::HostProgress p = run.progress();
        if (p.total == 0) continue;
        if (comm_.root()) {
          if (host_reporter && (p.unit != host_unit || p.total != host_total)) {  // (the run's next phase)
            host_reporter->finish();
            host_reporter.reset();
          }
          if (!host_reporter) {
            host_unit = p.unit, host_total = p.total;
            fs::create_directories(dir_.work(step.id));
            host_reporter = std::make_unique<ProgressReporter>(
                fmt::format("{} {}", step.id, step.stage), p.total, 0, p.unit, 0, options_.progress_seconds,
                [&step_work](const std::string& j) { step_work.save_progress(json::parse(j)); });
          }
          host_reporter->update(p.done);
        }
        // Rank 0's clock and the run's own interval decide a commit, any rank's stop request too;
        // never after the last unit (the output pass follows).
        const auto flags = comm_.max({std::int64_t{signals::stop_requested() != 0},
                                      std::int64_t{comm_.root() && (pace.due() || p.commit)}});
        if (p.done >= p.total || (!flags[0] && !flags[1])) continue;
        if (!flags[0]) {
          commit_in_background();
          continue;
        }
        commit_point();
        if (host_reporter) host_reporter->finish();
        stopped(step.id, "", p.done, p.total, json::object(), p.unit);
      }
      run_pass(step, *pass, in, context, earlier, key, passes_done);
      run.finished(*pass);
      passes_done += 1;
      ran = true;
      // Saved at once (a resumed run after a kill reads it; the passes it no longer needs go
      // before a commit point would write them). Rank 0's clock decides a commit point, any
      // rank's stop request too (both at once).
      save();
      const auto flags = comm_.max({std::int64_t{signals::stop_requested() != 0}, std::int64_t{comm_.root() && pace.due()}});
      if (flags[0] || flags[1]) commit_point();
      // A pass of one batch never stops inside the engine: the boundary between passes is the
      // stage's safe point (its state is committed), agreed by every rank.
      if (flags[0]) stopped(step.id, "", passes_done, 0, json::object(), "passes");
    }
    if (host_reporter) host_reporter->finish();
    if (ran) commit_point();
    if (comm_.root()) background.wait();  // (the output pass follows: its state is on disk first)
  }

  // Deletes the folders of the step's passes [from, upto) that are still there, once no rank
  // holds their files open; returns where the passes still kept begin. (Deleted files' pages
  // are dropped, not written: a commit point after it syncs only what resume reads.) Collective.
  int drop_passes(const spec::Step& step, EarlierPassOutputs& earlier, int from, int upto) {
    if (upto <= from) return from;
    for (auto it = earlier.datasets.begin(); it != earlier.datasets.end();)
      it = stages::parse_earlier_pass_input(it->first)->pass < upto ? earlier.datasets.erase(it) : std::next(it);
    for (auto it = earlier.exchanged.begin(); it != earlier.exchanged.end();)
      it = stages::parse_earlier_pass_input(it->first)->pass < upto ? earlier.exchanged.erase(it) : std::next(it);
    earlier.files.erase(earlier.files.begin(), earlier.files.lower_bound(upto));
    comm_.barrier();
    if (comm_.root())
      for (int k = from; k < upto; ++k) {
        std::error_code ec;
        fs::remove_all(dir_.work(step.id) / engine::StepWork::pass_folder(k), ec);
        if (ec) spdlog::warn("step '{}': could not delete the files of its pass {} ({}), which it no longer needs", step.id,
                             k + 1, ec.message());
      }
    comm_.barrier();  // (gone before any rank walks the work directory again)
    return upto;
  }

  // Streams pass number `passes_done` of the step (before its output pass) in its own folder.
  void run_pass(const spec::Step& step, stages::StepPass& pass, const OpenInputs& in, const stages::StepContext& context,
                EarlierPassOutputs& earlier, const std::string& key, int passes_done) {
    bind_inputs(pass.pass, pass.streamed_inputs, in, context, earlier);
    const std::string label = fmt::format("pass {} ({})", passes_done + 1, pass.name);
    engine::StepWork work(dir_.work(step.id) / engine::StepWork::pass_folder(passes_done), key, comm_);
    const auto started = Clock::now();
    const std::vector<std::uint64_t> bus_before{backend_->bytes_to_device(), backend_->bytes_to_host()};
    const Backend::PoolCounts pools_before = backend_->pool_counts();
    auto reporter = progress_reporter(fmt::format("{} {} {}", step.id, step.stage, label), pass.pass, 0, work);
    engine::PassOutcome outcome;
    try {
      outcome = engine_->run(pass.pass, *pass.kernel, pass.reduction.get(), work,
                             stages::prior_pass_output(context, passes_done), progress_of(reporter));
      step_clock_.earlier_seconds += outcome.earlier_wall_seconds;
      if (outcome.complete) outcome.staged.commit();
    } catch (const InputError& e) {
      if (reporter) reporter->finish();
      record_failure(step.id);
      throw InputError(fmt::format("step '{}' ({}), {}: {}", step.id, step.stage, label, e.what()));
    } catch (...) {
      if (reporter) reporter->finish();
      record_failure(step.id);
      throw;
    }
    if (reporter) reporter->finish();
    if (!outcome.complete) stopped(step.id, label, outcome.journal.committed_rows, pass.pass.rows, json::object());
    pass.outputs = std::move(outcome.outputs);
    const auto bus = comm_.sum_wrapping({backend_->bytes_to_device() - bus_before[0], backend_->bytes_to_host() - bus_before[1]});
    if (comm_.root()) {
      const engine::PhaseTimes& t = outcome.times;
      const Backend::PoolCounts pools = backend_->pool_counts();
      spdlog::debug("step '{}' {}: setup {:.3f}s (resident data {:.3f}s; device memory {} taken, {} reused; host {} taken, {} "
                    "reused), batch loop {:.3f}s (busy: read {:.3f}s, to device {:.3f}s, compute {:.3f}s, from device {:.3f}s, "
                    "write {:.3f}s; commits {:.3f}s), finalize {:.3f}s, pass {:.3f}s (rank 0)",
                    step.id, label, t.setup, t.prepare, pools.device_taken - pools_before.device_taken,
                    pools.device_reused - pools_before.device_reused, pools.host_taken - pools_before.host_taken,
                    pools.host_reused - pools_before.host_reused, t.loop, t.read, t.h2d, t.compute, t.d2h, t.write, t.commit,
                    t.finalize, std::chrono::duration<double>(Clock::now() - started).count());
      spdlog::info("step '{}' {} done in {}: {} rows, {} to the device and {} back (all ranks)", step.id, label,
                   format_duration(std::chrono::duration<double>(Clock::now() - started).count()), pass.pass.rows,
                   format_bytes(static_cast<double>(bus[0])), format_bytes(static_cast<double>(bus[1])));
    }
  }

  // The step's progress line on rank 0 (others: none), for a pass of `pass.rows` rows.
  std::unique_ptr<ProgressReporter> progress_reporter(const std::string& label, const engine::PassSpec& pass,
                                                      double flops, engine::StepWork& work) {
    if (!comm_.root()) return nullptr;
    return std::make_unique<ProgressReporter>(label, pass.rows, pass.progress_bytes_per_row(), pass.progress_unit, flops,
                                              options_.progress_seconds,
                                              [&work](const std::string& j) { work.save_progress(json::parse(j)); });
  }

  static engine::ProgressFn progress_of(const std::unique_ptr<ProgressReporter>& reporter) {
    return [&reporter](std::uint64_t done, std::uint64_t) {
      if (reporter) reporter->update(done);
    };
  }

  // A stop request ended a pass of the step, its progress committed: records where, and ends
  // the run (StopRequested).
  // (unit: host work's, plural, or a stage's own words for where it stopped: "after gate 7 of 9 ...")
  [[noreturn]] void stopped(const std::string& id, const std::string& pass, std::uint64_t committed, std::uint64_t rows,
                            const json& metrics, const std::string& unit = "row") {
    if (comm_.root()) {
      Manifest m = *Manifest::load(dir_.root);
      json& rec = m.step(id);
      rec["state"] = "stopped";
      rec["committed_rows"] = committed;
      rec["rows_total"] = rows;
      if (!pass.empty()) rec["pass"] = pass;
      else rec.erase("pass");
      if (!metrics.empty()) rec["metrics"] = metrics;
      m.save(dir_.root);
    }
    const std::string where = unit == "row"                ? fmt::format("at row {} of {}", committed, rows)
                              : unit.rfind("after ", 0) == 0 || unit.rfind("during ", 0) == 0 ? unit
                              : rows == 0                    ? fmt::format("after {} {}", committed, unit)  // (a loop of passes)
                                                             : fmt::format("after {} of {} {}", committed, rows, unit);
    const bool nothing_kept = unit.rfind("during ", 0) == 0;  // (a stage that keeps no progress: it starts again)
    throw StopRequested(fmt::format("stopped by {} in step '{}'{} {} ({}); run `qstage resume {}` to continue",
                                    signals::signal_name(signals::stop_requested()), id,
                                    pass.empty() ? "" : ", " + pass, where,
                                    nothing_kept ? "the step starts again" : "committed", dir_.root.string()));
  }

  // The run's output pass, into the step's plan (its spec becomes plan.pass), and the checks
  // that need it; an InputError names the step.
  stages::StepPass output_pass(PlannedStep& p, stages::StepRun& run) {
    const spec::Step& step = *p.step;
    stages::StepPass pass;
    fail_on(agreed([&] {
              pass = run.output(p.plan);
              p.plan.pass = pass.pass;
              p.plan.streamed_inputs = pass.streamed_inputs;
              check_output_sizes(p.plan);
              apply_compress_output(p.plan, step, true);
              pass.pass = p.plan.pass;
            }),
            step);
    return pass;
  }

  void execute(PlannedStep& p, const std::string& key, const json& hashes, const fs::path& output) {
    const spec::Step& step = *p.step;
    const auto started = Clock::now();
    // The memory and streams earlier steps' passes left idle go back to the driver: a step's
    // passes share the pools, steps do not.
    backend_->release_idle();
    backend_->device_budget().reset_peak();
    backend_->host_budget().reset_peak();
    const std::vector<std::uint64_t> bus_before{backend_->bytes_to_device(), backend_->bytes_to_host()};

    const OpenInputs in = open_inputs(p);
    CommittedRun committed = load_committed_run(step.id, key);
    int passes_done = committed.passes_done;  // (0 again if start_run discards the state)
    step_clock_ = {committed.wall_seconds, started};
    const stages::StepContext context{step.params, in.by_slot, p.plan,     step.files,         backend_.get(),
                                      &comm_,      dir_.work(step.id), key, &passes_done};
    std::unique_ptr<stages::StepRun> run = start_run(step, context, committed);
    passes_done = committed.passes_done;
    EarlierPassOutputs earlier;
    run_units(step, *run, context, in, earlier, key, passes_done);
    stages::StepPass final_pass = output_pass(p, *run);
    engine::PassSpec& pass = final_pass.pass;
    bind_inputs(pass, final_pass.streamed_inputs, in, context, earlier);
    engine::StepWork work(dir_.work(step.id), key, comm_);
    const std::string created = comm_.broadcast(utc_now());
    json result_checksums = json::object();
    auto reporter = progress_reporter(fmt::format("{} {}", step.id, step.stage), pass, p.plan.flops, work);

    engine::PassOutcome outcome;
    double step_wall_seconds = 0;  // (the whole step's, taken as the output is annotated)
    // Collective: provenance, checksums and the stage's small results into the staged output.
    auto annotate = [&](h5::File& out) {
      const engine::Journal& j = outcome.journal;
      const auto peaks = comm_.max({static_cast<std::int64_t>(backend_->device_budget().peak()),
                                    static_cast<std::int64_t>(backend_->host_budget().peak())});
      out.set_attribute("qstage.stage", step.stage);
      out.set_attribute("qstage.stage_version", static_cast<std::int64_t>(step.impl->info().version));
      out.set_attribute("qstage.step", step.id);
      out.set_attribute("qstage.workflow", wf_.name);
      out.set_attribute("qstage.params", step.params.dump());
      out.set_attribute("qstage.inputs", hashes.dump());
      out.set_attribute(stages::kStepKeyAttribute, key);
      out.set_attribute("qstage.version", QSTAGE_VERSION);
      out.set_attribute("qstage.backend", std::string(backend_name(backend_->kind())));
      out.set_attribute("qstage.device", device_text_);
      out.set_attribute("qstage.ranks", static_cast<std::int64_t>(comm_.size()));
      step_wall_seconds = step_clock_.seconds(&comm_);
      out.set_attribute("qstage.wall_seconds", step_wall_seconds);
      out.set_attribute("qstage.attempts", static_cast<std::int64_t>(j.attempts));
      out.set_attribute("qstage.peak_device_bytes", static_cast<std::int64_t>(peaks[0]));
      out.set_attribute("qstage.peak_host_bytes", static_cast<std::int64_t>(peaks[1]));
      out.set_attribute("qstage.created", created);
      out.set_attribute("qstage.summary", p.plan.summary.dump());
      for (size_t o = 0; o < pass.outputs.size(); ++o)  // (coded ones have their stored_xxh64)
        if (!pass.outputs[o].compressed())
          out.open_dataset(pass.outputs[o].name).set_attribute("qsum64", hex64(j.checksums[o]));
      final_pass.outputs = outcome.outputs;
      run->write(p.plan, final_pass, out);
      result_checksums = checksum_results(out);
      // (kept in the file too: a run that adopts the output after a kill records the same content)
      if (result_checksums.contains("content"))
        out.set_attribute("qstage.content", result_checksums["content"].get<std::string>());
    };

    for (const auto& o : pass.outputs)  // (its buckets would stay in the work folder, not in the step's file)
      if (o.buckets > 0)
        throw std::logic_error(fmt::format("step '{}': the output pass exchanges '{}' by bucket; only an earlier pass may",
                                           step.id, o.name));
    // Before the engine: the step's inputs opened, its run started and its output pass planned
    // (a stage that reads its inputs whole does so here).
    const double prepare_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    try {
      outcome = engine_->run(pass, *final_pass.kernel, final_pass.reduction.get(), work, output, progress_of(reporter));
      step_clock_.earlier_seconds += outcome.earlier_wall_seconds;
      if (outcome.complete) {  // (part of the output's finalization, and timed as such)
        const auto t = Clock::now();
        h5::File out = outcome.staged.open();
        annotate(out);
        out.flush();
        out.close();
        outcome.staged.commit();
        outcome.times.finalize += std::chrono::duration<double>(Clock::now() - t).count();
      }
    } catch (const StopRequested& e) {  // a stage's own safe point inside the pass (its state committed)
      if (reporter) reporter->finish();
      stopped(step.id, "", 0, pass.rows, json::object(), e.what());
    } catch (...) {
      if (reporter) reporter->finish();
      record_failure(step.id);
      throw;
    }
    if (reporter) reporter->finish();
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    const auto peaks = comm_.max({static_cast<std::int64_t>(backend_->device_budget().peak()),
                                  static_cast<std::int64_t>(backend_->host_budget().peak())});
    const auto times = comm_.max(
        {static_cast<std::int64_t>(outcome.times.read * 1e6), static_cast<std::int64_t>(outcome.times.h2d * 1e6),
         static_cast<std::int64_t>(outcome.times.compute * 1e6), static_cast<std::int64_t>(outcome.times.d2h * 1e6),
         static_cast<std::int64_t>(outcome.times.write * 1e6), static_cast<std::int64_t>(outcome.times.commit * 1e6),
         static_cast<std::int64_t>(outcome.times.finalize * 1e6), static_cast<std::int64_t>(outcome.times.setup * 1e6),
         static_cast<std::int64_t>(outcome.times.loop * 1e6), static_cast<std::int64_t>(prepare_seconds * 1e6)});
    const double bytes = static_cast<double>(outcome.rows_run * pass.progress_bytes_per_row());
    // What crossed between host and device in this run of the step, every pass, all ranks.
    const auto bus = comm_.sum_wrapping({backend_->bytes_to_device() - bus_before[0], backend_->bytes_to_host() - bus_before[1]});
    json metrics = {{"seconds", seconds},
                    {"rows", outcome.rows_run},
                    {"resumed_from_row", outcome.resumed_from},
                    {"batch_rows", outcome.plan.batch_rows},
                    {"bytes", bytes},
                    {"bytes_per_second", seconds > 0 ? bytes / seconds : 0},
                    {"read_seconds", times[0] * 1e-6},
                    {"h2d_seconds", times[1] * 1e-6},
                    {"compute_seconds", times[2] * 1e-6},
                    {"d2h_seconds", times[3] * 1e-6},
                    {"write_seconds", times[4] * 1e-6},
                    {"commit_seconds", times[5] * 1e-6},
                    {"finalize_seconds", times[6] * 1e-6},
                    {"setup_seconds", times[7] * 1e-6},
                    {"prepare_seconds", times[9] * 1e-6},
                    {"loop_seconds", times[8] * 1e-6},
                    {"peak_device_bytes", peaks[0]},
                    {"peak_host_bytes", peaks[1]},
                    {"planned_device_bytes", outcome.plan.device_bytes},
                    {"planned_host_bytes", outcome.plan.host_bytes},
                    {"bytes_to_device", bus[0]},
                    {"bytes_to_host", bus[1]}};
    if (p.plan.flops > 0 && pass.rows > 0)
      metrics["gflops_per_second"] = p.plan.flops * static_cast<double>(outcome.rows_run) / static_cast<double>(pass.rows) / seconds / 1e9;

    if (!outcome.complete) stopped(step.id, "", outcome.journal.committed_rows, pass.rows, metrics);
    if (comm_.root()) {
      json sums = result_checksums.value("datasets", json::object());
      for (size_t o = 0; o < pass.outputs.size(); ++o)
        sums[pass.outputs[o].name] = pass.outputs[o].compressed() ? outcome.outputs[o].checksum
                                                                  : hex64(outcome.journal.checksums[o]);
      Manifest m = *Manifest::load(dir_.root);
      json& rec = m.step(step.id);
      rec.update({{"state", "done"}, {"output", fs::relative(output, dir_.root).string()}, {"checksums", sums},
                  {"output_bytes", fs::file_size(output)},
                  {"wall_seconds", step_wall_seconds}, {"attempts", outcome.journal.attempts},
                  {"finished", utc_now()}, {"device", device_text_}, {"ranks", comm_.size()}, {"metrics", metrics},
                  {"rows_total", pass.rows}, {"results", run->describe(p.plan, final_pass)}});
      rec.erase("error");
      rec.erase("pass");
      for (const char* field : {"content", "measured"}) {
        if (result_checksums.contains(field)) rec[field] = result_checksums[field];
        else rec.erase(field);
      }
      m.save(dir_.root);
      work.remove();
      log_summary(step, metrics, *run, final_pass, p);
    }
    comm_.barrier();
  }

  void log_summary(const spec::Step& step, const json& mt, const stages::StepRun& run, const stages::StepPass& final_pass,
                   const PlannedStep& p) {
    const double s = mt["seconds"].get<double>();
    if (mt["bytes"].get<double>() == 0 && p.plan.pass.rows == 0) {
      // A step that computes on its own (a path search, a state vector): no engine figures to give.
      spdlog::info("step '{}' done in {}; peak device {}, host {}", step.id, format_duration(s),
                   format_bytes(mt["peak_device_bytes"].get<double>()), format_bytes(mt["peak_host_bytes"].get<double>()));
      const std::string line = run.describe(p.plan, final_pass);
      if (!line.empty()) spdlog::info("step '{}' result: {}", step.id, line);
      return;
    }
    // What streamed, in the step's own unit where bytes say little (slices, amplitudes).
    const std::string& unit = p.plan.pass.progress_unit;
    const auto rows = mt["rows"].get<std::uint64_t>();
    std::string amount = format_bytes(mt["bytes"].get<double>());
    std::string rate = format_rate(mt["bytes_per_second"].get<double>());
    if (!unit.empty()) {
      amount = fmt::format("{} {}", rows, unit);
      rate = fmt::format("{:.3g} {}/s", s > 0 ? static_cast<double>(rows) / s : 0.0, unit);
    }
    if (mt.contains("gflops_per_second")) rate += fmt::format(", {:.1f} GFLOP/s", mt["gflops_per_second"].get<double>());
    spdlog::info(
        "step '{}' done in {}: {} at {}; prepare {:.2f}s, setup {:.2f}s, batch loop {:.2f}s (busy: read {:.2f}s, "
        "to device {:.2f}s, compute {:.2f}s, from device {:.2f}s, write {:.2f}s; commits {:.2f}s), finalize {:.2f}s; "
        "peak device {} (planned {}), host {}",
        step.id, format_duration(s), amount, rate, mt["prepare_seconds"].get<double>(),
        mt["setup_seconds"].get<double>(), mt["loop_seconds"].get<double>(), mt["read_seconds"].get<double>(),
        mt["h2d_seconds"].get<double>(), mt["compute_seconds"].get<double>(), mt["d2h_seconds"].get<double>(),
        mt["write_seconds"].get<double>(), mt["commit_seconds"].get<double>(), mt["finalize_seconds"].get<double>(),
        format_bytes(mt["peak_device_bytes"].get<double>()), format_bytes(mt["planned_device_bytes"].get<double>()),
        format_bytes(mt["peak_host_bytes"].get<double>()));
    const std::string line = run.describe(p.plan, final_pass);
    if (!line.empty()) spdlog::info("step '{}' result: {}", step.id, line);
  }

  // qsum64 of every dataset the stage wrote itself (streamed ones already have theirs), and a
  // content hash over every dataset in the output, streamed ones included (a later step that reads
  // the streamed rows must see them change even where the stage's own datasets, such as the
  // bitstrings a contraction copies along, stay the same), but its measurements
  // (stages::is_measured: listed apart, so that two runs of the step give the same content). No
  // content where the stage wrote nothing itself: the streamed datasets' checksums then decide.
  // Every rank computes the same (attributes are collective).
  static json checksum_results(h5::File& out) {
    json sums = json::object(), measured = json::array();
    std::string all;
    for (const auto& path : out.dataset_paths()) {
      h5::Dataset d = out.open_dataset(path);
      std::string sum;
      if (d.has_attribute("qsum64")) {
        sum = d.string_attribute("qsum64");
      } else if (d.has_attribute("stored_xxh64")) {  // (compressed: their stored bytes')
        sum = d.string_attribute("stored_xxh64");
      } else {
        if (!d.dtype()) continue;
        sum = hex64(h5::qsum64_of(d));
        d.set_attribute("qsum64", sum);
        sums[path.substr(1)] = sum;
      }
      if (stages::is_measured(d)) measured.push_back(path.substr(1));
      else all += path + ":" + sum + ";";
    }
    json result = json::object();
    if (!sums.empty()) result["datasets"] = sums;
    if (!sums.empty() && !all.empty()) result["content"] = hash_bytes(all);
    if (!measured.empty()) result["measured"] = measured;
    return result;
  }

  void remove_leftovers(const std::string& id, const fs::path& output) {
    std::error_code ec;
    fs::remove_all(dir_.work(id), ec);
    fs::remove(fsutil::temp_path(output), ec);
  }

 public:
  // A step's bad input, found while it ran (its parameters and inputs had passed every check
  // before it started): the run directory gets back the spec and the step's record it had, so
  // that `resume` replays the accepted spec; what other steps committed stays recorded (rank 0).
  void restore_accepted_spec(const RunDirBefore& before) {
    if (!comm_.root() || before.manifest.is_null()) return;
    try {
      Manifest m = *Manifest::load(dir_.root);
      for (const char* field : {"spec_source", "spec_dir", "qstage_version"}) {
        if (before.manifest.contains(field)) m.data()[field] = before.manifest[field];
        else m.data().erase(field);
      }
      if (!failed_step_.empty()) {
        const json steps = before.manifest.value("steps", json::object());
        if (steps.contains(failed_step_)) m.step(failed_step_) = steps[failed_step_];
        else m.data()["steps"].erase(failed_step_);
      }
      if (before.spec_text) fsutil::write_file_atomic(dir_.spec(), *before.spec_text);
      m.save(dir_.root);
      spdlog::info("run directory {} keeps the spec it was last run with ({}); `qstage resume` replays that one",
                   dir_.root.string(), before.manifest.value("spec_source", "?"));
    } catch (const std::exception& e) {
      spdlog::warn("could not restore the run directory's earlier spec: {}", e.what());
    }
  }

 private:
  void record_failure(const std::string& id) {
    failed_step_ = id;
    if (!comm_.root()) return;
    try {
      Manifest m = *Manifest::load(dir_.root);
      if (signals::stop_requested()) return;
      m.step(id)["state"] = "failed";
      m.save(dir_.root);
    } catch (...) {
    }
  }

  const spec::Workflow& wf_;
  const RunOptions& options_;
  const mpi::Comm& comm_;
  RunDir dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<engine::StreamEngine> engine_;
  std::string device_text_;
  double backend_seconds_ = 0;
  // Binds this rank to the cores and memory nearest its GPU (before the OpenMP and I/O threads
  // start), and logs where: every rank in its own log, rank 0's on the console.
  void bind_near_device(bool bind) {
    const std::string starved =
        affinity::starved_binding_warning(affinity::allowed_cpus().size(), comm_.local_size(), affinity::cgroup_cpu_count());
    if (!starved.empty()) spdlog::warn("rank {}: {}", comm_.rank(), starved);
    const std::string bus = backend_->pci_bus_id();
    if (bus.empty()) return;
    if (!bind) {
      spdlog::info("rank {}: not bound (--bind none); GPU at PCI {}", comm_.rank(), bus);
      return;
    }
    // (one rank on the host keeps every core for its OpenMP work: the host's SVDs of mps.tebd
    // would lose half a two-socket machine; several ranks each take their GPU's node)
    const std::string line = affinity::bind_near(affinity::device_placement("/sys", bus), comm_.local_size() > 1);
    // (OpenMP sized its default team from the cores allowed at start; follow the binding)
    if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(static_cast<int>(std::max<std::size_t>(1, affinity::allowed_cpus().size())));
    spdlog::info("rank {}: {}", comm_.rank(), line);
  }
  std::optional<double> checkpoint_seconds_;
  std::string failed_step_;  // the step whose failure ended the run, if one did
  // The wall time of the step being executed: what earlier runs committed of it (its passes',
  // its host work's commits, its passes' earlier attempts, from their journals) and this run's time
  // since it took the step up. Committed with every pass state; the step's wall time at its end.
  struct StepClock {
    double earlier_seconds = 0;
    Clock::time_point started = Clock::now();
    // This rank's reading where comm is null, else the ranks' longest (collective).
    double seconds(const mpi::Comm* comm) const {
      const double mine = std::chrono::duration<double>(Clock::now() - started).count();
      return earlier_seconds + (comm ? comm->max(mine) : mine);
    }
  } step_clock_;
};

}  // namespace

void run_workflow(const spec::Workflow& wf, const RunOptions& options, const mpi::Comm& comm) {
  h5z::register_filter();  // every stage reads datasets compressed with qstage's codec
  // Everything that can be checked without writing is checked first.
  std::vector<PlannedStep> planned = plan_workflow(wf);
  RunDir dir{options.run_dir.empty() ? default_run_dir(wf.name) : options.run_dir};
  dir.root = fs::absolute(dir.root);
  check_outputs_fit(planned, dir.root);
  WorkflowRun run(wf, options, comm, dir);
  run.setup(planned);
  std::optional<RunDirLock> lock;  // (rank 0's, until the run ends)
  RunDirBefore before;
  prepare_run_dir(wf, dir, comm, lock, before);
  log::add_run_file(dir.root, comm.rank());
  try {
    run.run(planned);
  } catch (const InputError&) {
    run.restore_accepted_spec(before);
    throw;
  }
  if (comm.root()) spdlog::info("workflow '{}' done; outputs in {}", wf.name, (dir.root / "outputs").string());
}

spec::Workflow workflow_of_run_dir(const fs::path& run_dir) {
  auto manifest = Manifest::load(run_dir);
  if (!manifest)
    throw InputError(fmt::format("'{}' has no manifest.json; expected a run directory made by `qstage run`",
                                 run_dir.string()));
  const fs::path spec_path = run_dir / "spec.yaml";
  if (!fs::exists(spec_path))
    throw InputError(fmt::format("run directory '{}' has no spec.yaml; expected the copy `qstage run` leaves there",
                                 run_dir.string()));
  const std::string source = manifest->data().value("spec_source", spec_path.string());
  return spec::load_workflow(fsutil::read_file(spec_path), source,
                             manifest->data().value("spec_dir", fs::absolute(run_dir).string()));
}

}  // namespace qstage::runner
