#pragma once
// Plans a whole workflow before anything runs: every step's inputs are resolved to a dataset
// whose dtype and shape are known (from the producing step's plan, or from the file), and every
// stage checks its parameters against them. Bad input is reported before a byte is written.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runner/workflow.hpp"
#include "stages/common/stage.hpp"

namespace qstage::runner {

struct ResolvedInput {
  spec::InputRef ref;
  std::string dataset;  // the dataset path (a step's primary output when the spec named none)
  stages::DatasetInfo info;
};

struct PlannedStep {
  const spec::Step* step = nullptr;
  std::map<std::string, ResolvedInput> inputs;
  stages::StagePlan plan;
};

// Throws InputError "<file:line:col>: steps[i] (id, stage): <what is wrong>".
std::vector<PlannedStep> plan_workflow(const spec::Workflow& wf);

// Marks the streamed outputs a step's compress_output names (all by default) as compressed.
// Outputs that a stage declares only at run time (its run's output()) are checked then: `at_run_time`
// false leaves a plan without outputs alone unless it certainly has none. Throws InputError for
// a name that is not a streamed output, or an output that is not float32 or complex64.
void apply_compress_output(stages::StagePlan& plan, const spec::Step& step, bool at_run_time);

// Throws InputError if an output of `plan` would hold more than 2^63 bytes: a typo'd shape is
// rejected before anything runs (it used to end in std::bad_alloc or an HDF5 chunk error).
void check_output_sizes(const stages::StagePlan& plan);

// Throws InputError if an uncompressed output of a planned step is larger than the whole file
// system that holds run_dir (or its nearest existing parent): it could never be written. (The
// capacity, not the free space: a resumed step has written part of its output already.)
void check_outputs_fit(const std::vector<PlannedStep>& planned, const std::filesystem::path& run_dir);

// Reads dtype, shape and chunk of a dataset in a file; InputError naming file and dataset.
stages::DatasetInfo describe_file_dataset(const std::filesystem::path& file, const std::string& dataset);

}  // namespace qstage::runner
