// decompress: a dataset of qstage-compressed chunks (written by `compress`, or by h5py through
// filter 32881) back to plain float32/complex64 values, decoded on the device.
//
// The engine reads the chunks as they are stored (io/row_io.hpp, StoredChunkReader: chunk
// addresses from HDF5, bytes with pread), so HDF5's filter pipeline never runs; each tile of a
// batch is one chunk, decoded by kernels::codec_decode from its device copy, with the host copy
// for the stream's framing. Chunks whose filter HDF5 skipped (h5py marks a filter optional, and
// stores a chunk it failed to compress as it is) are copied as they are.
#include <cstring>

#include "core/error.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "io/row_io.hpp"
#include "stages/compress/common.hpp"
#include "stages/compress/compress_stages.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

using namespace compress_detail;
using nlohmann::json;

// Bytes per row of the stored-chunks input: a chunk's slot holds its header and the largest
// stream a chunk of its size can be, in whole 16-byte units.
std::uint64_t slot_row_bytes(codec::ElementType type, const h5::Shape& chunk) {
  const std::uint64_t slot = sizeof(h5::StoredChunk) + codec::max_stream_bytes(type, shape_elements(chunk), chunk.size());
  const std::uint64_t rows = chunk[0];
  return ((slot + rows - 1) / rows + 15) & ~std::uint64_t{15};
}

class DecompressKernel final : public engine::PassKernel {
 public:
  DecompressKernel(codec::ElementType type, h5::Shape chunk, std::uint64_t row_bytes, std::uint64_t slot_bytes,
                   std::string where)
      : codec_(type, chunk, row_bytes), tile_rows_(chunk[0]), row_bytes_(row_bytes), slot_bytes_(slot_bytes),
        where_(std::move(where)) {}
  void prepare(Backend& backend, Stream&) override {
    backend_ = &backend;
    codec_.prepare(backend);
  }
  void process(const engine::BatchView& b) override {
    const auto* host = static_cast<const std::uint8_t*>(b.host_inputs[0]);
    const auto* device = static_cast<const std::uint8_t*>(b.inputs[0]);
    for (std::uint64_t first = b.rows.begin, t = 0; first < b.rows.end; first += tile_rows_, ++t) {
      const std::uint64_t rows = std::min(tile_rows_, b.rows.end - first), chunk = first / tile_rows_;
      h5::StoredChunk head;
      std::memcpy(&head, host + t * slot_bytes_, sizeof head);
      const std::uint64_t at = t * slot_bytes_ + sizeof head;
      void* out = static_cast<char*>(b.outputs[0]) + (first - b.rows.begin) * row_bytes_;
      if (head.filter_mask & 1u) {  // stored unfiltered: the chunk's values as they are
        if (head.bytes != codec_.chunk_bytes())
          throw CorruptInput(fmt::format("chunk {} of {} is stored unfiltered in {} bytes; a chunk has {}", chunk,
                                           where_, head.bytes, codec_.chunk_bytes()));
        backend_->copy_on_device(out, device + at, rows * row_bytes_, *b.stream);
        continue;
      }
      try {
        codec_.decode(*b.stream, host + at, device + at, head.bytes, out, rows);
      } catch (const codec::FormatError& e) {
        throw CorruptInput(fmt::format("chunk {} (rows from {}) of {} cannot be decoded: {}", chunk, first, where_,
                                         e.what()));
      } catch (const std::invalid_argument& e) {  // a valid stream of another size
        throw CorruptInput(fmt::format("chunk {} (rows from {}) of {} does not hold a whole chunk: {}", chunk, first,
                                         where_, e.what()));
      }
    }
  }

 private:
  ChunkCodec codec_;
  Backend* backend_ = nullptr;
  std::uint64_t tile_rows_, row_bytes_, slot_bytes_;
  std::string where_;  // "dataset 'x' in 'file.h5'"
};

class DecompressStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "decompress", 1, "a dataset compressed with qstage's codec (filter 32881) back to plain values, decoded on the device",
        {{"x", "the compressed dataset (float32 or complex64, chunks of filter 32881)"}},
        "- id: unpacked\n  stage: decompress\n  inputs: {x: packed}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const Layout& x = in.at("x").layout;
    const std::vector<unsigned>& filters = in.at("x").filters;
    const codec::ElementType type = element_type(x.dtype, "x");
    if (x.shape.empty() || !x.chunked())
      throw InputError(fmt::format("input 'x' is {}; expected a chunked dataset of compressed chunks (a compress step's "
                                   "output)",
                                   x.shape.empty() ? "a scalar" : "not chunked"));
    for (size_t i = 1; i < x.shape.size(); ++i)
      if (x.chunk[i] != x.shape[i])
        throw InputError(fmt::format("input 'x' has chunks of {} that do not span its rows of {}; expected chunks "
                                     "that hold whole rows",
                                     shape_text(x.chunk), shape_text(x.shape)));
    if (filters != std::vector<unsigned>{h5z::kFilterId})
      throw InputError(fmt::format("input 'x' has the filter pipeline [{}]; expected qstage's codec alone ([{}]), as "
                                   "a compress step writes",
                                   fmt::join(filters, ", "), h5z::kFilterId));
    StagePlan plan;
    plan.pass.rows = x.rows();
    plan.pass.tile_rows = x.chunk[0];
    engine::StreamedInput input{"x", nullptr, slot_row_bytes(type, x.chunk)};
    input.kind = engine::InputKind::stored_chunks;
    plan.pass.inputs.push_back(input);
    const std::string name = params.at("dataset").get<std::string>();
    plan.pass.outputs.push_back({name, x, std::nullopt});
    plan.streamed_inputs = {"x"};
    plan.primary_output = name;
    plan.summary = {{"shape", x.shape}, {"dtype", h5::dtype_name(x.dtype)}, {"chunk_rows", x.chunk[0]}};
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public OutputPassRun {
   public:
    using OutputPassRun::OutputPassRun;
    StepPass output(StagePlan& plan) override {
      const h5::Dataset& x = *ctx_.inputs.at("x");
      const codec::ElementType type = element_type(*x.dtype(), "x");
      plan.pass.resident_device_bytes = ChunkCodec::device_bytes(ctx_.backend->kind(), type, plan.pass.tile_rows * x.row_bytes());
      return planned_pass(plan, std::make_unique<DecompressKernel>(
                                    type, x.chunk(), x.row_bytes(), plan.pass.tile_rows * plan.pass.inputs[0].row_bytes,
                                    fmt::format("dataset '{}' in '{}'", x.where().object, x.where().file)));
    }
  };
};

}  // namespace

const Stage& decompress() {
  static const DecompressStage stage;
  return stage;
}

}  // namespace qstage::stages
