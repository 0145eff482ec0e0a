#pragma once
// Warp-level helpers and grid sizing shared by the CUDA kernels (device code only).
#include <cstdint>

namespace qstage::kernels::detail {

constexpr unsigned kFull = 0xffffffffu;  // every lane of a warp

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x & 31u); }

// The sum of v over the lanes below this one (the whole warp calls).
__device__ inline int warp_exclusive_sum(int v) {
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane_id() >= o) x += y;
  }
  return x - v;
}

// The sum of v over the warp, on every lane (the whole warp calls).
__device__ inline unsigned long long warp_sum(unsigned long long v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// CTAs for `items` items, `per_cta` to a CTA.
inline unsigned grid_for(std::uint64_t items, unsigned per_cta) {
  return static_cast<unsigned>((items + per_cta - 1) / per_cta);
}

}  // namespace qstage::kernels::detail
