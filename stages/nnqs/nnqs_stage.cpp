// sci.nnqs: the stage's description and plan. Its network is LibTorch's, in a plugin that an
// optional part of the build makes (network.hpp): without it the stage is listed and refused at
// plan time.
#include <fmt/format.h>

#include "core/error.hpp"
#include "stages/nnqs/nnqs_params.hpp"
#include "stages/nnqs/network.hpp"
#include "stages/nnqs/nnqs_run.hpp"
#include "stages/nnqs/nnqs_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;

class NnqsStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "sci.nnqs", 4,  // 4: the fit and E reach the coupled determinants (first-order targets, E over S and C)
        "a neural-network quantum state (autoregressive Transformer amplitude, MLP phase) trained by AdamW on a "
        "selected space that grows by the network's largest amplitudes among its coupled determinants",
        {},
        "- id: nnqs\n  stage: sci.nnqs\n  params: {fcidump: h2o_sto3g_FCIDUMP, max_iterations: 8, steps: 200, "
        "max_new_dets: 100}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return {"/fcidump", "/model_file"}; }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>&) const override {
    const nnqs::NnqsParams p = nnqs::NnqsParams::from_json(params);
    if (!nnqs::plugin_present())
      throw InputError(fmt::format("stage 'sci.nnqs' needs its LibTorch plugin, and {} does not exist; expected a "
                                   "build that found LibTorch (install Debian's libtorch-dev, then scripts/setup.sh)",
                                   nnqs::plugin_path()));
    const nnqs::NetworkShape& net = p.network;
    if (!net.model_file.empty() && params.contains("model"))
      throw InputError("parameters 'model' and 'model_file' are both given; expected one: the built-in network's sizes, "
                       "or a TorchScript module of its own");
    if (net.embedding % net.heads != 0)
      throw InputError(fmt::format("parameter 'model' has embedding {} and heads {}; expected an embedding that the "
                                   "heads divide (each head attends over embedding / heads values)", net.embedding, net.heads));
    StagePlan plan;
    plan.pass.rows = 0;  // (the run's work is host work; its results are written whole)
    plan.computed = true;
    plan.primary_output = "energy";
    plan.results = {{"energy", DatasetInfo{Layout{DType::float64, {}, {}}}},
                    {"dets", DatasetInfo{Layout{DType::uint64, {}, {}}}},  // (shapes known once it ran)
                    {"amplitudes", DatasetInfo{Layout{DType::complex128, {}, {}}}}};
    plan.summary = {{"max_iterations", p.max_iterations}, {"steps", p.steps}, {"max_new_dets", p.max_new_dets},
                    {"learning_rate", net.learning_rate}};
    if (net.model_file.empty())
      plan.summary["model"] = {{"embedding", net.embedding}, {"layers", net.layers}, {"heads", net.heads},
                               {"phase_hidden", net.phase_hidden}};
    else
      plan.summary["model_file"] = net.model_file;
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override {
    nnqs::NnqsParams p = nnqs::NnqsParams::from_json(ctx.params);
    if (const auto file = ctx.files.find("/model_file"); file != ctx.files.end()) p.network.model_file = file->second.string();
    return nnqs::start_run(ctx, p);
  }
};

}  // namespace

const Stage& sci_nnqs() {
  static const NnqsStage stage;
  return stage;
}

}  // namespace qstage::stages
