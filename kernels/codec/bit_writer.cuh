#pragma once
// Writing a coded block's bytes (device code): little-endian words, and a payload put together
// in shared memory copied out to global memory in whole words.
#include <cstdint>

#include "kernels/codec/blocks.cuh"

namespace qstage::kernels::codec_gpu {

__device__ inline void put_u32(std::uint8_t* out, unsigned w) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(w >> (8 * i));
}

// Copies `size` bytes from the shared words `from` (one word more than they hold is read) to
// global memory at any `to`: whole words, each from two shared ones, and the bytes around them.
__device__ inline void store_bytes(std::uint8_t* to, const unsigned* from, int size) {
  const int lane = lane_id();
  const auto* from_bytes = reinterpret_cast<const std::uint8_t*>(from);
  const int head = min(size, static_cast<int>((4 - reinterpret_cast<std::uintptr_t>(to) % 4) % 4));
  const int words = (size - head) / 4, tail = size - head - 4 * words;
  if (lane < head) to[lane] = from_bytes[lane];
  auto* to_words = reinterpret_cast<unsigned*>(to + head);
  const unsigned bytes_from = 0x3210u + 0x1111u * static_cast<unsigned>(head);  // bytes head .. head + 3
  for (int k = lane; k < words; k += 32) to_words[k] = __byte_perm(from[k], from[k + 1], bytes_from);
  if (lane < tail) to[head + 4 * words + lane] = from_bytes[head + 4 * words + lane];
}

}  // namespace qstage::kernels::codec_gpu
