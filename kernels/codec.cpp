// The codec's dispatch: the CPU coder (io/codec) or the GPU one (kernels/codec.cu).
#include "kernels/codec.hpp"

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

std::vector<std::uint8_t> codec_encode(Backend& backend, Stream& stream, const float* data, codec::ElementType type,
                                       const std::vector<std::uint64_t>& shape, const codec::Settings& settings,
                                       std::optional<double> range) {
  codec::StreamInfo probe;
  probe.type = type;
  probe.shape = shape;
  const double r = range ? *range : codec_value_range(backend, stream, data, probe.components());
  codec::detail::ComponentCoder coder = codec::detail::code_component;
  QSTAGE_DISPATCH(stream, (void)0, coder = [&](const float* x, std::uint64_t n, int stride, const codec::detail::Coding& c) {
    return detail::code_component_cuda(backend, stream.native(), x, n, stride, c);
  });
  return codec::detail::encode_with(coder, data, type, shape, settings, r);
}

codec::StreamInfo codec_decode(Backend& backend, Stream& stream, const std::uint8_t* host_stream, std::uint64_t bytes,
                               const std::uint8_t* device_stream, float* out, std::uint64_t out_floats) {
  codec::detail::ComponentDecoder decoder = [](const codec::detail::StoredComponent& c, const std::uint8_t* data,
                                               std::uint64_t n, int stride, const codec::detail::Coding& coding,
                                               float* o) { codec::detail::decode_component(c, data, n, stride, coding, o); };
  const std::uint8_t* data = host_stream;
  QSTAGE_DISPATCH(stream, (void)0, {
    data = device_stream;
    decoder = [&](const codec::detail::StoredComponent& c, const std::uint8_t* d, std::uint64_t n, int stride,
                  const codec::detail::Coding& coding, float* o) {
      detail::decode_component_cuda(backend, stream.native(), c, d, n, stride, coding, o);
    };
  });
  return codec::detail::decode_with(decoder, host_stream, bytes, data, out, out_floats);
}

double codec_value_range(Backend& backend, Stream& stream, const float* data, std::uint64_t count) {
  double r = 0;
  QSTAGE_DISPATCH(stream, r = codec::value_range(data, count), r = detail::value_range_cuda(backend, stream.native(), data, count));
  return r;
}

}  // namespace qstage::kernels
