#pragma once
// Shared by the CPU twins (.cpp) and the CUDA kernels (.cu): functions marked QSTAGE_HD compile
// for both, so the two backends compute the same values from the same code.
#include <cstdint>

#include "core/hd.hpp"

namespace qstage::kernels {

// MurmurHash3's 64-bit finaliser: a bijection that mixes every input bit into every output bit.
QSTAGE_HD std::uint64_t fmix64(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// SplitMix64's output for `state`: the j-th number of a stream is splitmix64(seed_key + (j+1)*golden).
QSTAGE_HD std::uint64_t splitmix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Index of the lowest set bit of x (x != 0).
QSTAGE_HD int lowest_bit(std::uint64_t x) {
#ifdef __CUDA_ARCH__
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ull;

}  // namespace qstage::kernels
