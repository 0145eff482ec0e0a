#pragma once
// Reading a coded block's bytes (device code): little-endian words, and a lane's bits in order.
#include <cstdint>

#include "kernels/codec/blocks.cuh"

namespace qstage::kernels::codec_gpu {

__device__ inline unsigned get_u32(const std::uint8_t* in) {
  unsigned w = 0;
  for (int i = 0; i < 4; ++i) w |= static_cast<unsigned>(in[i]) << (8 * i);
  return w;
}

// Reads a lane's bits in order (little-endian: byte by byte, each from its lowest bit) from
// global memory a word at a time, where each byte would take a load of its own. Every word it
// loads holds at least one bit asked for.
struct BitReader {
  const unsigned* next;
  unsigned long long buffer = 0;  // bits read and not yet taken, the next one lowest
  int held = 0, skip;             // skip: bits of the first word before the first one
  __device__ BitReader(const std::uint8_t* at, int bit = 0)
      : next(reinterpret_cast<const unsigned*>(reinterpret_cast<std::uintptr_t>(at + bit / 8) & ~std::uintptr_t{3})),
        skip(8 * static_cast<int>(reinterpret_cast<std::uintptr_t>(at + bit / 8) & 3) + bit % 8) {}
  // The next n bits (0 to 32).
  __device__ unsigned take(int n) {
    while (held < n) {
      buffer |= (static_cast<unsigned long long>(*next++) >> skip) << held;
      held += 32 - skip;
      skip = 0;
    }
    const auto bits = static_cast<unsigned>(buffer & ((1ull << n) - 1));
    buffer >>= n;
    held -= n;
    return bits;
  }
};

}  // namespace qstage::kernels::codec_gpu
