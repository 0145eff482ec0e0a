#pragma once
// What a stage declares, and what the framework does for it.
//
// A stage is a description plus a run. It declares its name, version, input slots and a JSON
// Schema for its parameters (schemas/stages/<name>.json). Given parameters that passed the schema
// (defaults filled in) and the shapes of its inputs, plan() checks them against each other and
// describes the output pass: the rows, the tile size, the outputs, the memory it keeps resident.
// When the step runs, start() gives a StepRun, which the runner drives unit by unit (passes
// before the output pass, host work), then through the output pass. The framework does
// everything else: opening inputs, batching, buffers, transfers, checkpoints, resume, MPI
// distribution, output files and provenance. A pass's kernel only computes one batch
// (docs/writing-a-stage.md).
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/layout.hpp"
#include "core/mpi.hpp"
#include "engine/pass.hpp"
#include "io/h5.hpp"

namespace qstage::stages {

// Layout and filters of a dataset, known before any data is read (for planning a whole workflow).
struct DatasetInfo {
  Layout layout;
  std::vector<unsigned> filters = {};  // HDF5 filter ids, in pipeline order (32881: qstage's codec)
};

struct InputSlot {
  std::string name;
  std::string description;
  bool optional = false;  // a step may leave it out (plan() then finds no entry for it)
};

struct StageInfo {
  std::string name;     // e.g. "tensor.matmul"
  int version = 1;      // bump when the output for the same parameters and inputs changes
  std::string summary;  // one line
  std::vector<InputSlot> inputs;
  std::string example;  // a YAML step, shown by `qstage stages NAME`
};

struct StagePlan {
  engine::PassSpec pass;                     // inputs' dataset pointers are bound by the runner
  std::vector<std::string> streamed_inputs;  // slot name of each pass input, in order
  std::string primary_output;                // the dataset a later step gets when it names this step
  // Datasets write_results makes (shape may be unknown, empty), so later steps can name them.
  std::vector<std::pair<std::string, DatasetInfo>> results;
  double flops = 0;                          // arithmetic of the whole pass (0 if not meaningful)
  nlohmann::json summary = nlohmann::json::object();  // shown in the log and stored as provenance
  // The step's work is a computation on the host (ComputedRun): its output pass has no rows.
  bool computed = false;
};

// One pass of a step, as its run (StepRun) asks for it: what it streams, its kernel and its
// reduction. It is batched, checkpointed and resumed by the engine; a pass before the output pass
// runs in its own folder of the step's work directory, and its outputs, if any, go to a file
// there (prior_pass_output) for later passes to read until the step is done.
struct StepPass {
  std::string name;                          // for the log and its folder, e.g. "range"
  engine::PassSpec pass;                     // inputs' dataset pointers are bound by the runner
  std::vector<std::string> streamed_inputs;  // slot name of each pass input, in order
  std::unique_ptr<engine::PassKernel> kernel;
  std::unique_ptr<engine::Reduction> reduction;  // (folded and loaded on every rank once the pass is complete)
  // Filled by the runner once the pass is complete: what it wrote into each output (rows, each
  // batch's appended rows, each bucket's rows, stored bytes of coded chunks), which a later pass
  // needs to find its batches in them (a merge reads one bucket per batch).
  std::vector<engine::OutputReport> outputs = {};
};

// Where a run's host work stands after a unit of it (time step 7 of 40): the progress line's and
// the commit point's. A run with total 0 has no point to resume from inside its host work.
struct HostProgress {
  std::uint64_t done = 0, total = 0;
  std::string unit;     // "time steps"
  bool commit = false;  // the stage's own interval asks for a commit now (checkpoint_every)
};

// Handed to Stage::start: the step's parameters and its opened inputs, for as long as it runs.
struct StepContext {
  const nlohmann::json& params;
  const std::map<std::string, const h5::Dataset*>& inputs;
  const StagePlan& plan;
  const std::map<std::string, std::filesystem::path>& files;  // file parameters, resolved (see file_parameters)
  Backend* backend = nullptr;                                 // the run's backend
  const mpi::Comm* comm = nullptr;                            // every rank's
  // The step's work directory and key. A run may keep what it measured there, in a file named
  // plan-*.json that records the key, or what its later passes need in files named stage-*
  // (written atomically before the state that names them is committed); the work directory keeps
  // such files until the step is done, and a changed step has another key.
  std::filesystem::path work_dir;
  std::string step_key;
  // The step's passes before the output pass that are complete, this run's and earlier runs'
  // (the runner counts them): the number the next pass gets (prior_pass_output).
  const int* passes_done = nullptr;
};

// A step's work, driven by the runner (libcudf's chunked reader is the model: the caller drives,
// the state lives in the object). The runner, on every rank:
//
//   run = stage.start(ctx); run.load(committed state, if any)
//   while (!run.done()) { pass = run.next(); if (pass) { stream it; run.finished(pass) } ; commit? }
//   plan's output pass = run.output(plan); stream it; run.write(plan, pass, out); run.describe(...)
//
// and commits run.save() (binary) after every pass before the output pass, and after a unit of
// host work at the run's checkpoint interval, at a stop, or when progress().commit asks: a
// resumed run of the same step key load()s it and goes on with the same bits.
//
// The rules, because every rank must reach the same collective calls in the same order:
// - Every rank calls every method; each must leave the same state on every rank, except what
//   only rank 0 keeps (measurements, a computation done on rank 0 alone), which output() brings
//   to the others (copy_from_root), so that write() sees the same state everywhere.
// - save() is called on every rank at once (it may gather what the ranks hold) and rank 0's bytes
//   are committed; load() gets rank 0's committed bytes on every rank.
// - MPI calls only on the calling (main) thread (MPI_THREAD_FUNNELED), never inside OpenMP.
// - InputError, CheckFailed and StopRequested thrown by next() are agreed by the runner over the
//   ranks (any rank's error fails the step on all, with the lowest such rank's message); an error
//   that only some ranks meet in the middle of a collective exchange must be agreed by the run at
//   its next collective (mps.tebd's exchange does), else the others wait there. Any other
//   exception aborts the job (cli/run.cpp).
class StepRun {
 public:
  virtual ~StepRun() = default;
  // True when only the output pass is left.
  virtual bool done() const = 0;
  // One unit of the work before the output pass: a pass for the runner to stream (it calls
  // finished() with it once complete), or nullopt after a unit of host work done here (a time
  // step, a round of slices, a whole computation). Throws InputError naming what is wrong.
  virtual std::optional<StepPass> next() { throw std::logic_error("StepRun::next: the run had no work left"); }
  // After a pass next() gave completed (its reduction folded and loaded, its outputs reported):
  // what it found, into the run's state.
  virtual void finished(StepPass& pass) {}
  // Where the host work stands, after a unit of it (the progress line and the commit points).
  virtual HostProgress progress() const { return {}; }
  // The lowest number of an earlier pass (StepContext::passes_done) whose output the run will
  // still read, this unit or a later one, the output pass included; *passes_done when it needs
  // none. The runner deletes the folders of the passes before it as soon as the state that says
  // so is saved, so that a commit point does not make the disk write what resume would never
  // read (keys.dedup's partition leaves gigabytes of buckets that only its merge reads).
  virtual int first_live_pass() const { return 0; }
  // The output pass, once done(): `plan` is the step's, which the run completes where earlier
  // units decided its size (rows, outputs, summary, flops); the runner streams the returned pass
  // (its spec becomes plan.pass) and writes it to the step's output file.
  virtual StepPass output(StagePlan& plan) = 0;
  // After the output pass, on every rank with the same state: small results into the output
  // (`pass` is the output pass, its reduction and outputs filled).
  virtual void write(const StagePlan& plan, const StepPass& pass, h5::File& out) const {}
  // One line for the log, e.g. "norm 1.0e3, 0 non-finite".
  virtual std::string describe(const StagePlan& plan, const StepPass& pass) const { return ""; }
  // The state between units, binary (as reductions' are); empty for a run that keeps none.
  virtual std::string save() const { return {}; }
  virtual void load(std::string_view state) {}
};

// Rank 0's state of `run` into the other ranks' (save() there, load() here); collective.
void copy_from_root(StepRun& run, const mpi::Comm* comm);

// The output pass of `plan` as it was planned, with `kernel` and `reduction`.
StepPass planned_pass(const StagePlan& plan, std::unique_ptr<engine::PassKernel> kernel,
                      std::unique_ptr<engine::Reduction> reduction = nullptr);

class Stage {
 public:
  virtual ~Stage() = default;
  virtual const StageInfo& info() const = 0;
  // JSON pointers of parameters that name files ("/circuit"): the runner resolves them against
  // the spec's folder, refuses missing ones before anything runs, and puts their content hashes
  // into the step key, so an edited file reruns the step.
  virtual std::vector<std::string> file_parameters() const { return {}; }
  // Checks the parameters against the inputs and describes the pass. Throws InputError naming
  // the parameter or input that is wrong and what was expected.
  virtual StagePlan plan(const nlohmann::json& params, const std::map<std::string, DatasetInfo>& inputs) const = 0;
  // The step's run, once its inputs are open (on every rank). Throws InputError like plan().
  virtual std::unique_ptr<StepRun> start(const StepContext& ctx) const = 0;
};

// A measurement: a dataset write_results fills with what was measured while the step ran
// (seconds, rates, or values computed from them), so two runs of the same step write other
// values. write_results marks it (the attribute `qstage.measured` = 1): its qsum64 is recorded
// and verified like any dataset's, but it stays out of the step's content identity, the hash
// later steps' keys are made of, so that they keep their keys from run to run (docs/design.md,
// "Measurements"). A choice a measurement decided (a slicing, a placement) is content, not a
// measurement.
inline constexpr const char* kMeasuredAttribute = "qstage.measured";
void mark_measured(h5::Dataset& dataset);
bool is_measured(const h5::Dataset& dataset);

// A run whose work is its output pass alone (a stage of one streaming pass): it completes the
// plan and makes the pass's kernel in output().
class OutputPassRun : public StepRun {
 public:
  explicit OutputPassRun(const StepContext& ctx) : ctx_(ctx) {}
  bool done() const final { return true; }

 protected:
  const StepContext& ctx_;
};

// A run whose work is one computation on the host (building a network, finding a path), on
// rank 0 alone, before an output pass without rows: its result reaches the other ranks through
// save()/load() (the runner copies rank 0's run before the output pass).
class ComputedRun : public StepRun {
 public:
  explicit ComputedRun(const StepContext& ctx) : ctx_(ctx) {}
  bool done() const final { return computed_; }
  std::optional<StepPass> next() final;
  StepPass output(StagePlan& plan) override;

 protected:
  virtual void compute() = 0;  // rank 0's
  const StepContext& ctx_;

 private:
  bool computed_ = false;
};

// A ComputedRun whose result is a JSON document (a path and its cost, a plan and its
// prediction), written as such: it is the run's state too.
class JsonComputedRun : public ComputedRun {
 public:
  using ComputedRun::ComputedRun;
  std::string save() const override { return result_.dump(); }
  void load(std::string_view state) override { result_ = nlohmann::json::parse(state); }

 protected:
  nlohmann::json result_;
};

// Base of stages whose work is a ComputedRun: no pass.
class ComputedStage : public Stage {
 protected:
  // A plan with no rows whose later-step-visible datasets are `results`, the first primary.
  static StagePlan computed_plan(std::vector<std::pair<std::string, DatasetInfo>> results);
};

// The kernel of a pass without rows (a step whose work is host computation).
std::unique_ptr<engine::PassKernel> no_pass_kernel();

// The file the outputs of the step's prior pass number `index` (0, 1, ...) went to.
std::filesystem::path prior_pass_output(const StepContext& ctx, int index);

// A streamed input (StepPass::streamed_inputs, StagePlan::streamed_inputs) that is not a step
// input but dataset `dataset` of the output of the step's prior pass number `pass`, done before
// the pass that streams it: a stage of several passes chains them (generate, then sort what was
// generated). The runner opens that file read-only on every rank for the rest of the step.
std::string earlier_pass_input(int pass, const std::string& dataset);
struct EarlierPassInput {
  int pass = 0;
  std::string dataset;
};
std::optional<EarlierPassInput> parse_earlier_pass_input(const std::string& source);

// The parameter schema of a stage (embedded schemas/stages/<name>.json).
const nlohmann::json& parameter_schema(const Stage& stage);

// Default chunk rows for a row of `row_bytes`: about 4 MiB per chunk, at least one row.
std::uint64_t default_chunk_rows(std::uint64_t row_bytes);

}  // namespace qstage::stages
