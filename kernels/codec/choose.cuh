#pragma once
// How a warp chooses its block's state and size (device code, kernels/codec/codec_encode.cu): the
// block's values loaded into the lanes, each candidate's size and bounds, and the choice, as
// encode_block makes it on the CPU (codec/block_coder.cpp).
#include <cstdint>

#include "kernels/codec/blocks.cuh"

namespace qstage::kernels::codec_gpu {

// Floats ordered as signed integers (the same order for all but NaN; -0 before +0), so that
// a warp's minimum or maximum is one reduction instruction.
__device__ inline int ordered(float v) {
  const int b = static_cast<int>(float_bits(v));
  return b ^ ((b >> 31) & 0x7fffffff);
}
__device__ inline float unordered(int k) { return bits_float(static_cast<unsigned>(k ^ ((k >> 31) & 0x7fffffff))); }
__device__ inline float warp_min(float v) { return unordered(__reduce_min_sync(kFull, ordered(v))); }
__device__ inline float warp_max(float v) { return unordered(__reduce_max_sync(kFull, ordered(v))); }

// thresholded(x, t) in floats: |x| <= t exactly when |x| <= t_below (NaN stays NaN; a
// threshold of 0 keeps -0, as zeroed does).
__device__ inline float thresholded_f(float x, const BlockRules& r) {
  return fabsf(x) <= r.t_below && (r.t > 0 || float_bits(x) == 0) ? 0.0f : x;
}

// Whether x decodes within its bound as +0 (the zero block's test), in floats: |x| <= max(t, e)
// exactly when |x| <= te_below; where max(t, e) is 0 (e = 0, no threshold above 0) within()
// asks for x's bits, so a -0 is not.
__device__ inline bool zero_fits(float x, const BlockRules& r) {
  return fabsf(x) <= r.te_below && (r.t > 0 || r.e > 0 || float_bits(x) == 0);
}

template <int V>
struct Held {
  float x[V], y[V];  // original and thresholded
  int base, m;
  __device__ bool has(int j) const { return base + j < m; }
};

// Loads go through the warp's shared `stage` (32 V floats): lanes read consecutive values
// (coalesced), then each lane takes its V consecutive ones.
template <int V>
__device__ Held<V> load(const float* values, std::uint64_t first, std::uint64_t n, int stride, const BlockRules& r,
                        float* stage) {
  Held<V> h;
  h.base = lane_id() * V;
  h.m = block_values<V>(n, first);
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane_id();
    stage[padded<float>(i)] = i < h.m ? values[(first + i) * stride] : 0.0f;
  }
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    h.x[j] = stage[padded<float>(h.base + j)];
    h.y[j] = thresholded_f(h.x[j], r);
  }
  __syncwarp();
  return h;
}

// Both components of complex values (pairs at `values`): one coalesced load of the block's pairs,
// then the same values load() gives each component with stride 2.
template <int V>
__device__ void load_pair(const float2* values, std::uint64_t first, std::uint64_t n, const BlockRules& r,
                          float2* stage, Held<V>& re, Held<V>& im) {
  re.base = im.base = lane_id() * V;
  re.m = im.m = block_values<V>(n, first);
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane_id();
    stage[padded<float2>(i)] = i < re.m ? values[first + i] : float2{0.0f, 0.0f};
  }
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    const float2 pair = stage[padded<float2>(re.base + j)];
    re.x[j] = pair.x;
    re.y[j] = thresholded_f(re.x[j], r);
    im.x[j] = pair.y;
    im.y[j] = thresholded_f(im.x[j], r);
  }
  __syncwarp();
}

// A dense candidate around `mid`: its words, kept bits, codes and size (dense_fits checks its
// bounds).
template <int V>
struct Dense {
  unsigned w[V];
  int lead[V];
  int bits, bytes, size, stored;  // stored: this lane's payload bytes after the codes
};

template <int V>
__device__ Dense<V> dense(const Held<V>& h, float mid, const BlockRules& r) {
  Dense<V> d;
  const bool around_zero = float_bits(mid) == 0;
  unsigned largest = 0;
  for (int j = 0; j < V; ++j) {
    const float residual = around_zero ? h.y[j] : h.y[j] - mid;
    d.w[j] = float_bits(residual);
    if (h.has(j)) largest = max(largest, biased_exponent(residual));
  }
  largest = __reduce_max_sync(kFull, largest);
  d.bits = kept_bits(largest, r.q, r.lossless);
  d.bytes = kept_bytes(d.bits);
  const unsigned mask = kept_mask(d.bits);
  for (int j = 0; j < V; ++j) d.w[j] &= mask;
  unsigned previous = __shfl_up_sync(kFull, d.w[V - 1], 1);
  if (lane_id() == 0) previous = 0;
  d.stored = 0;
  for (int j = 0; j < V; ++j) {
    d.lead[j] = shared_leading_bytes(d.w[j], previous, d.bytes);
    previous = d.w[j];
    if (h.has(j)) d.stored += d.bytes - d.lead[j];
  }
  d.size = 5 + (h.m + 3) / 4 + __reduce_add_sync(kFull, d.stored);
  return d;
}

// Whether a dense candidate's decoded values stay within their bounds.
template <int V>
__device__ bool dense_fits(const Held<V>& h, const Dense<V>& d, float mid, const BlockRules& r) {
  bool ok = true;
  for (int j = 0; j < V; ++j)
    if (h.has(j)) ok = ok && within(dense_value(mid, d.w[j]), h.x[j], allowed_error(h.x[j], r.t, r.e));
  return __all_sync(kFull, ok);
}

// The sparse candidate's size (its bounds hold: see choose).
template <int V>
__device__ int sparse_size(const Held<V>& h, int nonzero, const BlockRules& r, int& bits) {
  unsigned largest = 0;
  for (int j = 0; j < V; ++j)
    if (h.has(j)) largest = max(largest, biased_exponent(h.y[j]));
  largest = __reduce_max_sync(kFull, largest);
  bits = kept_bits(largest, r.q, r.lossless);
  return 2 + nonzero + nonzero * kept_bytes(bits);
}

// The quantized candidate: size and bit width, or -1 when a value's q is out of range or a
// decoded value is not within its bound.
template <int V>
__device__ int quantized_size(const Held<V>& h, const BlockRules& r, int& width) {
  bool ok = true;
  unsigned largest = 0;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    long long q = 0;
    if (!quantize(h.y[j], r.step, q)) {
      ok = false;
      continue;
    }
    largest = max(largest, zigzag(q));
    ok = ok && within(dequantize(q, r.step), h.x[j], allowed_error(h.x[j], r.t, r.e));
  }
  width = bit_width(__reduce_max_sync(kFull, largest));
  return __all_sync(kFull, ok) ? quantized_bytes(h.m, width) : -1;
}

// The block's state and size, decided as encode_block does on the CPU.
template <int V>
struct Choice {
  int state, size;
  float mid;  // constant value, or the dense candidate's mid
};

// Checks the CPU makes that cannot fail are left out, and the others are made in floats where
// that decides exactly as the CPU's doubles do (t_below, te_below: block_rules):
//  - zero: every |x| <= max(t, e) (a value above t must be within e of 0, one at or below t
//    within max(t, e));
//  - constant: only when the block's thresholded values span at most 4 max(t, e) (with a
//    margin for rounding), which every block the exact check accepts does: each value is within
//    max(t, e) of the constant, and a thresholded one's zero within 2 max(t, e);
//  - sparse and dense around 0 always hold: a value decodes to its thresholded value y
//    truncated to the block's kept bits, which loses less than 2^q <= e (kept_bits), exactly
//    (the same sign and exponent), and y is x or, at or below t, 0;
//  - dense around the midpoint is checked only where it would be chosen, as the CPU does.
// (warp_min and warp_max put -0 before +0, where the CPU may take either zero as an extreme: the
// midpoint is the same unless every thresholded value is a zero. Such a block is a zero block,
// or, where -0 must be kept (bound 0), all -0 (the same midpoint, -0) or of both zeros, where
// neither the constant nor a dense block around a zero midpoint keeps both signs: both sides
// reject those, whichever zero their midpoint is.)
template <int V>
__device__ Choice<V> choose(const Held<V>& h, const BlockRules& r) {
  bool finite = true, zero_ok = true;
  int nonzero = 0;
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    finite = finite && is_finite(h.x[j]);
    nonzero += stored_in_sparse(h.y[j]);
    zero_ok = zero_ok && zero_fits(h.x[j], r);
    lo = fminf(lo, h.y[j]);
    hi = fmaxf(hi, h.y[j]);
  }
  if (!__all_sync(kFull, finite)) return {kRaw, 4 * h.m, 0.0f};
  if (__all_sync(kFull, zero_ok)) return {kZero, 0, 0.0f};
  nonzero = __reduce_add_sync(kFull, nonzero);
  lo = warp_min(lo);
  hi = warp_max(hi);
  const float mid = midpoint(lo, hi);
  const double spread_allowed = 4.01 * (r.t > r.e ? r.t : r.e);
  if (static_cast<double>(hi) - static_cast<double>(lo) <= spread_allowed) {
    bool constant_ok = true;
    for (int j = 0; j < V; ++j)
      if (h.has(j)) constant_ok = constant_ok && within(mid, h.x[j], allowed_error(h.x[j], r.t, r.e));
    if (__all_sync(kFull, constant_ok)) return {kConstant, 4, mid};
  }
  Choice<V> best{kRaw, 4 * h.m + 1, 0.0f};
  if (r.sparse && nonzero >= 1 && nonzero <= h.m / 2) {
    int bits = 0;
    const int size = sparse_size(h, nonzero, r, bits);
    if (size < best.size) best = {kSparse, size, 0.0f};
  }
  if (r.quantize) {
    int width = 0;
    const int size = quantized_size(h, r, width);
    if (size >= 0 && size < best.size) best = {kQuantized, size, 0.0f};
  }
  // A dense block is never smaller than its mid, kept bits and codes: where a candidate already
  // is, skip both (the CPU evaluates them and reaches the same choice).
  const int dense_floor = 5 + (h.m + 3) / 4;
  if (best.size > dense_floor) {
    const Dense<V> d0 = dense(h, 0.0f, r);
    if (d0.size < best.size) best = {kDense, d0.size, 0.0f};
    if (float_bits(mid) != 0 && best.size > dense_floor) {
      const Dense<V> dm = dense(h, mid, r);
      if (dm.size < best.size && dense_fits(h, dm, mid, r)) best = {kDense, dm.size, mid};
    }
  }
  if (best.state == kRaw) best.size = 4 * h.m;
  return best;
}

}  // namespace qstage::kernels::codec_gpu
