#pragma once
// Runs a workflow in its run directory: plans every step first, then for each step decides
// from its key (stage, version, parameters, input content hashes) whether the committed output
// can be reused, and otherwise streams it through the engine, committing progress as it goes.
#include <filesystem>
#include <optional>
#include <string>

#include "backend/backend.hpp"
#include "core/mpi.hpp"
#include "runner/workflow.hpp"

namespace qstage::runner {

struct RunOptions {
  std::filesystem::path run_dir;                   // empty: ./qstage-runs/<workflow name>
  BackendOptions backend;                          // device and budgets (0: from the spec, else default)
  std::optional<std::string> checkpoint_interval;  // overrides the spec's options
  std::optional<std::string> device_memory, host_memory;
  std::optional<std::uint64_t> max_batch_rows;
  double progress_seconds = 10;
  int slots = 3;
};

std::filesystem::path default_run_dir(const std::string& workflow);

// Collective. Returns when every step is done. Throws StopRequested (after committing) when a
// signal asked to stop, InputError for bad input (before anything was written), RuntimeFailure
// or h5::Error when the environment fails.
void run_workflow(const spec::Workflow& wf, const RunOptions& options, const mpi::Comm& comm);

// Loads the spec a run directory was last run with (for `qstage resume`).
spec::Workflow workflow_of_run_dir(const std::filesystem::path& run_dir);

}  // namespace qstage::runner
