// The codec's dispatch: the CPU coder (codec/) or the GPU one (kernels/codec/codec_gpu.cu).
#include "kernels/codec/backend_codec.hpp"

#include <stdexcept>

namespace qstage::kernels {

namespace {

bool on_gpu(const Stream& stream) {
  if (stream.kind() != BackendKind::cuda) return false;
#ifndef QSTAGE_HAVE_CUDA
  throw std::logic_error("a cuda stream reached a build without CUDA support");
#endif
  return true;
}

}  // namespace

std::vector<std::uint8_t> codec_encode(Backend& backend, Stream& stream, const float* data, codec::ElementType type,
                                       const std::vector<std::uint64_t>& shape, const codec::Settings& settings,
                                       std::optional<double> range, GpuCodec* reuse) {
  codec::StreamInfo probe;
  probe.type = type;
  probe.shape = shape;
  if (!on_gpu(stream)) {
    const double r = range ? *range : codec::value_range(data, probe.components());
    return codec::detail::encode_with(codec::detail::code_components, data, type, shape, settings, r);
  }
#ifdef QSTAGE_HAVE_CUDA
  std::optional<GpuCodec> own;  // one workspace for the range and the coding
  GpuCodec& gpu = reuse ? *reuse : own.emplace(backend, stream);
  const double r = range ? *range : gpu.value_range(data, probe.components());
  auto coder = [&](const float* x, std::uint64_t n, int parts, const codec::detail::Coding& c) {
    return gpu.code_all(x, n, parts, c);
  };
  return codec::detail::encode_with(coder, data, type, shape, settings, r);
#else
  return {};
#endif
}

codec::StreamInfo codec_decode(Backend& backend, Stream& stream, const std::uint8_t* host_stream, std::uint64_t bytes,
                               const std::uint8_t* device_stream, float* out, std::uint64_t out_floats,
                               GpuCodec* reuse) {
  if (!on_gpu(stream)) return codec::decode(host_stream, bytes, out, out_floats);
#ifdef QSTAGE_HAVE_CUDA
  std::optional<GpuCodec> own;
  GpuCodec& gpu = reuse ? *reuse : own.emplace(backend, stream);
  auto decoder = [&](const std::vector<codec::detail::StoredComponent>& parts, const std::uint8_t* d, std::uint64_t n,
                     const codec::detail::Coding& coding, float* o) { gpu.decode_all(parts, d, n, coding, o); };
  return codec::detail::decode_with(decoder, host_stream, bytes, device_stream, out, out_floats);
#else
  return {};
#endif
}

std::uint64_t codec_device_bytes(std::uint64_t elements) {
  // GpuCodec::code's reservation, the larger one: about 10 bytes a value (payload and compacted
  // values at 4 each, the bitmap's scan at 2), 23 bytes a block of >= 64 values, a scan's
  // temporary storage (well under a byte a value) and alignment.
  return 12 * elements + (1u << 20);
}

double codec_value_range(Backend& backend, Stream& stream, const float* data, std::uint64_t count) {
  if (!on_gpu(stream)) return codec::value_range(data, count);
#ifdef QSTAGE_HAVE_CUDA
  return GpuCodec(backend, stream).value_range(data, count);
#else
  return 0;
#endif
}

}  // namespace qstage::kernels
