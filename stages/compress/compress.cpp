// compress: a float32 or complex64 dataset into a chunked dataset whose chunks are streams of
// qstage's error-bounded codec, stored under HDF5 filter 32881, so that h5py (with the plugin)
// reads it as plain values and `decompress` decodes it on the device.
//
// Each chunk of rows is one stream, coded by the pass's kernel on the device (kernels/codec_encode.cu)
// or the CPU, with bounds relative to the range of the whole dataset (measured in a first pass,
// RelativeBoundsStage, unless the `range` parameter gives it). Compressed sizes vary, so the streams
// leave the pass as per-tile partials: rank 0 appends them in chunk order to a spool file in the
// step's work directory, made durable at every checkpoint. Parallel HDF5 1.10 cannot write
// compressed chunks from several ranks (direct chunk writes are not coordinated and silently
// misplace chunks), so rank 0 alone writes them into the output at the end (finish_output).
#include <cstring>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "stages/compress/common.hpp"
#include "stages/compress/compress_stages.hpp"
#include "stages/tensor/common.hpp"

namespace qstage::stages {
namespace {

namespace fs = std::filesystem;
using namespace compress_detail;
using nlohmann::json;

constexpr const char* kSpool = "chunks.bin";

// A tile's partial: the stream's size, then the stream.
std::uint64_t partial_bytes(codec::ElementType type, const h5::Shape& chunk) {
  const std::uint64_t bytes = 8 + codec::max_stream_bytes(type, shape_elements(chunk), chunk.size());
  return (bytes + 7) / 8 * 8;
}

class CompressKernel final : public engine::PassKernel {
 public:
  CompressKernel(codec::ElementType type, h5::Shape chunk, std::uint64_t row_bytes, codec::Settings settings,
                 std::optional<double> range, std::uint64_t partial)
      : codec_(type, chunk, row_bytes), tile_rows_(chunk[0]), row_bytes_(row_bytes), settings_(settings), range_(range),
        partial_(partial) {}
  void prepare(Backend& backend, Stream&) override { codec_.prepare(backend); }
  void process(const engine::BatchView& b) override {
    auto* partials = static_cast<std::byte*>(b.partials);  // host memory (partials_on_host)
    for (std::uint64_t first = b.rows.begin, t = 0; first < b.rows.end; first += tile_rows_, ++t) {
      const std::uint64_t rows = std::min(tile_rows_, b.rows.end - first);
      const auto* x = static_cast<const char*>(b.inputs[0]) + (first - b.rows.begin) * row_bytes_;
      const std::vector<std::uint8_t> stream = codec_.encode(*b.stream, x, rows, settings_, range_);
      const std::uint64_t size = stream.size();
      if (8 + size > partial_) throw std::logic_error("a compressed chunk exceeds its bound");
      std::memcpy(partials + t * partial_, &size, 8);
      std::memcpy(partials + t * partial_ + 8, stream.data(), size);
    }
  }

 private:
  ChunkCodec codec_;
  std::uint64_t tile_rows_, row_bytes_;
  codec::Settings settings_;
  std::optional<double> range_;
  std::uint64_t partial_;
};

// Appends each tile's stream, in chunk order, to the spool file on rank 0 (h5::ChunkSpool); its
// committed state is the reduction's state in the journal.
class SpoolReduction final : public engine::Reduction {
 public:
  void attach(const fs::path& dir) override { spool_.set_path(dir / kSpool); }
  std::vector<std::string> files() const override { return {kSpool}; }
  void fold(const std::byte* tile) override {
    std::uint64_t size;
    std::memcpy(&size, tile, 8);
    spool_.append(tile + 8, size);
  }
  std::string save() const override { return spool_.commit().serialize(); }
  void load(const std::string& state) override {
    try {
      spool_.restore(h5::ChunkSpool::State::deserialize(state));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("compress: {}", e.what()));
    }
  }
  const h5::ChunkSpool& spool() const { return spool_; }

 private:
  h5::ChunkSpool spool_;
};

class CompressStage final : public RelativeBoundsStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "compress", 1,
        "error-bounded lossy compression of a float32/complex64 dataset into chunks h5py reads through filter 32881",
        {{"x", "the dataset to compress (float32 or complex64)"}},
        "- id: packed\n  stage: compress\n  inputs: {x: amplitudes}\n  params: {pipeline: quantized, error: 1.0e-3, "
        "threshold: 1.0e-3}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const Layout& x = in.at("x").layout;
    StagePlan plan = chunk_pass(CodingParams::from_json(params), x);
    const h5::Shape chunk = chunk_shape(x.shape, plan.pass.tile_rows);
    plan.pass.tile_partial_bytes = partial_bytes(element_type(x.dtype, "x"), chunk);
    plan.pass.sized_partials = true;  // only the streams travel to rank 0
    const std::string name = params.at("dataset").get<std::string>();
    plan.primary_output = name;
    plan.results = {{name, DatasetInfo{{x.dtype, x.shape, chunk}, {h5z::kFilterId}}}};
    return plan;
  }

  void refine_plan(StagePlan& plan, const KernelContext& ctx) const override { refine_chunk_pass(plan, ctx); }

  std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const override {
    const h5::Dataset& x = *ctx.inputs.at("x");
    return std::make_unique<CompressKernel>(element_type(*x.dtype(), "x"), chunk_shape(x.shape(), ctx.plan.pass.tile_rows),
                                            x.row_bytes(), CodingParams::from_json(ctx.params).settings, planned_range(ctx.plan),
                                            ctx.plan.pass.tile_partial_bytes);
  }

  std::unique_ptr<engine::Reduction> make_reduction(const StagePlan&) const override {
    return std::make_unique<SpoolReduction>();
  }

  void write_results(const StagePlan& plan, const StepResults& r, h5::File& out) const override {
    const auto& spool = static_cast<const SpoolReduction*>(r.reduction)->spool();
    const std::uint64_t input = plan.pass.rows * plan.pass.inputs[0].row_bytes;
    out.set_attribute("compress.input_bytes", input);
    out.set_attribute("compress.stored_bytes", spool.state().bytes);
    out.set_attribute("compress.ratio", spool.state().bytes ? static_cast<double>(input) / static_cast<double>(spool.state().bytes) : 0.0);
    out.set_attribute("compress.codec", plan.summary.at("codec").dump());
  }

  std::map<std::string, std::string> finish_output(const StagePlan& plan, const StepResults& r,
                                                   const fs::path& file) const override {
    const auto& spool = static_cast<const SpoolReduction*>(r.reduction)->spool();
    const Layout& layout = plan.results.at(0).second.layout;
    const json& c = plan.summary.at("codec");
    // The stored streams carry absolute bounds; the filter's cd_values say the same, so that
    // h5repack or h5py rewriting the dataset keeps them.
    codec::Settings absolute = CodingParams::from_json(r.context->params).settings;
    absolute.relative = false;
    absolute.threshold = c.at("threshold").get<double>();
    absolute.error = c.at("error").get<double>();

    h5::File out = h5::File::open(file, h5::Mode::read_write);  // serial: rank 0 alone
    const std::string digest = h5::write_compressed_dataset(out, plan.results.at(0).first, layout, absolute, c, spool);
    out.flush();
    out.close();
    return {{plan.results.at(0).first, digest}};
  }

  std::string describe_results(const StagePlan& plan, const StepResults& r) const override {
    const auto& spool = static_cast<const SpoolReduction*>(r.reduction)->spool();
    const double input = static_cast<double>(plan.pass.rows * plan.pass.inputs[0].row_bytes);
    const json& c = plan.summary.at("codec");
    return fmt::format("{} chunks, {} -> {} (ratio {:.2f}), {} bound {:.3g} (threshold {:.3g})", spool.state().sizes.size(),
                       format_bytes(input), format_bytes(static_cast<double>(spool.state().bytes)),
                       spool.state().bytes ? input / static_cast<double>(spool.state().bytes) : 0.0,
                       c.at("pipeline").get<std::string>(), c.at("error").get<double>(), c.at("threshold").get<double>());
  }
};

}  // namespace

const Stage& compress() {
  static const CompressStage stage;
  return stage;
}

}  // namespace qstage::stages
