// qstage run / qstage resume
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/options.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/mpi.hpp"
#include "core/signals.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "runner/runner.hpp"

namespace qstage::cli {

namespace {

constexpr const char* kRunUsage = R"(usage: qstage run [SPEC] [options]

Runs the workflow in SPEC (a YAML file; without SPEC, the embedded quickstart) in a run
directory. Steps whose key (stage, version, parameters, input content) matches a committed
output are skipped (a committed output is checked first: a damaged one is recomputed); a changed
parameter reruns that step and what depends on it. On SIGTERM or SIGINT all ranks stop at the
next safe point (a batch boundary, the end of a pass, a time step), commit, and exit with code
75; `qstage resume` continues from the last commit, also after a SIGKILL. One run at a time
holds a run directory: a second one exits 2 naming the process that holds it.
)";

constexpr const char* kRunExamples = R"(examples:
  qstage run                                          # embedded quickstart -> ./qstage-runs/quickstart
  qstage run workflows/quickstart.yaml --run-dir runs/qs --device cpu
  qstage run spec.yaml --device-memory 8GiB --host-memory 32GiB --checkpoint-interval 5m
  mpirun -np 3 qstage run spec.yaml --run-dir runs/big   # batches shared by 3 ranks
  srun --signal=TERM@120 qstage run spec.yaml --run-dir $SCRATCH/run   # SLURM, see README
)";

constexpr const char* kResumeUsage = R"(usage: qstage resume DIR [options]

Continues the run in DIR with the spec it was last run with (DIR/spec.yaml). Work committed
before a stop or a kill is kept: a step continues from its last checkpoint, not its start.
Half-written files are never trusted: only what the journal names is read, and only once its
rows match their checksums (what does not is recomputed, with a warning).
)";

constexpr const char* kResumeExamples = R"(examples:
  qstage resume runs/qs
  mpirun -np 8 qstage resume runs/big --device-memory 60GiB   # any rank count gives the same result
)";

po::options_description engine_options() {
  po::options_description o("options");
  o.add_options()
      ("device", po::value<std::string>()->default_value("auto"), "auto | cuda | cpu")
      ("device-memory", po::value<std::string>(), "device memory budget per rank, e.g. 8GiB (default: 90% of free GPU memory, split between ranks sharing a GPU; cpu: as --host-memory)")
      ("host-memory", po::value<std::string>(), "host (pinned) memory budget per rank, e.g. 16GiB (default: a quarter of RAM, or of the job's cgroup memory limit where one is set, e.g. SLURM's --mem; with more than 2 ranks on a host, half of it shared evenly)")
      ("checkpoint-interval", po::value<std::string>(), "commit progress inside a step this often (or 9x the last commit's time, if longer), durably: 30s, 5m, 0 (every batch, and every pass of a stage of several passes), never (default 2m)")
      ("progress-interval", po::value<std::string>()->default_value("10s"), "seconds between progress lines in a log file")
      ("log-level", po::value<std::string>()->default_value("info"), "trace | debug | info | warn | error | off")
      ("max-batch-rows", po::value<std::uint64_t>(), "cap on the rows of one batch (advanced)")
      ("slots", po::value<int>()->default_value(3), "buffer sets in the pipeline, at least 2 (advanced)")
      ("bind", po::value<std::string>()->default_value("gpu"),
       "gpu: prefer the memory of each rank's GPU's NUMA node and, with several ranks on a host, bind each to that node's cores (within what the launcher allows); none: leave as launched");
  return o;
}

runner::RunOptions run_options(const po::variables_map& vm) {
  runner::RunOptions o;
  o.backend.device = vm["device"].as<std::string>();
  if (vm.count("device-memory")) o.device_memory = vm["device-memory"].as<std::string>();
  if (vm.count("host-memory")) o.host_memory = vm["host-memory"].as<std::string>();
  if (vm.count("checkpoint-interval")) o.checkpoint_interval = vm["checkpoint-interval"].as<std::string>();
  if (vm.count("max-batch-rows")) o.max_batch_rows = vm["max-batch-rows"].as<std::uint64_t>();
  auto progress = parse_duration(vm["progress-interval"].as<std::string>(), "--progress-interval");
  o.progress_seconds = progress ? progress->count() : 1e18;
  o.slots = vm["slots"].as<int>();
  const std::string bind = vm["bind"].as<std::string>();
  if (bind != "gpu" && bind != "none") throw InputError(fmt::format("--bind {}: expected gpu or none", bind));
  o.backend.bind = bind == "gpu";
  if (o.slots < 2) throw InputError(fmt::format("--slots {}: expected at least 2 (double buffering)", o.slots));
  // Validate sizes now, so a typo is an error before MPI starts.
  if (o.device_memory) parse_budget(*o.device_memory, "--device-memory");
  if (o.host_memory) parse_budget(*o.host_memory, "--host-memory");
  if (o.checkpoint_interval) parse_duration(*o.checkpoint_interval, "--checkpoint-interval");
  return o;
}

// An error one rank met alone: under MPI it ends the job at once (the other ranks may be waiting
// in a collective call), in a single process it is printed and its exit code returned.
int fail_alone(const mpi::Comm& comm, const std::string& line, int code) {
  if (comm.size() > 1) mpi::abort_job(line, code);
  std::fprintf(stderr, "%s\n", line.c_str());
  return code;
}

// Runs under MPI with the error policy of a collective program: input errors and stops are
// reached by every rank together (rank 0 reports them); anything else aborts the job, since the
// other ranks may be waiting in a collective call.
int execute(const std::function<spec::Workflow()>& load, runner::RunOptions options, const std::string& log_level,
            int* argc, char*** argv) {
  const auto level = log::parse_level(log_level);
  mpi::Session session(argc, argv);
  mpi::Comm comm;
  log::setup_console(level, comm.rank());
  signals::install_stop_handlers();
  h5::quiet_errors();
  try {
    const spec::Workflow wf = load();
    runner::run_workflow(wf, options, comm);
    return kExitDone;
  } catch (const InputError& e) {
    if (comm.root()) std::fprintf(stderr, "qstage: error: %s\n", e.what());
    return kExitBadInput;
  } catch (const CheckFailed& e) {
    if (comm.root()) std::fprintf(stderr, "qstage: check failed: %s\n", e.what());
    return kExitCheckFailed;
  } catch (const StopRequested& e) {
    if (comm.root()) spdlog::warn("{}", e.what());
    return kExitStopped;
  } catch (const RankInputError& e) {  // (CorruptInput)
    return fail_alone(comm, fmt::format("qstage: error: {}", e.what()), kExitBadInput);
  } catch (const std::exception& e) {
    return fail_alone(comm, fmt::format("qstage: internal error on rank {}: {}", comm.rank(), e.what()), kExitInternal);
  }
}

}  // namespace

int run(const Args& args, int* argc, char*** argv) {
  po::options_description o = engine_options();
  o.add_options()("run-dir", po::value<std::string>(), "the run directory (default: ./qstage-runs/<workflow name>)")(
      "spec", po::value<std::string>(), "the workflow spec (positional)");
  po::positional_options_description pos;
  pos.add("spec", 1);
  auto vm = parse(args, o, pos, kRunUsage, kRunExamples);
  if (!vm) return kExitDone;
  runner::RunOptions options = run_options(*vm);
  if (vm->count("run-dir")) options.run_dir = (*vm)["run-dir"].as<std::string>();
  const std::string spec = vm->count("spec") ? (*vm)["spec"].as<std::string>() : "";
  return execute([&] { return spec.empty() ? spec::quickstart_workflow() : spec::load_workflow_file(spec); }, options,
                 (*vm)["log-level"].as<std::string>(), argc, argv);
}

int resume(const Args& args, int* argc, char*** argv) {
  po::options_description o = engine_options();
  o.add_options()("dir", po::value<std::string>(), "the run directory (positional)");
  po::positional_options_description pos;
  pos.add("dir", 1);
  auto vm = parse(args, o, pos, kResumeUsage, kResumeExamples);
  if (!vm) return kExitDone;
  if (!vm->count("dir")) throw InputError("resume: missing the run directory; expected `qstage resume DIR`");
  runner::RunOptions options = run_options(*vm);
  options.run_dir = (*vm)["dir"].as<std::string>();
  const auto dir = options.run_dir;
  return execute([&] { return runner::workflow_of_run_dir(dir); }, options, (*vm)["log-level"].as<std::string>(), argc,
                 argv);
}

}  // namespace qstage::cli
