#include "kernels/codec/chunk_codec.hpp"

namespace qstage::kernels {

ChunkCodec::ChunkCodec(codec::ElementType type, std::vector<std::uint64_t> chunk_shape, std::uint64_t row_bytes)
    : type_(type), shape_(std::move(chunk_shape)), chunk_rows_(shape_.at(0)), row_bytes_(row_bytes) {}

ChunkCodec::~ChunkCodec() = default;

std::uint64_t ChunkCodec::device_bytes(BackendKind kind, codec::ElementType type, std::uint64_t chunk_bytes) {
  const std::uint64_t elements = chunk_bytes / (type == codec::ElementType::complex64 ? 8 : 4);
  return 2 * chunk_bytes + (kind == BackendKind::cuda ? codec_device_bytes(elements) : 0);
}

void ChunkCodec::prepare(Backend& backend) {
  backend_ = &backend;
  pad_ = backend.alloc_device(chunk_bytes(), "codec: a padded chunk");
  zeros_ = backend.alloc_device(chunk_bytes(), "codec: zeros for padding");
  stream_ = backend.make_stream();
  const std::vector<std::byte> zeros(chunk_bytes());
  backend.copy_to_device(zeros_.data(), zeros.data(), zeros.size(), *stream_);
  stream_->synchronize();
#ifdef QSTAGE_HAVE_CUDA
  if (backend.kind() == BackendKind::cuda) gpu_ = std::make_unique<GpuCodec>(backend, *stream_);
#endif
}

GpuCodec* ChunkCodec::gpu() const {
#ifdef QSTAGE_HAVE_CUDA
  return gpu_.get();
#else
  return nullptr;
#endif
}

Stream& ChunkCodec::stream(Stream& batch) {
  if (backend_->kind() != BackendKind::cuda) return batch;
  batch.synchronize();  // the batch's copy to the device is done before the codec's stream reads it
  return *stream_;
}

std::vector<std::uint8_t> ChunkCodec::encode(Stream& batch, const void* x, std::uint64_t rows,
                                             const codec::Settings& s, std::optional<double> range) {
  Stream& st = stream(batch);
  const void* data = x;
  if (rows < chunk_rows_) {  // the last chunk: its rows, then zeros
    backend_->copy_on_device(pad_.data(), x, rows * row_bytes_, st);
    backend_->copy_on_device(pad_.as<char>() + rows * row_bytes_, zeros_.data(), (chunk_rows_ - rows) * row_bytes_, st);
    data = pad_.data();
  }
  // Absolute bounds: no range given, so the header records the chunk's own.
  return codec_encode(*backend_, st, static_cast<const float*>(data), type_, shape_, s, range, gpu());
}

codec::StreamInfo ChunkCodec::decode(Stream& batch, const std::uint8_t* host, const std::uint8_t* device,
                                     std::uint64_t bytes, void* out, std::uint64_t rows) {
  Stream& st = stream(batch);
  const std::uint64_t floats = chunk_bytes() / sizeof(float);
  void* target = rows < chunk_rows_ ? pad_.data() : out;
  // On cpu the "device" copy is host memory too: decode from it, so that the CPU exercises the
  // same copy of the stream the GPU decodes from.
  const std::uint8_t* framing = backend_->kind() == BackendKind::cuda ? host : device;
  const codec::StreamInfo info =
      codec_decode(*backend_, st, framing, bytes, device, static_cast<float*>(target), floats, gpu());
  if (target != out) backend_->copy_on_device(out, target, rows * row_bytes_, st);
  st.synchronize();
  return info;
}

double ChunkCodec::value_range(Stream& batch, const void* x, std::uint64_t rows) {
  Stream& st = stream(batch);
  return codec_value_range(*backend_, st, static_cast<const float*>(x), rows * row_bytes_ / sizeof(float));
}

}  // namespace qstage::kernels
