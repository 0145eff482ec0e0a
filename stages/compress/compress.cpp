// compress: a float32 or complex64 dataset into a chunked dataset whose chunks are streams of
// qstage's error-bounded codec, stored under HDF5 filter 32881, so that h5py (with the plugin)
// reads it as plain values and `decompress` decodes it on the device.
//
// Each chunk of rows is one stream, coded by the pass's kernel on the device (kernels/codec/codec_encode.cu)
// or the CPU, with bounds relative to the range of the whole dataset (measured in a first pass,
// RelativeBoundsStage, unless the `range` parameter gives it). Compressed sizes vary, so the streams
// leave the pass as per-tile partials: rank 0 appends them in chunk order to a spool file in the
// step's work directory, made durable at every checkpoint. Parallel HDF5 1.10 cannot write
// compressed chunks from several ranks (direct chunk writes are not coordinated and silently
// misplace chunks), so rank 0 alone writes them into the output at the end. All of that is the
// engine's coded_chunks output (engine/output_sinks.hpp); this stage hands it the rows of x and
// the range its relative bounds refer to.
#include <cstring>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "stages/compress/common.hpp"
#include "stages/compress/compress_stages.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

namespace fs = std::filesystem;
using namespace compress_detail;
using nlohmann::json;

// The coded_chunks output codes what the kernel leaves in its buffer: the batch's rows of x.
class CompressKernel final : public engine::PassKernel {
 public:
  explicit CompressKernel(std::uint64_t row_bytes) : row_bytes_(row_bytes) {}
  void prepare(Backend& backend, Stream&) override { backend_ = &backend; }
  void process(const engine::BatchView& b) override {
    backend_->copy_on_device(b.outputs[0], b.inputs[0], b.rows.size() * row_bytes_, *b.stream);
  }

 private:
  Backend* backend_ = nullptr;
  std::uint64_t row_bytes_;
};

class CompressStage final : public Stage {
 public:
  const StageInfo& info() const override {
    // (2: at e = 0 a -0 is kept; version 1 stored +0, so outputs of data with -0 are redone)
    static const StageInfo info{
        "compress", 2,
        "error-bounded lossy compression of a float32/complex64 dataset into chunks h5py reads through filter 32881",
        {{"x", "the dataset to compress (float32 or complex64)"}},
        "- id: packed\n  stage: compress\n  inputs: {x: amplitudes}\n  params: {pipeline: quantized, error: 1.0e-3, "
        "threshold: 1.0e-3}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const Layout& x = in.at("x").layout;
    const CodingParams coding = CodingParams::from_json(params);
    StagePlan plan = chunk_pass(coding, x);
    const h5::Shape chunk = chunk_shape(x.shape, plan.pass.tile_rows);
    const std::string name = params.at("dataset").get<std::string>();
    engine::OutputDecl out{name, {x.dtype, x.shape, chunk}, coding.settings};
    out.kind = engine::OutputKind::coded_chunks;
    plan.pass.outputs.push_back(out);
    plan.primary_output = name;
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public RangeRun {
   public:
    using RangeRun::RangeRun;
    // Relative bounds are fractions of the whole dataset's range (measured by the range pass).
    StepPass output(StagePlan& plan) override {
      plan.pass.outputs.at(0).codec_range = refine_chunk_pass(plan, ctx_, range());
      return planned_pass(plan, std::make_unique<CompressKernel>(ctx_.inputs.at("x")->row_bytes()));
    }
    void write(const StagePlan& plan, const StepPass& pass, h5::File& out) const override {
      // Rank 0 holds the coded chunks (the other ranks' reports say 0 bytes), and attribute writes
      // are collective: every rank writes the total over the ranks.
      const std::uint64_t input = plan.pass.rows * plan.pass.inputs[0].row_bytes,
                          stored = ctx_.comm->sum_wrapping({pass.outputs.at(0).stored_bytes}).at(0);
      out.set_attribute("compress.input_bytes", input);
      out.set_attribute("compress.stored_bytes", stored);
      out.set_attribute("compress.ratio", stored ? static_cast<double>(input) / static_cast<double>(stored) : 0.0);
      out.set_attribute("compress.codec", plan.summary.at("codec").dump());
    }
    // (this rank's stored bytes: rank 0 has them all)
    std::string describe(const StagePlan& plan, const StepPass& pass) const override {
      const double input = static_cast<double>(plan.pass.rows * plan.pass.inputs[0].row_bytes);
      const double stored = static_cast<double>(pass.outputs.at(0).stored_bytes);
      const json& c = plan.summary.at("codec");
      return fmt::format("{} chunks, {} -> {} (ratio {:.2f}), {} bound {:.3g} (threshold {:.3g})", pass.outputs.at(0).chunks,
                         format_bytes(input), format_bytes(stored), stored > 0 ? input / stored : 0.0,
                         c.at("pipeline").get<std::string>(), c.at("error").get<double>(), c.at("threshold").get<double>());
    }
  };
};

}  // namespace

const Stage& compress() {
  static const CompressStage stage;
  return stage;
}

}  // namespace qstage::stages
