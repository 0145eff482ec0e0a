// qstage_bench pass-overhead: what a pass costs beyond its kernel, the way a stage of several
// passes (sci.solve, keys.dedup) pays it once per pass.
//
// Each of --passes passes streams --rows float64 rows of a small HDF5 input through a kernel that
// copies them on the device, with --resident bytes of resident data uploaded in prepare() (as an
// SCI pass uploads its Hamiltonian and space) and --slots buffer slots, into its own work
// directory and output file; then the output is committed (rename) and a pass-state file is
// written atomically, as the runner does after a prior pass. Reported per pass (medians over the
// passes after the first, which pays the process's cold start): the whole pass and its parts, with
// each pass's end made durable at once (`every_pass`: the runner at --checkpoint-interval 0) and
// with durability deferred to the next commit point (`at_commits`: the runner's default).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/mpi.hpp"
#include "core/units.hpp"
#include "engine/stream_engine.hpp"
#include "io/h5.hpp"
#include "pass_overhead_bench.hpp"

namespace qstage::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class CopyKernel final : public engine::PassKernel {
 public:
  explicit CopyKernel(std::size_t resident_bytes) : resident_bytes_(resident_bytes) {}
  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    std::vector<char> host(resident_bytes_, 1);
    resident_ = backend.alloc_device(resident_bytes_, "bench resident data");
    backend.copy_to_device(resident_.data(), host.data(), resident_bytes_, stream);
    stream.synchronize();
  }
  void process(const engine::BatchView& b) override {
    backend_->copy_on_device(b.outputs[0], b.inputs[0], b.rows.size() * 8, *b.stream);
  }

 private:
  std::size_t resident_bytes_;
  Backend* backend_ = nullptr;
  Buffer resident_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

json pass_overhead_bench(const std::map<std::string, std::string>& a, const mpi::Comm& comm) {
  auto arg = [&](const char* k, const std::string& d) { return a.count(k) ? a.at(k) : d; };
  const std::string device = arg("device", "auto");
  const int passes = std::stoi(arg("passes", "50"));
  const std::uint64_t rows = std::stoull(arg("rows", "4096"));
  const std::uint64_t resident = parse_size(arg("resident", "16MiB"), "--resident");
  const int slots = std::stoi(arg("slots", "3"));
  const fs::path dir = arg("dir", "/tmp/qstage-pass-overhead");
  if (passes < 2) throw InputError("--passes: expected at least 2 (the first is reported apart)");
  if (rows == 0) throw InputError("--rows: expected at least 1");

  auto be = make_backend({device, 0, 0, 0});
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::vector<double> x(rows);
    for (std::uint64_t i = 0; i < rows; ++i) x[i] = static_cast<double>(i);
    h5::File f = h5::File::create(dir / "input.h5");
    f.create_dataset("x", {h5::DType::float64, {rows}, {std::min<std::uint64_t>(rows, 1 << 16)}, false}).write_all(x.data());
    f.close();
  }
  h5::File input_file = h5::File::open(dir / "input.h5", h5::Mode::read_only);
  h5::Dataset input = input_file.open_dataset("x");

  engine::EngineOptions options;
  options.slots = slots;
  engine::StreamEngine engine(*be, comm, options);
  auto run_passes = [&](bool deferred) {
    std::optional<fsutil::DeferredDurability> deferral;
    if (deferred) deferral.emplace();
    std::vector<double> total, setup, loop, finalize, commit, state;
    json first;
    for (int i = 0; i < passes; ++i) {
      engine::PassSpec spec;
      spec.rows = rows;
      spec.tile_rows = std::min<std::uint64_t>(rows, 1 << 16);
      spec.inputs.push_back({"x", &input, 8});
      spec.outputs.push_back({"y", Layout{DType::float64, {rows}, {spec.tile_rows}}});
      spec.resident_device_bytes = resident;
      CopyKernel kernel(resident);
      const auto started = Clock::now();
      const std::string series = deferred ? "at-commits" : "every-pass";
      const fs::path work_dir = dir / fmt::format("{}-{}", series, i), output = dir / fmt::format("{}-{}.h5", series, i);
      engine::StepWork work(work_dir, "bench", comm);
      engine::PassOutcome outcome = engine.run(spec, kernel, nullptr, work, output, nullptr);
      const auto committing = Clock::now();
      outcome.staged.commit();
      const double commit_s = since(committing);
      const auto saving = Clock::now();
      if (comm.root()) fsutil::write_file_atomic(dir / "passes.json", json{{"done", i + 1}}.dump());
      comm.barrier();
      const double state_s = since(saving);
      const double all = since(started);
      if (i == 0) {
        first = {{"seconds", all}, {"setup", outcome.times.setup}, {"loop", outcome.times.loop},
                 {"finalize", outcome.times.finalize}};
        continue;
      }
      total.push_back(all);
      setup.push_back(outcome.times.setup);
      loop.push_back(outcome.times.loop);
      finalize.push_back(outcome.times.finalize);
      commit.push_back(commit_s);
      state.push_back(state_s);
    }
    return json{{"first_pass", first},
                {"median_pass_seconds", median(total)},
                {"median_parts_seconds",
                 {{"setup (prepare, slot buffers)", median(setup)},
                  {"loop", median(loop)},
                  {"finalize (output file)", median(finalize)},
                  {"commit (rename)", median(commit)},
                  {"pass state", median(state)}}}};
  };
  const json every_pass = run_passes(false), at_commits = run_passes(true);
  fs::remove_all(dir);
  return {{"device", be->description()},
          {"passes", passes},
          {"rows", rows},
          {"resident_bytes", resident},
          {"slots", slots},
          {"durable_every_pass", every_pass},
          {"durable_at_commits", at_commits}};
}

}  // namespace qstage::bench
