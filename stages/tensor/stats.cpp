// tensor.stats: norm, min, max, largest modulus, count of non-finite values and the qsum64
// checksum of a dataset, in one streaming pass. Partials are per tile and folded in tile order,
// so the numbers do not depend on the batch size or the rank count.
#include <cmath>
#include <cstring>

#include "core/hash.hpp"
#include "kernels/tensor/stats.hpp"
#include "stages/common/results.hpp"
#include "stages/tensor/tensor_stages.hpp"

namespace qstage::stages {
namespace {

using kernels::StatsPartial;

class StatsKernel final : public engine::PassKernel {
 public:
  StatsKernel(h5::DType dtype, std::uint64_t row_elements, std::uint64_t row_bytes, std::uint64_t tile_rows)
      : dtype_(dtype), row_elements_(row_elements), row_bytes_(row_bytes), tile_rows_(tile_rows) {}
  void process(const engine::BatchView& b) override {
    kernels::stats(*b.stream, {dtype_, b.inputs[0], b.rows.size() * row_elements_, tile_rows_ * row_elements_,
                               b.rows.begin * row_bytes_ / 4, static_cast<StatsPartial*>(b.partials)});
  }

 private:
  h5::DType dtype_;
  std::uint64_t row_elements_, row_bytes_, tile_rows_;
};

using StatsReduction = engine::PartialFold<StatsPartial, kernels::fold>;

class StatsStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tensor.stats", 2,  // 2: the sums fold in a fixed tree (pairwise), not left to right
        "norm, min, max, largest modulus, non-finite count and qsum64 checksum of a dataset, in one pass",
        {{"x", "the dataset to summarise (float32, float64, complex64 or complex128)"}},
        "- id: check\n  stage: tensor.stats\n  inputs: {x: c}\n"};
    return info;
  }

  StagePlan plan(const nlohmann::json&, const std::map<std::string, DatasetInfo>& in) const override {
    const Layout& x = in.at("x").layout;
    if (!detail::is_float_type(x.dtype))
      throw InputError(fmt::format("input 'x' has dtype {}; expected float32, float64, complex64 or complex128",
                                   h5::dtype_name(x.dtype)));
    if (x.shape.empty()) throw InputError("input 'x' is a scalar; expected a dataset with at least one dimension");
    StagePlan plan;
    plan.pass.rows = x.shape[0];
    plan.pass.tile_rows = x.chunk.empty() ? default_chunk_rows(x.row_bytes()) : x.chunk[0];
    plan.pass.inputs.push_back({"x", nullptr, x.row_bytes()});
    plan.pass.tile_partial_bytes = sizeof(StatsPartial);
    plan.streamed_inputs = {"x"};
    plan.summary = {{"shape", x.shape}, {"dtype", h5::dtype_name(x.dtype)}};
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public OutputPassRun {
   public:
    using OutputPassRun::OutputPassRun;
    StepPass output(StagePlan& plan) override {
      const h5::Dataset& x = *ctx_.inputs.at("x");
      const auto dtype = *x.dtype();
      const std::uint64_t row_bytes = x.row_bytes();
      return planned_pass(plan, std::make_unique<StatsKernel>(dtype, row_bytes / h5::dtype_size(dtype), row_bytes, plan.pass.tile_rows),
                          std::make_unique<StatsReduction>());
    }
    void write(const StagePlan&, const StepPass& pass, h5::File& out) const override;
    std::string describe(const StagePlan&, const StepPass& pass) const override;
  };
};

void StatsStage::Run::write(const StagePlan&, const StepPass& pass, h5::File& out) const {
  const StatsPartial& s = static_cast<const StatsReduction&>(*pass.reduction).result();
  const double norm = std::sqrt(s.sum_sq);
  const double nan = std::nan("");
  const double mn = s.finite_components ? s.min : nan, mx = s.finite_components ? s.max : nan;
  detail::write_scalar(out, "norm", h5::DType::float64, &norm,
                       "2-norm over finite elements (sum of |x|^2 in float64, tiles summed pairwise in a fixed tree)");
  detail::write_scalar(out, "sum_sq", h5::DType::float64, &s.sum_sq, "sum of |x|^2 over finite elements");
  detail::write_scalar(out, "min", h5::DType::float64, &mn,
                       "smallest finite real component (both parts of complex values)");
  detail::write_scalar(out, "max", h5::DType::float64, &mx,
                       "largest finite real component (both parts of complex values)");
  detail::write_scalar(out, "max_abs", h5::DType::float64, &s.max_abs, "largest |x| over finite elements");
  detail::write_scalar(out, "nonfinite", h5::DType::uint64, &s.nonfinite, "elements with a NaN or infinite component");
  detail::write_scalar(out, "count", h5::DType::uint64, &s.count, "elements");
  out.set_attribute("input_checksum", hex64(s.qsum));
}

std::string StatsStage::Run::describe(const StagePlan&, const StepPass& pass) const {
  const StatsPartial& s = static_cast<const StatsReduction&>(*pass.reduction).result();
  return fmt::format("norm {:.9g}, min {:.6g}, max {:.6g}, max |x| {:.6g}, {} non-finite of {}, checksum {}",
                     std::sqrt(s.sum_sq), s.min, s.max, s.max_abs, s.nonfinite, s.count, hex64(s.qsum));
}

}  // namespace

const Stage& tensor_stats() {
  static const StatsStage stage;
  return stage;
}

}  // namespace qstage::stages
