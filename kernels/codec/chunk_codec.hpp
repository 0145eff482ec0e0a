#pragma once
// The codec (kernels/codec/backend_codec.hpp) over the chunks of a chunked dataset on a pass's backend: one
// stream per chunk of rows, the last (short) chunk zero-padded to a whole chunk, because HDF5
// hands a filter whole chunks. Used by the compression stages and by the engine for any step's
// compressed outputs.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "codec/codec.hpp"
#include "kernels/codec/backend_codec.hpp"

namespace qstage::kernels {

class ChunkCodec {
 public:
  ChunkCodec(codec::ElementType type, std::vector<std::uint64_t> chunk_shape, std::uint64_t row_bytes);
  ~ChunkCodec();
  // Once per rank (PassKernel::prepare): the padding buffer and, on cuda, the GPU workspace.
  void prepare(Backend& backend);
  // The stream of the chunk whose first `rows` rows are at `x` (device memory on cuda), after
  // the work queued on `batch` (the copy of x) is done.
  std::vector<std::uint8_t> encode(Stream& batch, const void* x, std::uint64_t rows, const codec::Settings& s,
                                   std::optional<double> range);
  // The value range (codec::value_range) of the chunk whose first `rows` rows are at `x`, without
  // the padding, after the work queued on `batch` is done.
  double value_range(Stream& batch, const void* x, std::uint64_t rows);
  // Decodes a whole chunk's stream (host copy `host`, device copy `device`) and leaves its first
  // `rows` rows at `out` (device memory on cuda). Throws codec::FormatError for a bad stream.
  codec::StreamInfo decode(Stream& batch, const std::uint8_t* host, const std::uint8_t* device, std::uint64_t bytes,
                           void* out, std::uint64_t rows);
  // The stream the codec's work runs on (the batch's on cpu).
  Stream& stream(Stream& batch);
  std::uint64_t chunk_bytes() const { return chunk_rows_ * row_bytes_; }
  // Device memory prepare() takes for a chunk of these many bytes on this backend.
  static std::uint64_t device_bytes(BackendKind kind, codec::ElementType type, std::uint64_t chunk_bytes);

 private:
  codec::ElementType type_;
  std::vector<std::uint64_t> shape_;
  std::uint64_t chunk_rows_, row_bytes_;
  Backend* backend_ = nullptr;
  std::unique_ptr<Stream> stream_;        // cuda: the codec's own stream
#ifdef QSTAGE_HAVE_CUDA
  std::unique_ptr<GpuCodec> gpu_;  // (a CPU-only build has no GpuCodec to destroy)
#endif
  GpuCodec* gpu() const;
  Buffer pad_, zeros_;                    // a whole chunk, and a whole chunk of zeros
};

}  // namespace qstage::kernels
