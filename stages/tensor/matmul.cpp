// tensor.matmul: out-of-core C = A · B. A (M x K) streams through the engine in row batches; B
// (K x N) stays on the device; each batch is one GEMM (cuBLAS or OpenBLAS). This is the pattern
// of applying a gate or a small operator to a huge intermediate.
#include "core/units.hpp"
#include "io/row_io.hpp"
#include "kernels/linalg/gemm.hpp"
#include "kernels/linalg/reduced_gemm.hpp"
#include "stages/common/results.hpp"
#include "stages/tensor/tensor_stages.hpp"

namespace qstage::stages {
namespace {

class MatmulKernel final : public engine::PassKernel {
 public:
  MatmulKernel(const h5::Dataset& b, h5::DType dtype, std::uint64_t k, std::uint64_t n, kernels::Compute compute,
               std::uint64_t tile_rows)
      : b_(b), dtype_(dtype), k_(k), n_(n), compute_(compute),
        row_block_(kernels::deterministic_row_block(static_cast<std::int64_t>(tile_rows))) {}

  // B goes to the device through a small pinned buffer: pinning a B-sized one would cost more
  // than the copy (pinning runs at 1-2 GB/s).
  void prepare(Backend& backend, Stream& stream) override {
    const std::size_t row = n_ * h5::dtype_size(dtype_), bytes = k_ * row;
    const std::uint64_t rows_per_piece = std::max<std::uint64_t>(1, kStagingBytes / row);
    Buffer staging = backend.alloc_host(std::min<std::uint64_t>(k_, rows_per_piece) * row, "matmul: B staging");
    b_device_ = backend.alloc_device(bytes, "matmul: B");
    h5::RowReader reader(b_);
    for (std::uint64_t r = 0; r < k_; r += rows_per_piece) {
      const std::uint64_t n = std::min(rows_per_piece, k_ - r);
      reader.read(r, n, staging.data());
      backend.copy_to_device(b_device_.as<char>() + r * row, staging.data(), n * row, stream);
      stream.synchronize();
    }
  }

  static constexpr std::uint64_t kStagingBytes = 64u << 20;

  // Device scratch per row of a batch in a reduced compute mode: the row of A staged, and room
  // for a column of B's staged tile (the products tile B's columns to fit the batch's share).
  static std::uint64_t staging_per_row(h5::DType dtype, kernels::Compute compute, std::uint64_t k, std::uint64_t n) {
    if (compute == kernels::Compute::full) return 0;
    kernels::Gemm one;
    one.dtype = dtype;
    one.compute = compute;
    one.m = 1, one.n = 2, one.k = static_cast<std::int64_t>(k);  // (B's column twice: half the workspace is B's)
    return static_cast<std::uint64_t>(kernels::reduced_gemm_workspace(one));
  }

  void process(const engine::BatchView& batch) override {
    kernels::Gemm g;
    g.dtype = dtype_;
    g.m = static_cast<std::int64_t>(batch.rows.size());
    g.n = static_cast<std::int64_t>(n_);
    g.k = static_cast<std::int64_t>(k_);
    g.a = batch.inputs[0];
    g.lda = g.k;
    g.b = b_device_.data();
    g.ldb = g.n;
    g.c = batch.outputs[0];
    g.ldc = g.n;
    g.row_block = row_block_;  // batches start on tile boundaries, and blocks divide tiles
    g.compute = compute_;
    g.workspace = batch.scratch;
    g.workspace_bytes = static_cast<std::int64_t>(staging_per_row(dtype_, compute_, k_, n_) * batch.rows.size());
    kernels::gemm(*batch.stream, g);
  }

 private:
  const h5::Dataset& b_;
  h5::DType dtype_;
  std::uint64_t k_, n_;
  kernels::Compute compute_;
  std::int64_t row_block_;
  Buffer b_device_;
};

struct Params {
  kernels::Compute compute;  // the products' arithmetic (single precision; kernels::Compute)
  std::uint64_t chunk_rows;  // 0: input a's chunk rows, or about 4 MiB
  static Params from_json(const nlohmann::json& p) {
    return {*kernels::parse_compute(p.at("compute").get<std::string>()), p.at("chunk_rows").get<std::uint64_t>()};
  }
};

class MatmulStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tensor.matmul", 1,
        "out-of-core C = A . B: A (M x K) streamed in row batches, B (K x N) resident on the device",
        {{"a", "the large operand, M x K, streamed"}, {"b", "the small operand, K x N, kept in device memory"}},
        "- id: c\n  stage: tensor.matmul\n  inputs: {a: psi, b: gate}\n  params: {compute: tf32}\n"};
    return info;
  }

  StagePlan plan(const nlohmann::json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const Params p = Params::from_json(params);
    const Layout& a = in.at("a").layout;
    const Layout& b = in.at("b").layout;
    if (a.shape.size() != 2)
      throw InputError(fmt::format("input 'a' has shape {}; expected a matrix (2 dimensions, M x K)",
                                   shape_text(a.shape)));
    if (b.shape.size() != 2)
      throw InputError(fmt::format("input 'b' has shape {}; expected a matrix (2 dimensions, K x N)",
                                   shape_text(b.shape)));
    if (!detail::is_float_type(a.dtype))
      throw InputError(fmt::format("input 'a' has dtype {}; expected float32, float64, complex64 or complex128",
                                   h5::dtype_name(a.dtype)));
    if (b.dtype != a.dtype)
      throw InputError(fmt::format("input 'b' has dtype {}; expected {} (the dtype of input 'a')",
                                   h5::dtype_name(b.dtype), h5::dtype_name(a.dtype)));
    if (b.shape[0] != a.shape[1])
      throw InputError(fmt::format("input 'b' has {} rows; expected {} (the columns of input 'a', shape {})",
                                   b.shape[0], a.shape[1], shape_text(a.shape)));
    const std::uint64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
    if (p.compute != kernels::Compute::full && a.dtype != h5::DType::float32 && a.dtype != h5::DType::complex64)
      throw InputError(fmt::format("params.compute: {} applies to float32 and complex64 inputs; expected compute full "
                                   "for {}", kernels::compute_name(p.compute), h5::dtype_name(a.dtype)));
    std::uint64_t chunk_rows = p.chunk_rows;
    if (!chunk_rows) chunk_rows = a.chunk.empty() ? default_chunk_rows(n * h5::dtype_size(a.dtype)) : a.chunk[0];

    StagePlan plan;
    engine::OutputDecl out{"data", {a.dtype, {m, n}, {}}, std::nullopt};
    out.layout.chunk = detail::row_chunk(out.layout.shape, chunk_rows, a.dtype, "params.chunk_rows");
    plan.pass.rows = m;
    plan.pass.tile_rows = out.layout.chunk[0];
    plan.pass.inputs.push_back({"a", nullptr, a.row_bytes()});
    plan.pass.outputs.push_back(out);
    plan.pass.resident_device_bytes = k * n * h5::dtype_size(a.dtype);
    plan.pass.prepare_host_bytes =
        std::min<std::uint64_t>(plan.pass.resident_device_bytes, std::max(MatmulKernel::kStagingBytes, n * h5::dtype_size(a.dtype)));
    plan.pass.uses_blas = true;
    plan.pass.scratch_device_bytes_per_row = MatmulKernel::staging_per_row(a.dtype, p.compute, k, n);
    plan.streamed_inputs = {"a"};
    plan.primary_output = "data";
    kernels::Gemm g;
    g.dtype = a.dtype;
    g.m = static_cast<std::int64_t>(m);
    g.n = static_cast<std::int64_t>(n);
    g.k = static_cast<std::int64_t>(k);
    plan.flops = kernels::gemm_flops(g);
    plan.summary = {{"m", m}, {"k", k}, {"n", n}, {"dtype", h5::dtype_name(a.dtype)},
                    {"compute", kernels::compute_name(p.compute)},
                    {"flops", plan.flops}, {"b_bytes", plan.pass.resident_device_bytes}};
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public OutputPassRun {
   public:
    using OutputPassRun::OutputPassRun;
    StepPass output(StagePlan& plan) override {
      const auto& out = plan.pass.outputs[0];
      const h5::Dataset& b = *ctx_.inputs.at("b");
      return planned_pass(plan, std::make_unique<MatmulKernel>(b, out.layout.dtype, b.shape()[0], out.layout.shape[1],
                                                               Params::from_json(ctx_.params).compute, plan.pass.tile_rows));
    }
  };
};

}  // namespace

const Stage& tensor_matmul() {
  static const MatmulStage stage;
  return stage;
}

}  // namespace qstage::stages
