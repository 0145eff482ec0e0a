#pragma once
// What a stage declares, and what the framework does for it.
//
// A stage is a pure description plus per-batch work. It declares its name, version, input slots
// and a JSON Schema for its parameters (schemas/stages/<name>.json). Given parameters that passed
// the schema (defaults filled in) and the shapes of its inputs, plan() checks them against each
// other and describes one streaming pass: the rows, the tile size, the outputs, the memory it
// keeps resident. The framework then does everything else: opening inputs, batching, buffers,
// transfers, checkpoints, resume, MPI distribution, output files and provenance. The stage's
// kernel only computes one batch (docs/writing-a-stage.md).
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
};

// What a stage of several passes keeps between them: how many of its passes before the output
// pass are done, and what they found (small: a value range, a count, an energy). The runner
// commits it atomically after each pass (steps/<id>/passes.json, with the step key), so a run
// stopped in pass k resumes in pass k, and the state is the one the finished passes left.
struct PassState {
  int done = 0;
  nlohmann::json data = nlohmann::json::object();
  int done_before = 0;  // of `done`, the passes earlier runs of the step finished (not committed)
  // Wall seconds of the step's finished passes before the output pass, and of compute()'s work up
  // to its last commit, summed over every run that did them: with the output pass's journal they
  // make the step's wall time when the step ran in several passes or several runs.
  double wall_seconds = 0;
};

// One pass of a stage before its output pass: what it streams, its kernel and its reduction.
// It is batched, checkpointed and resumed like the output pass, in its own folder of the step's
// work directory; its outputs, if any, go to a file there (prior_pass_output) for later passes
// to read until the step is done.
struct PriorPass {
  std::string name;                          // for the log and its folder, e.g. "range"
  engine::PassSpec pass;                     // inputs' dataset pointers are bound by the runner
  std::vector<std::string> streamed_inputs;  // slot name of each pass input, in order
  std::unique_ptr<engine::PassKernel> kernel;
  std::unique_ptr<engine::Reduction> reduction;
  // Filled by the runner once the pass is complete, before after_prior_pass: what it wrote into
  // each output (rows, each batch's appended rows, each bucket's rows), which a later pass needs
  // to find its batches in them (a merge reads one bucket per batch).
  std::vector<engine::OutputReport> outputs = {};
};

// Handed to a long compute() (on rank 0, through KernelContext::checkpoints): how it reports
// progress and commits what it has done, so that a stopped or killed run resumes from there. It
// is the pass state's mechanism: the stage writes the stage-* files it needs atomically into the
// work directory, then commits a state naming them; a resumed run of the same step key finds
// that state in ctx.passes->data (a changed step has another key and starts afresh).
class ComputeCheckpoints {
 public:
  virtual ~ComputeCheckpoints() = default;
  // `done` of `total` units (`unit`: "time steps") are done: updates the progress line. True
  // when a commit is due: the run's checkpoint interval has passed since the last one, or a stop
  // was requested.
  virtual bool due(std::uint64_t done, std::uint64_t total, const std::string& unit) = 0;
  // Commits `data` as the step's state, `done` units done. If a stop was requested, throws
  // StopRequested once it is committed (the run then exits 75, resumable).
  virtual void commit(const nlohmann::json& data, std::uint64_t done) = 0;
};

// What every rank of a compute() that computes_on_every_rank does after a unit of work: nothing,
// commit and go on, or commit and stop.
enum class Commit : std::uint64_t { none = 0, go_on = 1, and_stop = 2 };
struct KernelContext;
// Rank 0 asks its checkpoints whether a commit is due after `done` of `total` units (or `forced`,
// a stage's own interval; never after the last unit) and whether a stop was requested; every rank
// gets its decision (collective where ctx.comm has several ranks).
Commit agreed_commit(const KernelContext& ctx, std::uint64_t done, std::uint64_t total, const std::string& unit, bool forced);
// Carries out such a decision on every rank: rank 0 runs `commit` (its files, then
// ctx.checkpoints->commit), and every rank throws StopRequested after it where the decision says
// stop. (A stop requested after the decision was sent stops the next unit, with every rank; a
// single rank stops at once.)
void carry_out(const KernelContext& ctx, Commit decision, const std::function<void()>& commit);

// Handed to make_kernel and compute: the step's parameters and its opened input datasets.
struct KernelContext {
  const nlohmann::json& params;
  const std::map<std::string, const h5::Dataset*>& inputs;
  const StagePlan& plan;
  const std::map<std::string, std::filesystem::path>& files;  // file parameters, resolved (see file_parameters)
  Backend* backend = nullptr;                                 // the run's backend (compute() may measure it)
  const mpi::Comm* comm = nullptr;                            // every rank's (refine_plan may read in parallel)
  // The step's work directory and key. refine_plan may keep what it measured there, in a file
  // named plan-*.json that records the key: a resumed run of the same step finds it (the work
  // directory keeps such files; a changed step has another key and measures again). A stage of
  // several passes keeps what its later passes need there in files named stage-* (written
  // atomically before the pass state that refers to them is committed); they are kept too.
  std::filesystem::path work_dir;
  std::string step_key;
  // The state the step's earlier passes left (stages of several passes; else empty), or the one
  // a long compute() committed through `checkpoints`.
  const PassState* passes = nullptr;
  // compute() on rank 0 (else nullptr, also on the other ranks of a stage that
  // computes_on_every_rank): commits its progress (ComputeCheckpoints).
  ComputeCheckpoints* checkpoints = nullptr;
};

// What a step produced besides its streamed outputs, handed to write_results on every rank.
struct StepResults {
  engine::Reduction* reduction = nullptr;  // the folded partials (make_reduction), if any
  const std::string* computed = nullptr;   // compute()'s result, if the stage computes
  const KernelContext* context = nullptr;  // parameters and opened inputs (to copy small data along)
  // What the pass wrote into each output (rows, appended counts, stored bytes of coded chunks).
  const std::vector<engine::OutputReport>* outputs = nullptr;
};

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
  // Passes whose size depends on the content of inputs made by earlier steps (the number of
  // bitstrings, of slices) complete their plan here, at run time, once the inputs exist. Throws
  // InputError like plan().
  virtual void refine_plan(StagePlan& plan, const KernelContext& ctx) const {}
  // Stages of several passes: the pass to run before the output pass, given what the passes
  // before it left in `state` (ctx.passes is the same state); nullopt when the output pass
  // comes next. Called again after each one (a loop of passes asks until it has converged).
  // Runs before refine_plan, which then sees the state in ctx.passes.
  virtual std::optional<PriorPass> prior_pass(const KernelContext& ctx, const PassState& state) const {
    return std::nullopt;
  }
  // After `pass` completed (its reduction folded and loaded on every rank): what it found, into
  // `state.data`. Must give the same on every rank. The runner then counts it done and commits.
  virtual void after_prior_pass(const KernelContext& ctx, PriorPass& pass, PassState& state) const {}
  virtual std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const = 0;
  virtual std::unique_ptr<engine::Reduction> make_reduction(const StagePlan& plan) const { return nullptr; }
  // Stages whose work is a host computation on small data (building a network, finding a path)
  // rather than a stream of batches: compute() runs on rank 0 with the opened inputs (open your
  // own read-only handles for other datasets), and its result reaches write_results on every rank.
  // (Decided per step: tn.contract computes a plan distributed over the ranks, else it streams.)
  virtual bool computes(const StagePlan& plan) const { return false; }
  virtual std::string compute(const KernelContext& ctx) const { return {}; }
  // A computing stage whose compute() shares its work across the ranks: it then runs on every
  // rank at once (ctx.comm set on each), and rank 0's result string is the one broadcast to
  // write_results (the others may return anything, e.g. ""). The rules, because every rank must
  // reach the same collective calls in the same order:
  // - MPI calls only on the calling (main) thread (MPI_THREAD_FUNNELED), never inside OpenMP.
  // - ctx.checkpoints is set on rank 0 only (nullptr elsewhere): rank 0 alone calls due() and
  //   commit() and writes the stage-* files, and it broadcasts each due() decision (and whether a
  //   stop was requested) so that every rank commits and stops after the same unit of work; a rank
  //   told to stop throws StopRequested itself (rank 0's commit() throws it).
  // - InputError, CheckFailed and StopRequested are agreed by the runner after compute() returns
  //   or throws on every rank (any rank's error fails the step on all, reported with the message
  //   of the lowest rank that had one); an error that only some ranks meet in the middle of the
  //   work must be agreed by the stage at its next collective (mps.tebd's exchange does), else
  //   the others wait there. Any other exception aborts the job (cli/run.cpp).
  virtual bool computes_on_every_rank(const StagePlan& plan) const { return false; }
  // After the pass, on every rank with the same results: small results into the output.
  virtual void write_results(const StagePlan& plan, const StepResults& results, h5::File& out) const {}
  // One line for the log, e.g. "norm 1.0e3, 0 non-finite".
  virtual std::string describe_results(const StagePlan& plan, const StepResults& results) const { return ""; }
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

// Base of stages whose work is compute() alone (building a network, finding a path): no pass.
class ComputedStage : public Stage {
 public:
  bool computes(const StagePlan&) const final { return true; }
  std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const final;

 protected:
  // A plan with no rows whose later-step-visible datasets are `results`, the first primary.
  static StagePlan computed_plan(std::vector<std::pair<std::string, DatasetInfo>> results);
};

// The kernel of a pass without rows (a stage whose work is compute()).
std::unique_ptr<engine::PassKernel> no_pass_kernel();

// The file the outputs of the step's prior pass number `index` (0, 1, ...) went to.
std::filesystem::path prior_pass_output(const KernelContext& ctx, int index);

// A streamed input (PriorPass::streamed_inputs, StagePlan::streamed_inputs) that is not a step
// input but dataset `dataset` of the output of the step's prior pass number `pass`, done before
// the pass that streams it: a stage of several passes chains them (generate, then sort what was
// generated). The runner opens that file read-only on every rank for the rest of the step.
std::string earlier_pass_input(int pass, const std::string& dataset);
struct EarlierPassInput {
  int pass = 0;
  std::string dataset;
};
std::optional<EarlierPassInput> parse_earlier_pass_input(const std::string& source);

// Every stage qstage knows, in name order.
const std::vector<const Stage*>& all_stages();
const Stage* find_stage(std::string_view name);
// The parameter schema of a stage (embedded schemas/stages/<name>.json).
const nlohmann::json& parameter_schema(const Stage& stage);

// Default chunk rows for a row of `row_bytes`: about 4 MiB per chunk, at least one row.
std::uint64_t default_chunk_rows(std::uint64_t row_bytes);

}  // namespace qstage::stages
