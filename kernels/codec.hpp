#pragma once
// The compression codec (io/codec) on a backend. On cuda the data is device memory and the
// blocks are coded and decoded on the GPU (kernels/codec.cu), one warp per block, with the
// bytes of the CPU coder (io/codec/block_coder.cpp, its twin): both decide with the same
// block_math.hpp, in the same order. The host keeps the stream's framing (header, zstd parts).
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "io/codec/codec.hpp"
#include "io/codec/component.hpp"

namespace qstage::kernels {

// codec::encode of `data` (device memory on cuda). `range`: the dataset's value range where
// data is a part of it; else data's own.
std::vector<std::uint8_t> codec_encode(Backend& backend, Stream& stream, const float* data, codec::ElementType type,
                                       const std::vector<std::uint64_t>& shape, const codec::Settings& settings,
                                       std::optional<double> range = std::nullopt);

// codec::decode of `stream` (host memory) into `out` (device memory on cuda, which also reads
// the block payloads from `device_stream`, a device copy of the stream; the CPU ignores it).
codec::StreamInfo codec_decode(Backend& backend, Stream& stream, const std::uint8_t* host_stream, std::uint64_t bytes,
                               const std::uint8_t* device_stream, float* out, std::uint64_t out_floats);

// codec::value_range of data (device memory on cuda).
double codec_value_range(Backend& backend, Stream& stream, const float* data, std::uint64_t count);

namespace detail {
codec::detail::ComponentParts code_component_cuda(Backend& backend, void* cuda_stream, const float* x, std::uint64_t n,
                                                  int stride, const codec::detail::Coding& c);
void decode_component_cuda(Backend& backend, void* cuda_stream, const codec::detail::StoredComponent& c,
                           const std::uint8_t* device_stream, std::uint64_t n, int stride,
                           const codec::detail::Coding& coding, float* out);
double value_range_cuda(Backend& backend, void* cuda_stream, const float* x, std::uint64_t count);
}  // namespace detail

}  // namespace qstage::kernels
