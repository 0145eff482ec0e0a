#pragma once
// A component (one float32 array: the data, or the real or imaginary parts of complex data)
// as the stream stores it, between the backends that code blocks (the CPU here, the GPU in
// kernels/codec/codec_gpu.cu) and the stream format (stream.cpp), which adds the header and the
// lossless packing.
#include <cstdint>
#include <functional>
#include <vector>

#include "codec/block_coder.hpp"
#include "codec/codec.hpp"

namespace qstage::codec::detail {

struct Coding {
  Pipeline pipeline = Pipeline::szx;
  std::uint32_t block = 256;
  double t = 0, e = 0;  // absolute
};
bool groups(Pipeline p);     // group, group2l, quantized: a bitmap, then the significant values
bool two_level(Pipeline p);  // group2l: the bitmap in seed 003's two-level form
BlockRules rules_for(const Coding& c);        // how the pipeline's blocks are coded

// One component, coded.
struct ComponentParts {
  std::vector<std::uint8_t> bitmap;   // group, group2l: bit i of byte i/8 (least significant first) for significant values
  std::uint64_t coded = 0;            // values in blocks: all of them, or the significant ones
  std::vector<std::uint8_t> meta;     // a state byte per block, then a u16 payload size per block (little-endian)
  std::vector<std::uint8_t> payload;  // the blocks' payloads in order
};

// Codes a stream's components (one, or the real and imaginary parts, interleaved at x): the
// parts of component k from x[k], x[k + parts], ...
using ComponentCoder = std::function<std::vector<ComponentParts>(const float* x, std::uint64_t n, int parts, const Coding&)>;
// Codes the component x[0], x[stride], ..., x[(n - 1) stride]. The CPU coder; the GPU one
// (kernels/codec/codec_gpu.cu) takes a device pointer and returns the same parts.
ComponentParts code_component(const float* x, std::uint64_t n, int stride, const Coding& c);
// The CPU ComponentCoder.
std::vector<ComponentParts> code_components(const float* x, std::uint64_t n, int parts, const Coding& c);

// A component as the stream holds it, checked against the shape (sizes, counts, states); its
// block payloads stay in the stream, at payload_offset.
struct StoredComponent {
  std::vector<std::uint8_t> bitmap;  // group, group2l (unpacked)
  std::uint64_t coded = 0;
  std::vector<std::uint8_t> meta;    // unpacked
  static constexpr std::uint64_t kPacked = ~std::uint64_t{0};
  std::uint64_t meta_offset = kPacked;  // where the meta lies in the stream when stored raw (integrated)
  // Two-level bitmaps: where the second level and the nonzero first-level bytes lie in the stream.
  std::uint64_t level2_offset = kPacked, level1_offset = 0, level1_count = 0;
  std::uint64_t payload_offset = 0, payload_bytes = 0;  // from the start of the stream
};

// Decodes a stream's components (one, or the real and imaginary parts) into `out`: component k
// into out[k], out[k + parts], ... from `stream` (host or device memory, as the decoder expects).
// Throws FormatError on inconsistent block payloads.
using ComponentDecoder = std::function<void(const std::vector<StoredComponent>& parts, const std::uint8_t* stream,
                                            std::uint64_t n, const Coding& coding, float* out)>;
// The CPU decoder of one component: into out[0], out[stride], ...
void decode_component(const StoredComponent& c, const std::uint8_t* stream, std::uint64_t n, int stride,
                      const Coding& coding, float* out, BlockCounts* counts = nullptr);

// The stream around a backend's coder and decoder. encode_with takes the dataset's value range
// (the data may be in device memory); decode_with parses the host copy `stream` and hands the
// decoder `data`, the same bytes where the decoder reads them (host or device).
std::vector<std::uint8_t> encode_with(const ComponentCoder& coder, const float* data, ElementType type,
                                      const std::vector<std::uint64_t>& shape, const Settings& s, double range);
StreamInfo decode_with(const ComponentDecoder& decoder, const std::uint8_t* stream, std::uint64_t bytes,
                       const std::uint8_t* data, float* out, std::uint64_t out_floats);

inline std::uint64_t div_up(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }
inline int block_payload_size(const std::vector<std::uint8_t>& meta, std::uint64_t blocks, std::uint64_t b) {
  return meta[blocks + 2 * b] | (meta[blocks + 2 * b + 1] << 8);
}

}  // namespace qstage::codec::detail
