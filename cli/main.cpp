#include <H5public.h>
#include <mpi.h>

#include <cstdio>
#include <fmt/format.h>
#include <iostream>

#include "backend/backend.hpp"
#include "cli/cli.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"

namespace qstage::cli {

namespace {

constexpr const char* kUsage = R"(qstage - staged, checkpointed, out-of-core workflows on GPUs and CPUs

usage: qstage <command> [options]

commands:
  run [SPEC]        run a workflow spec (no SPEC: the embedded quickstart)
  resume DIR        continue a stopped or killed run in its run directory
  status DIR        each step's state, progress and throughput
  inspect FILE.h5   datasets, shapes, chunks and provenance of an HDF5 file (--plot: a PNG of a plan, SCI run or TEBD)
  validate SPEC     check a spec against the schemas and the inputs' shapes
  stages [NAME]     the stages, their inputs, parameters and defaults

  qstage <command> --help    options and examples of one command
  qstage --version           version, backends and libraries

examples:
  qstage run                                  # the quickstart, into ./qstage-runs/quickstart
  qstage run workflows/quickstart.yaml --run-dir runs/qs --device cpu
  mpirun -np 4 qstage run big.yaml --run-dir /scratch/$USER/big --device-memory 60GiB
  qstage resume runs/qs                       # after a preemption (exit code 75) or a kill
  qstage status runs/qs

exit codes:
  0   done
  1   internal error (a bug, or the file system, device or MPI failed)
  2   bad input: spec, file, dataset, parameter or budget; nothing committed was changed
  3   a check step (tensor.compare) found results outside its tolerance; earlier steps are kept
  75  stopped early on SIGTERM/SIGINT with progress committed; `qstage resume DIR` continues
)";

}  // namespace

std::string version_text() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string mpi_text(mpi, static_cast<size_t>(len));
  mpi_text = mpi_text.substr(0, mpi_text.find_first_of(",\n"));
  const std::string torch = *QSTAGE_TORCH_VERSION ? fmt::format("LibTorch {} (sci.nnqs)", QSTAGE_TORCH_VERSION)
                                                   : std::string("built without LibTorch (sci.nnqs needs a network plugin "
                                                                 "built against one: QSTAGE_NNQS_PLUGIN)");
  return fmt::format("qstage {}\nbackends: cpu{}\nHDF5 {}.{}.{} (parallel), {}\n{}\n", QSTAGE_VERSION,
#ifdef QSTAGE_HAVE_CUDA
                     ", cuda (built in)",
#else
                     " (built without CUDA)",
#endif
                     maj, min, rel, mpi_text, torch);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitBadInput;
  }
  const std::string command = argv[1];
  const Args args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return kExitDone;
  }
  if (command == "--version" || command == "version") {
    std::fputs(version_text().c_str(), stdout);
    return kExitDone;
  }
  try {
    if (command == "run") return run(args, &argc, &argv);
    if (command == "resume") return resume(args, &argc, &argv);
    if (command == "status") return status(args);
    if (command == "inspect") return inspect(args);
    if (command == "validate") return validate(args);
    if (command == "stages") return stages(args);
  } catch (const InputError& e) {
    std::fprintf(stderr, "qstage: error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qstage: internal error: %s\n", e.what());
    return kExitInternal;
  }
  std::fprintf(stderr, "qstage: error: unknown command '%s'; expected run, resume, status, inspect, validate or stages "
                       "(see qstage --help)\n",
               command.c_str());
  return kExitBadInput;
}

}  // namespace qstage::cli
