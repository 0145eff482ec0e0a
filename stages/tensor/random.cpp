// tensor.random: a large chunked tensor of uniform random numbers from a seed. Component j's
// value depends only on (seed, j), so the tensor is identical for any rank count, batch size or
// backend (kernels/tensor/random.hpp).
#include <fmt/ranges.h>

#include "kernels/tensor/random.hpp"
#include "stages/common/results.hpp"
#include "stages/tensor/tensor_stages.hpp"

namespace qstage::stages {
namespace {

struct Params {
  h5::Shape shape;
  h5::DType dtype;
  std::uint64_t seed;
  std::uint64_t chunk_rows;  // 0: about 4 MiB per chunk
  static Params from_json(const nlohmann::json& p) {
    return {p.at("shape").get<h5::Shape>(), *h5::parse_dtype(p.at("dtype").get<std::string>()),
            p.at("seed").get<std::uint64_t>(), p.at("chunk_rows").get<std::uint64_t>()};
  }
};

class RandomKernel final : public engine::PassKernel {
 public:
  RandomKernel(h5::DType dtype, std::uint64_t seed, std::uint64_t row_components)
      : dtype_(dtype), seed_(seed), row_components_(row_components) {}
  void process(const engine::BatchView& b) override {
    kernels::random_fill(*b.stream, {dtype_, seed_, b.rows.begin * row_components_, b.rows.size() * row_components_,
                                     b.outputs[0]});
  }

 private:
  h5::DType dtype_;
  std::uint64_t seed_, row_components_;
};

class RandomStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tensor.random", 1,
        "a chunked tensor of uniform random numbers in [-1, 1) from a seed (the same for any rank count or backend)",
        {},
        "- id: psi\n  stage: tensor.random\n  params: {shape: [1048576, 64], dtype: complex64, seed: 7}\n"};
    return info;
  }

  StagePlan plan(const nlohmann::json& params, const std::map<std::string, DatasetInfo>&) const override {
    const Params p = Params::from_json(params);
    const h5::Shape& shape = p.shape;
    const h5::DType dtype = p.dtype;
    StagePlan plan;
    engine::OutputDecl out;
    out.name = "data";
    out.layout.dtype = dtype;
    out.layout.shape = shape;
    const std::uint64_t row_bytes = out.row_bytes();
    out.layout.chunk =
        detail::row_chunk(shape, p.chunk_rows ? p.chunk_rows : default_chunk_rows(row_bytes), dtype, "params.chunk_rows");
    plan.pass.rows = shape[0];
    plan.pass.tile_rows = out.layout.chunk[0];
    plan.pass.outputs.push_back(out);
    plan.primary_output = "data";
    plan.summary = {{"shape", shape}, {"dtype", h5::dtype_name(dtype)}, {"chunk", out.layout.chunk},
                    {"bytes", row_bytes * shape[0]}};
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public OutputPassRun {
   public:
    using OutputPassRun::OutputPassRun;
    StepPass output(StagePlan& plan) override {
      const auto& out = plan.pass.outputs[0];
      const h5::DType dtype = out.layout.dtype;
      const std::uint64_t components =
          out.row_bytes() / (h5::dtype_is_complex(dtype) ? h5::dtype_size(dtype) / 2 : h5::dtype_size(dtype));
      return planned_pass(plan, std::make_unique<RandomKernel>(dtype, Params::from_json(ctx_.params).seed, components));
    }
  };
};

}  // namespace

const Stage& tensor_random() {
  static const RandomStage stage;
  return stage;
}

}  // namespace qstage::stages
