// What every stage shares: passes planned and computed, copying rank 0's state, parameter
// schemas, and the names of an earlier pass's outputs (stages/common/stage.hpp).
#include "stages/common/stage.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "engine/journal.hpp"

namespace qstage::stages {

namespace {
class NoPass final : public engine::PassKernel {
  void process(const engine::BatchView&) override {}
};
}  // namespace

void mark_measured(h5::Dataset& dataset) { dataset.set_attribute(kMeasuredAttribute, std::int64_t{1}); }

bool is_measured(const h5::Dataset& dataset) {
  return dataset.has_attribute(kMeasuredAttribute) && dataset.int_attribute(kMeasuredAttribute) == 1;
}

std::unique_ptr<engine::PassKernel> no_pass_kernel() { return std::make_unique<NoPass>(); }

StepPass planned_pass(const StagePlan& plan, std::unique_ptr<engine::PassKernel> kernel,
                      std::unique_ptr<engine::Reduction> reduction) {
  return {"", plan.pass, plan.streamed_inputs, std::move(kernel), std::move(reduction)};
}

std::optional<StepPass> ComputedRun::next() {
  if (!ctx_.comm || ctx_.comm->root()) compute();
  computed_ = true;
  return std::nullopt;
}

StepPass ComputedRun::output(StagePlan& plan) {
  copy_from_root(*this, ctx_.comm);
  return planned_pass(plan, no_pass_kernel());
}

void copy_from_root(StepRun& run, const mpi::Comm* comm) {
  if (!comm || comm->size() == 1) return;
  const std::string state = comm->broadcast(comm->root() ? run.save() : std::string());
  if (!comm->root()) run.load(state);
}

StagePlan ComputedStage::computed_plan(std::vector<std::pair<std::string, DatasetInfo>> results) {
  StagePlan plan;
  plan.pass.rows = 0;
  plan.computed = true;
  plan.primary_output = results.at(0).first;
  plan.results = std::move(results);
  return plan;
}


const nlohmann::json& parameter_schema(const Stage& stage) {
  static std::mutex mutex;
  static std::map<std::string, nlohmann::json> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[stage.info().name];
  if (slot.is_null()) slot = nlohmann::json::parse(embedded::file("schemas/stages/" + stage.info().name + ".json"));
  return slot;
}

std::uint64_t default_chunk_rows(std::uint64_t row_bytes) {
  constexpr std::uint64_t target = 4u << 20;
  return std::max<std::uint64_t>(1, target / std::max<std::uint64_t>(row_bytes, 1));
}

std::filesystem::path prior_pass_output(const StepContext& ctx, int index) {
  return ctx.work_dir / engine::StepWork::pass_folder(index) / "output.h5";
}

namespace {
// Step inputs' slot names are identifiers; this prefix cannot begin one.
constexpr std::string_view kEarlierPass = "pass:";
}  // namespace

std::string earlier_pass_input(int pass, const std::string& dataset) {
  return std::string(kEarlierPass) + std::to_string(pass) + ":" + dataset;
}

std::optional<EarlierPassInput> parse_earlier_pass_input(const std::string& source) {
  if (!source.starts_with(kEarlierPass)) return std::nullopt;
  const std::size_t colon = source.find(':', kEarlierPass.size());
  if (colon == std::string::npos) throw std::logic_error("malformed earlier-pass input '" + source + "'");
  return EarlierPassInput{std::stoi(source.substr(kEarlierPass.size(), colon - kEarlierPass.size())), source.substr(colon + 1)};
}

}  // namespace qstage::stages
