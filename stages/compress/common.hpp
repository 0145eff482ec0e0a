#pragma once
// What the compression stages share: the codec settings from a step's parameters, the value
// range relative bounds refer to, the chunking, and the last chunk's zero padding.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/codec/codec.hpp"
#include "kernels/codec.hpp"
#include "stages/stage.hpp"

namespace qstage::stages::compress_detail {

// float32 -> float32, complex64 -> complex64; anything else is an InputError naming the slot.
codec::ElementType element_type(h5::DType t, std::string_view slot);
// The codec settings the parameters ask for (pipeline, error, threshold, bounds, block_size),
// checked; throws InputError naming the parameter.
codec::Settings settings_from(const nlohmann::json& params);
// Rows per compressed chunk: `chunk_rows` if given, else the input's chunk rows, else about
// 4 MiB; at most the input's rows. Each chunk is one codec stream.
std::uint64_t chunk_rows_for(const nlohmann::json& params, const DatasetInfo& x);
h5::Shape chunk_shape(const h5::Shape& shape, std::uint64_t chunk_rows);
std::uint64_t elements_of(const h5::Shape& shape);

// max - min over the finite real and imaginary parts of a float32/complex64 dataset, read in
// parallel over ranks (each reads a share of the rows). Collective.
double measure_range(const h5::Dataset& x, std::uint64_t tile_rows, const mpi::Comm& comm);
// The range relative bounds refer to: the `range` parameter, else measured (collective);
// nullopt for absolute bounds.
std::optional<double> range_for(const nlohmann::json& params, const h5::Dataset& x, std::uint64_t tile_rows,
                                const mpi::Comm& comm);

// The codec on a pass's backend, one chunk at a time, with the last (short) chunk zero-padded to
// a whole chunk: HDF5 hands a filter whole chunks, so every stored stream must be one.
class ChunkCodec {
 public:
  ChunkCodec(codec::ElementType type, h5::Shape chunk_shape, std::uint64_t row_bytes);
  ~ChunkCodec();
  // Once per rank (PassKernel::prepare): the padding buffer and, on cuda, the GPU workspace.
  void prepare(Backend& backend);
  // The stream of the chunk whose first `rows` rows are at `x` (device memory on cuda), after
  // the work queued on `batch` (the copy of x) is done.
  std::vector<std::uint8_t> encode(Stream& batch, const void* x, std::uint64_t rows, const codec::Settings& s,
                                   std::optional<double> range);
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
  h5::Shape shape_;
  std::uint64_t chunk_rows_, row_bytes_;
  Backend* backend_ = nullptr;
  std::unique_ptr<Stream> stream_;        // cuda: the codec's own stream
#ifdef QSTAGE_HAVE_CUDA
  std::unique_ptr<kernels::GpuCodec> gpu_;  // (a CPU-only build has no GpuCodec to destroy)
#endif
  kernels::GpuCodec* gpu() const;
  Buffer pad_, zeros_;                    // a whole chunk, and a whole chunk of zeros
};

// The pass of a stage that codes a dataset chunk by chunk (compress, compress.evaluate): one tile
// per chunk, `x` streamed, partials on the host; the summary records the settings. Throws
// InputError for a bad input or parameter.
StagePlan chunk_pass(const nlohmann::json& params, const DatasetInfo& x);
// At run time: measures the range (relative bounds, collective) into the summary and reserves
// the codec's device memory plus `extra_device_bytes`.
void refine_chunk_pass(StagePlan& plan, const KernelContext& ctx, std::uint64_t extra_device_bytes = 0);
// The range refine_chunk_pass recorded (nullopt for absolute bounds).
std::optional<double> planned_range(const StagePlan& plan);

// The settings as dataset attributes and provenance.
nlohmann::json settings_json(const codec::Settings& s, std::optional<double> range, codec::ElementType type);

}  // namespace qstage::stages::compress_detail
