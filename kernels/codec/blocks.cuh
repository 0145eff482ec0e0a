#pragma once
// The GPU codec's shared layout (device code; kernels/codec/codec_encode.cu, codec_decode.cu and
// codec_gpu.cu): one warp per block, each lane holding V = block / 32 consecutive values, staged
// in shared memory; and the coded blocks' buffers in device memory.
#include <cstdint>

#include "codec/block_math.hpp"
#include "kernels/codec/backend_codec.hpp"
#include "kernels/warp.cuh"

namespace qstage::kernels::codec_gpu {

using namespace qstage::codec::detail;  // block_math.hpp: the shared per-value arithmetic
using qstage::kernels::detail::grid_for;
using qstage::kernels::detail::kFull;
using qstage::kernels::detail::lane_id;
using qstage::kernels::detail::warp_exclusive_sum;

constexpr int kWarpsPerCta = 8;

// A block as one warp holds it: values base + j (j < V) of this lane, `m` in the block.
// The values of the block that starts at value `first` of n: 32 V, fewer in the last block.
template <int V>
__device__ int block_values(std::uint64_t n, std::uint64_t first) {
  return static_cast<int>(n - first < std::uint64_t(32 * V) ? n - first : std::uint64_t(32 * V));
}

// A warp's 32 V values staged in shared memory (elements of 4 or 8 bytes) with one element of
// padding after every 128 bytes: lanes reading or writing their V consecutive values then hit
// distinct banks (without it, 8 or 16 lanes share one), and lanes taking consecutive values
// still do.
template <typename T>
__device__ int padded(int i) {
  return i + i / static_cast<int>(128 / sizeof(T));
}
template <typename T, int V>
constexpr int kStaged = 32 * V + 32 * V * static_cast<int>(sizeof(T)) / 128;

// A component's coded blocks in device memory: meta (states, then u16 sizes) and the payload;
// `tiles` and `total` are the look-back's state (code_kernel).
struct BlockBuffers {
  std::uint8_t* meta;
  std::uint8_t* payload;
  unsigned long long* tiles;
  unsigned long long* total;
};

// A component's coded blocks in device memory, to decode: block b's payload starts at
// payload + offsets[b] - before (the components' offsets come from one scan over all their
// blocks; `before`: the payload bytes of the components scanned before this one).
struct ComponentBlocks {
  const std::uint8_t* payload;
  const std::uint8_t* meta;
  const unsigned long long* offsets;
  unsigned long long before;
};


// The launches the host side (kernels/codec/codec_gpu.cu) queues on the codec's stream. Coding
// (kernels/codec/codec_encode.cu): one pass, meta and payload of each block, `ticket` and the
// buffers' tiles and totals zeroed; block: 64, 128 or 256 values.
void code_blocks(cudaStream_t s, const float* v, std::uint64_t n, int stride, const BlockRules& r, std::uint32_t block,
                 std::uint64_t blocks, const BlockBuffers& k, unsigned long long* ticket);
void code_pair_blocks(cudaStream_t s, const float2* v, std::uint64_t n, const BlockRules& r, std::uint32_t block,
                      std::uint64_t blocks, const BlockBuffers& re, const BlockBuffers& im, unsigned long long* ticket);

// Decoding (kernels/codec/codec_decode.cu): the blocks' payload offsets, then their values.

// The blocks of `parts` components end to end, blocks + 1 entries each (the last 0): entry i's
// payload bytes, read from the component's meta (states, then u16 sizes) as the scan goes.
struct PayloadSize {
  const std::uint8_t* meta[2];
  std::uint64_t blocks;
  __device__ unsigned long long operator()(std::uint64_t i) const {
    const std::uint64_t part = i / (blocks + 1), b = i % (blocks + 1);
    if (b == blocks) return 0;
    const std::uint8_t* m = meta[part];
    return static_cast<unsigned long long>(m[blocks + 2 * b] | (m[blocks + 2 * b + 1] << 8));
  }
};
void scan_payload_offsets(cudaStream_t s, const PayloadSize& sizes, std::uint64_t items, unsigned long long* offsets,
                          unsigned long long* look_back);
void decode_blocks(cudaStream_t s, std::uint32_t block, const ComponentBlocks& k, std::uint64_t blocks,
                   std::uint64_t n, float* out, int stride, double step, unsigned* error);
void decode_pair_blocks(cudaStream_t s, std::uint32_t block, const ComponentBlocks& re, const ComponentBlocks& im,
                        std::uint64_t blocks, std::uint64_t n, float2* out, double step, unsigned* error);

}  // namespace qstage::kernels::codec_gpu
