#pragma once
// The compression codec (codec/) on a backend. On cuda the data is device memory and the
// blocks are coded and decoded on the GPU (kernels/codec/codec_encode.cu, codec_decode.cu; the host
// side kernels/codec/codec_gpu.cu), one warp per block, with the
// bytes of the CPU coder (codec/block_coder.cpp, its twin): both decide with the same
// block_math.hpp, in the same order. The host keeps the stream's framing (header, zstd parts).
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "codec/codec.hpp"
#include "codec/component.hpp"

namespace qstage::kernels {

class GpuCodec;

// codec::encode of `data` (device memory on cuda). `range`: the dataset's value range where
// data is a part of it; else data's own. `gpu`: a GpuCodec on `stream` to reuse (its workspace
// stays between calls); else one is made for the call.
std::vector<std::uint8_t> codec_encode(Backend& backend, Stream& stream, const float* data, codec::ElementType type,
                                       const std::vector<std::uint64_t>& shape, const codec::Settings& settings,
                                       std::optional<double> range = std::nullopt, GpuCodec* gpu = nullptr);

// codec::decode of `stream` (host memory) into `out` (device memory on cuda, which also reads
// the block payloads from `device_stream`, a device copy of the stream; the CPU ignores it).
codec::StreamInfo codec_decode(Backend& backend, Stream& stream, const std::uint8_t* host_stream, std::uint64_t bytes,
                               const std::uint8_t* device_stream, float* out, std::uint64_t out_floats,
                               GpuCodec* gpu = nullptr);

// Device memory a GpuCodec needs to code or decode up to `elements` elements (per component),
// for planning against the device budget.
std::uint64_t codec_device_bytes(std::uint64_t elements);

// codec::value_range of data (device memory on cuda).
double codec_value_range(Backend& backend, Stream& stream, const float* data, std::uint64_t count);

// The GPU side, kept between calls (its workspace grows as needed and stays). code() leaves
// a component's parts in device memory (the work the benchmark times); parts() copies them out.
class GpuCodec {
 public:
  GpuCodec(Backend& backend, Stream& stream);
  ~GpuCodec();
  void code(const float* x, std::uint64_t n, int stride, const codec::detail::Coding& c);
  // Both components of complex values (pairs at x) in one pass of each kernel, reading the
  // values once per pass instead of twice: for pipelines without a bitmap and 8-byte aligned x.
  // The same bytes as code() on each component.
  static bool can_code_pair(const codec::detail::Coding& c, const float* x);
  void code_pair(const float* x, std::uint64_t n, const codec::detail::Coding& c);
  // The parts of the last code() (component 0), or of code_pair's component 0 or 1.
  codec::detail::ComponentParts parts(int component = 0) const;
  // A stream's components (codec::detail::ComponentCoder): as a pair where it can.
  std::vector<codec::detail::ComponentParts> code_all(const float* x, std::uint64_t n, int parts,
                                                      const codec::detail::Coding& c);
  // Throws codec::FormatError when a block payload is inconsistent.
  void decode(const codec::detail::StoredComponent& c, const std::uint8_t* device_stream, std::uint64_t n, int stride,
              const codec::detail::Coding& coding, float* out);
  // Both components of complex values in one pass, written as pairs (the output once, in whole
  // sectors): for pipelines without a bitmap and an 8-byte aligned `out`.
  static bool can_decode_pair(const codec::detail::Coding& coding, const float* out);
  void decode_pair(const codec::detail::StoredComponent& re, const codec::detail::StoredComponent& im,
                   const std::uint8_t* device_stream, std::uint64_t n, const codec::detail::Coding& coding, float* out);
  // A stream's components (codec::detail::ComponentDecoder): as a pair where it can, else one by one.
  void decode_all(const std::vector<codec::detail::StoredComponent>& parts, const std::uint8_t* device_stream,
                  std::uint64_t n, const codec::detail::Coding& coding, float* out);
  double value_range(const float* x, std::uint64_t count);

  struct Impl;  // (kernels/codec/codec_gpu.cu)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qstage::kernels
