// The codec's blocks on the GPU: one warp per block, each lane holding V = block / 32
// consecutive values. Coding takes two passes over the data: the first chooses each block's
// state and size, a scan turns sizes into offsets, the second writes each block's payload at its
// offset as the first chose it (no atomics whose order matters: the quantized state ORs bits
// together in shared memory, which commutes), so the bytes are those of the CPU twin,
// io/codec/block_coder.cpp, on every run. Decoding reads the offsets the same way; a dense block's bytes that repeat the previous
// value's come from a scan for the last value that stored them.
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/transform_iterator.h>

#include <fmt/format.h>

#include "io/codec/block_math.hpp"
#include "kernels/codec.hpp"
#include "kernels/cuda_check.hpp"

namespace qstage::kernels {
namespace {

using namespace qstage::codec::detail;  // block_math.hpp: the shared per-value arithmetic

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarpsPerCta = 8;

__device__ int lane_id() { return static_cast<int>(threadIdx.x & 31u); }

__device__ int warp_exclusive_sum(int v) {
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane_id() >= o) x += y;
  }
  return x - v;
}
__device__ int warp_exclusive_max(int v) {  // of the lanes before this one; -1 for lane 0
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(kFull, x, o);
    if (lane_id() >= o) x = max(x, y);
  }
  const int before = __shfl_up_sync(kFull, x, 1);
  return lane_id() == 0 ? -1 : before;
}
__device__ float warp_min(float v) {
  for (int o = 16; o; o >>= 1) v = fminf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// A block as one warp holds it: values base + j (j < V) of this lane, `m` in the block.
// The values of the block that starts at value `first` of n: 32 V, fewer in the last block.
template <int V>
__device__ int block_values(std::uint64_t n, std::uint64_t first) {
  return static_cast<int>(n - first < std::uint64_t(32 * V) ? n - first : std::uint64_t(32 * V));
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
    stage[i] = i < h.m ? values[(first + i) * stride] : 0.0f;
  }
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    h.x[j] = stage[h.base + j];
    h.y[j] = thresholded(h.x[j], r.t);
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
    stage[i] = i < re.m ? values[first + i] : float2{0.0f, 0.0f};
  }
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    re.x[j] = stage[re.base + j].x;
    re.y[j] = thresholded(re.x[j], r.t);
    im.x[j] = stage[im.base + j].y;
    im.y[j] = thresholded(im.x[j], r.t);
  }
  __syncwarp();
}

// A dense candidate around `mid`: its words, kept bits, codes, and whether its decoded values
// stay within their bounds; size -1 when they do not.
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
  bool ok = true;
  d.stored = 0;
  for (int j = 0; j < V; ++j) {
    d.lead[j] = shared_leading_bytes(d.w[j], previous, d.bytes);
    previous = d.w[j];
    if (!h.has(j)) continue;
    d.stored += d.bytes - d.lead[j];
    ok = ok && within(dense_value(mid, d.w[j]), h.x[j], allowed_error(h.x[j], r.t, r.e));
  }
  ok = __all_sync(kFull, ok);
  const int total = __reduce_add_sync(kFull, d.stored);
  d.size = ok ? 5 + (h.m + 3) / 4 + total : -1;
  return d;
}

// The sparse candidate: size, or -1 when not allowed or not within the bounds.
template <int V>
__device__ int sparse_size(const Held<V>& h, int nonzero, const BlockRules& r, int& bits) {
  unsigned largest = 0;
  for (int j = 0; j < V; ++j)
    if (h.has(j)) largest = max(largest, biased_exponent(h.y[j]));
  largest = __reduce_max_sync(kFull, largest);
  bits = kept_bits(largest, r.q, r.lossless);
  const unsigned mask = kept_mask(bits);
  bool ok = true;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    const bool nz = (float_bits(h.y[j]) & 0x7fffffffu) != 0;
    const float decoded = nz ? bits_float(float_bits(h.y[j]) & mask) : 0.0f;
    ok = ok && within(decoded, h.x[j], allowed_error(h.x[j], r.t, r.e));
  }
  return __all_sync(kFull, ok) ? 2 + nonzero + nonzero * kept_bytes(bits) : -1;
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

template <int V>
__device__ Choice<V> choose(const Held<V>& h, const BlockRules& r) {
  bool finite = true, zero_ok = true;
  int nonzero = 0;
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    finite = finite && is_finite(h.x[j]);
    nonzero += (float_bits(h.y[j]) & 0x7fffffffu) != 0;
    zero_ok = zero_ok && within(0.0f, h.x[j], allowed_error(h.x[j], r.t, r.e));
    lo = fminf(lo, h.y[j]);
    hi = fmaxf(hi, h.y[j]);
  }
  if (!__all_sync(kFull, finite)) return {kRaw, 4 * h.m, 0.0f};
  if (__all_sync(kFull, zero_ok)) return {kZero, 0, 0.0f};
  nonzero = __reduce_add_sync(kFull, nonzero);
  const float mid = midpoint(warp_min(lo), warp_max(hi));
  bool constant_ok = true;
  for (int j = 0; j < V; ++j)
    if (h.has(j)) constant_ok = constant_ok && within(mid, h.x[j], allowed_error(h.x[j], r.t, r.e));
  if (__all_sync(kFull, constant_ok)) return {kConstant, 4, mid};
  Choice<V> best{kRaw, 4 * h.m + 1, 0.0f};
  if (r.sparse && nonzero >= 1 && nonzero <= h.m / 2) {
    int bits = 0;
    const int size = sparse_size(h, nonzero, r, bits);
    if (size >= 0 && size < best.size) best = {kSparse, size, 0.0f};
  }
  if (r.quantize) {
    int width = 0;
    const int size = quantized_size(h, r, width);
    if (size >= 0 && size < best.size) best = {kQuantized, size, 0.0f};
  }
  // A dense block is never smaller than its mid, kept bits and codes: where a candidate already
  // is, skip both (the CPU evaluates them and reaches the same choice).
  if (best.size > 5 + (h.m + 3) / 4) {
    const Dense<V> d0 = dense(h, 0.0f, r);
    if (d0.size >= 0 && d0.size < best.size) best = {kDense, d0.size, 0.0f};
    if (float_bits(mid) != 0 && best.size > 5 + (h.m + 3) / 4) {
      const Dense<V> dm = dense(h, mid, r);
      if (dm.size >= 0 && dm.size < best.size) best = {kDense, dm.size, mid};
    }
  }
  if (best.state == kRaw) best.size = 4 * h.m;
  return best;
}

__device__ void put_u32(std::uint8_t* out, unsigned w) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(w >> (8 * i));
}
__device__ unsigned get_u32(const std::uint8_t* in) {
  unsigned w = 0;
  for (int i = 0; i < 4; ++i) w |= static_cast<unsigned>(in[i]) << (8 * i);
  return w;
}

// The blocks' pieces in device memory: meta (states, then u16 sizes), sizes to scan, the chosen
// mids, offsets and the payload.
struct BlockBuffers {
  std::uint8_t* meta;
  unsigned long long *sizes, *offsets;
  float* mids;
  std::uint8_t* payload;
};

template <int V>
__device__ void record_choice(const Choice<V>& c, std::uint64_t b, std::uint64_t blocks, std::uint8_t* meta,
                              unsigned long long* sizes, float* mids) {
  if (lane_id() != 0) return;
  mids[b] = c.mid;
  meta[b] = static_cast<std::uint8_t>(c.state);
  meta[blocks + 2 * b] = static_cast<std::uint8_t>(c.size);
  meta[blocks + 2 * b + 1] = static_cast<std::uint8_t>(c.size >> 8);
  sizes[b] = static_cast<unsigned long long>(c.size);
}

// Pass 1: each block's state and size (meta: states, then u16 sizes; sizes also as u64 to scan).
template <int V>
__global__ void choose_kernel(const float* values, std::uint64_t n, int stride, BlockRules r, std::uint64_t blocks,
                              std::uint8_t* meta, unsigned long long* sizes, float* mids) {
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  __shared__ float stage[kWarpsPerCta][32 * V];
  const Held<V> h = load<V>(values, b * (32 * V), n, stride, r, stage[threadIdx.x / 32]);
  record_choice(choose(h, r), b, blocks, meta, sizes, mids);
}

// Pass 1 for both components of complex values, loaded once as pairs.
template <int V>
__global__ void choose_pair_kernel(const float2* values, std::uint64_t n, BlockRules r, std::uint64_t blocks,
                                   BlockBuffers re, BlockBuffers im) {
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  __shared__ float2 stage[kWarpsPerCta][32 * V];
  Held<V> hr, hi;
  load_pair<V>(values, b * (32 * V), n, r, stage[threadIdx.x / 32], hr, hi);
  record_choice(choose(hr, r), b, blocks, re.meta, re.sizes, re.mids);
  record_choice(choose(hi, r), b, blocks, im.meta, im.sizes, im.mids);
}

// A block's payload at `out`, as pass 1 chose it (`words`: the warp's shared scratch for bits).
template <int V>
__device__ void write_block(const Held<V>& h, const Choice<V>& c, const BlockRules& r, std::uint8_t* out,
                            unsigned* words) {
  const int lane = lane_id();
  switch (c.state) {
    case kQuantized: {  // bits gathered in shared memory (OR commutes: the same bytes on every run)
      int width = 0;
      quantized_size(h, r, width);
      const int bytes = (h.m * width + 7) / 8;
      for (int k = lane; k < (bytes + 3) / 4; k += 32) words[k] = 0;
      __syncwarp();
      for (int j = 0; j < V; ++j) {
        long long q = 0;
        if (!h.has(j) || !quantize(h.y[j], r.step, q)) continue;
        const unsigned z = zigzag(q);
        const int bit = (h.base + j) * width, shift = bit % 32;
        if (width == 0 || z == 0) continue;
        atomicOr(&words[bit / 32], z << shift);
        if (shift + width > 32) atomicOr(&words[bit / 32 + 1], z >> (32 - shift));
      }
      __syncwarp();
      if (lane == 0) out[0] = static_cast<std::uint8_t>(width);
      for (int k = lane; k < bytes; k += 32) out[1 + k] = static_cast<std::uint8_t>(words[k / 4] >> (8 * (k % 4)));
      return;
    }
    case kZero: return;
    case kConstant:
      if (lane == 0) put_u32(out, float_bits(c.mid));
      return;
    case kRaw:
      for (int j = 0; j < V; ++j)
        if (h.has(j)) put_u32(out + 4 * (h.base + j), float_bits(h.x[j]));
      return;
    case kSparse: {
      int nonzero = 0;
      for (int j = 0; j < V; ++j) nonzero += h.has(j) && (float_bits(h.y[j]) & 0x7fffffffu) != 0;
      const int count = __reduce_add_sync(kFull, nonzero);
      int bits = 0;
      sparse_size(h, count, r, bits);
      const unsigned mask = kept_mask(bits);
      const int bytes = kept_bytes(bits);
      int rank = warp_exclusive_sum(nonzero);
      if (lane == 0) {
        out[0] = static_cast<std::uint8_t>(count);
        out[1] = static_cast<std::uint8_t>(bits);
      }
      for (int j = 0; j < V; ++j) {
        if (!h.has(j) || (float_bits(h.y[j]) & 0x7fffffffu) == 0) continue;
        out[2 + rank] = static_cast<std::uint8_t>(h.base + j);
        const unsigned w = float_bits(h.y[j]) & mask;
        for (int k = 0; k < bytes; ++k) out[2 + count + rank * bytes + k] = word_byte(w, k);
        ++rank;
      }
      return;
    }
    case kDense: {
      const Dense<V> d = dense(h, c.mid, r);
      if (lane == 0) {
        put_u32(out, float_bits(c.mid));
        out[4] = static_cast<std::uint8_t>(d.bits);
      }
      // Codes: 2 bits per value, value i at bits 2 (i mod 4) of byte i / 4.
      unsigned codes = 0;  // this lane's 2V bits
      for (int j = 0; j < V; ++j)
        if (h.has(j)) codes |= static_cast<unsigned>(d.lead[j]) << (2 * j);
      const int code_bytes = (h.m + 3) / 4;
      if (V == 2) {  // two lanes share a byte
        const unsigned odd = __shfl_down_sync(kFull, codes, 1);
        if ((lane & 1) == 0 && lane / 2 < code_bytes) out[5 + lane / 2] = static_cast<std::uint8_t>(codes | (odd << 4));
      } else {
        for (int k = 0; k < V / 4; ++k)
          if (lane * (V / 4) + k < code_bytes) out[5 + lane * (V / 4) + k] = static_cast<std::uint8_t>(codes >> (8 * k));
      }
      int at = 5 + code_bytes + warp_exclusive_sum(d.stored);
      for (int j = 0; j < V; ++j) {
        if (!h.has(j)) continue;
        for (int k = d.lead[j]; k < d.bytes; ++k) out[at++] = word_byte(d.w[j], k);
      }
      return;
    }
    default: return;
  }
}

// Pass 2: each block's payload at its offset, as pass 1 chose it.
template <int V>
__global__ void write_kernel(const float* values, std::uint64_t n, int stride, BlockRules r, std::uint64_t blocks,
                             const std::uint8_t* meta, const float* mids, const unsigned long long* offsets,
                             std::uint8_t* payload) {
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  __shared__ float stage[kWarpsPerCta][32 * V];
  __shared__ unsigned packed[kWarpsPerCta][(31 * 32 * V + 31) / 32 + 1];
  const Held<V> h = load<V>(values, b * (32 * V), n, stride, r, stage[threadIdx.x / 32]);
  write_block(h, Choice<V>{meta[b], 0, mids[b]}, r, payload + offsets[b], packed[threadIdx.x / 32]);
}

// Pass 2 for both components of complex values, loaded once as pairs.
template <int V>
__global__ void write_pair_kernel(const float2* values, std::uint64_t n, BlockRules r, std::uint64_t blocks,
                                  BlockBuffers re, BlockBuffers im) {
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (b >= blocks) return;
  __shared__ float2 stage[kWarpsPerCta][32 * V];
  __shared__ unsigned packed[kWarpsPerCta][(31 * 32 * V + 31) / 32 + 1];
  Held<V> hr, hi;
  load_pair<V>(values, b * (32 * V), n, r, stage[threadIdx.x / 32], hr, hi);
  unsigned* words = packed[threadIdx.x / 32];
  write_block(hr, Choice<V>{re.meta[b], 0, re.mids[b]}, r, re.payload + re.offsets[b], words);
  __syncwarp();
  write_block(hi, Choice<V>{im.meta[b], 0, im.mids[b]}, r, im.payload + im.offsets[b], words);
}

// Decoding: one warp per block. decode_block leaves block b's values in each lane's v (lane l
// has values lV .. lV + V - 1) and returns true (on every lane) if its payload is inconsistent;
// the block's values are then unspecified but in bounds. `offset_of` and `lead_of` are the
// warp's shared scratch (32 V entries each).
template <int V>
__device__ bool decode_block(const std::uint8_t* payload, const std::uint8_t* meta, const unsigned long long* offsets,
                             std::uint64_t blocks, std::uint64_t b, int m, double step, float (&v)[V],
                             unsigned short* offset_of, unsigned char* lead_of) {
  const int lane = lane_id(), base = lane * V;
  const std::uint8_t* in = payload + offsets[b];
  const int size = meta[blocks + 2 * b] | (meta[blocks + 2 * b + 1] << 8);
  bool bad = false;
  switch (meta[b]) {
    case kZero:
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
      break;
    case kConstant: {
      const float c = bits_float(get_u32(in));
      for (int j = 0; j < V; ++j) v[j] = c;
      break;
    }
    case kRaw:
      for (int j = 0; j < V; ++j) v[j] = base + j < m ? bits_float(get_u32(in + 4 * (base + j))) : 0.0f;
      break;
    case kQuantized: {
      const int width = size >= 1 ? in[0] : 0;
      bad = size < 1 || width > 31 || size != quantized_bytes(m, width);
      for (int j = 0; j < V && !bad; ++j) {
        v[j] = 0.0f;
        if (base + j >= m) continue;
        const int bit = (base + j) * width;
        unsigned long long word = 0;
        for (int k = 0; k < 5 && 1 + bit / 8 + k < size; ++k)
          word |= static_cast<unsigned long long>(in[1 + bit / 8 + k]) << (8 * k);
        const auto z = static_cast<unsigned>((word >> (bit % 8)) & ((1ull << width) - 1));
        v[j] = dequantize(unzigzag(z), step);
      }
      break;
    }
    case kSparse: {
      const int count = in[0], bits = in[1];
      const int bytes = kept_bytes(bits);
      bad = count < 1 || count > m || bits < 9 || bits > 32 || size != 2 + count + count * bytes;
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
      if (bad) break;
      // Indices must increase within the block; then each lane finds its own positions among them.
      for (int s = lane; s < count; s += 32) {
        const int index = in[2 + s];
        if (index >= m || (s > 0 && in[1 + s] >= index)) bad = true;
      }
      bad = __any_sync(kFull, bad);
      if (bad) break;
      // Binary search each own position among the sorted indices.
      for (int j = 0; j < V; ++j) {
        const int i = base + j;
        int lo = 0, hi = count;
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (in[2 + mid] < i) lo = mid + 1; else hi = mid;
        }
        if (lo < count && in[2 + lo] == i) {
          unsigned w = 0;
          for (int k = 0; k < bytes; ++k) w |= static_cast<unsigned>(in[2 + count + lo * bytes + k]) << (24 - 8 * k);
          v[j] = bits_float(w);
        }
      }
      break;
    }
    case kDense: {
      const int code_bytes = (m + 3) / 4;
      const float mid = bits_float(get_u32(in));
      const int bits = in[4];
      const int bytes = kept_bytes(bits);
      bad = bits < 9 || bits > 32 || size < 5 + code_bytes;
      bad = __any_sync(kFull, bad);
      if (bad) break;
      int lead[V], stored = 0;
      for (int j = 0; j < V; ++j) {
        const int i = base + j;
        lead[j] = i < m ? (in[5 + i / 4] >> (2 * (i % 4))) & 3 : 0;
        if (lead[j] > bytes) bad = true;
        stored += i < m ? bytes - lead[j] : 0;
      }
      int at = 5 + code_bytes + warp_exclusive_sum(stored);
      for (int j = 0; j < V; ++j) {
        offset_of[base + j] = static_cast<unsigned short>(at);
        lead_of[base + j] = static_cast<unsigned char>(lead[j]);
        at += base + j < m ? bytes - lead[j] : 0;
      }
      const int end = __shfl_sync(kFull, at, 31);
      bad = __any_sync(kFull, bad || end != size);
      if (bad) break;
      __syncwarp();
      unsigned w[V] = {};
      for (int p = 0; p < bytes; ++p) {
        // The last value at or before each one that stored byte p itself (lead <= p).
        int last[V], running = -1;
        for (int j = 0; j < V; ++j) {
          if (base + j < m && lead[j] <= p) running = base + j;
          last[j] = running;
        }
        const int before = warp_exclusive_max(running);
        for (int j = 0; j < V; ++j) {
          const int src = last[j] >= 0 ? last[j] : before;
          const unsigned byte = src < 0 ? 0u : in[offset_of[src] + (p - lead_of[src])];
          w[j] |= byte << (24 - 8 * p);
        }
      }
      for (int j = 0; j < V; ++j) v[j] = dense_value(mid, w[j]);
      break;
    }
    default:
      bad = true;
  }
  return __any_sync(kFull, bad);
}

// Decodes one component into out[0], out[stride], ...; an inconsistent payload sets *error (the
// host then refuses the stream).
template <int V>
__global__ void decode_kernel(const std::uint8_t* payload, const std::uint8_t* meta, const unsigned long long* offsets,
                              std::uint64_t blocks, std::uint64_t n, float* out, int stride, double step,
                              unsigned* error) {
  __shared__ unsigned short offset_of[kWarpsPerCta][32 * V];
  __shared__ unsigned char lead_of[kWarpsPerCta][32 * V];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (b >= blocks) return;
  const int lane = lane_id(), base = lane * V;
  const std::uint64_t first = b * (32 * V);
  const int m = block_values<V>(n, first);
  float v[V];
  if (decode_block<V>(payload, meta, offsets, blocks, b, m, step, v, offset_of[warp], lead_of[warp])) {
    if (lane == 0) atomicOr(error, 1u);
    return;
  }
  // Stores go through shared memory too, so that lanes write consecutive values.
  __shared__ float stage[kWarpsPerCta][32 * V];
  for (int j = 0; j < V; ++j) stage[warp][base + j] = v[j];
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane;
    if (i < m) out[(first + i) * stride] = stage[warp][i];
  }
}

// The two components of complex values at once: a warp decodes block b of the real and of the
// imaginary parts (their blocks cover the same elements) and writes the pairs as float2, so the
// output is written once, in whole sectors, instead of half of every sector twice.
struct ComponentBlocks {
  const std::uint8_t* payload;
  const std::uint8_t* meta;
  const unsigned long long* offsets;
};

template <int V>
__global__ void decode_pair_kernel(ComponentBlocks re, ComponentBlocks im, std::uint64_t blocks, std::uint64_t n,
                                   float2* out, double step, unsigned* error) {
  __shared__ unsigned short offset_of[kWarpsPerCta][32 * V];
  __shared__ unsigned char lead_of[kWarpsPerCta][32 * V];
  __shared__ float2 stage[kWarpsPerCta][32 * V];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const std::uint64_t b = std::uint64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (b >= blocks) return;
  const int lane = lane_id(), base = lane * V;
  const std::uint64_t first = b * (32 * V);
  const int m = block_values<V>(n, first);
  float v[V];
  bool bad = decode_block<V>(re.payload, re.meta, re.offsets, blocks, b, m, step, v, offset_of[warp], lead_of[warp]);
  for (int j = 0; j < V; ++j) stage[warp][base + j].x = v[j];
  __syncwarp();
  bad = decode_block<V>(im.payload, im.meta, im.offsets, blocks, b, m, step, v, offset_of[warp], lead_of[warp]) || bad;
  if (bad) {
    if (lane == 0) atomicOr(error, 1u);
    return;
  }
  for (int j = 0; j < V; ++j) stage[warp][base + j].y = v[j];
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane;
    if (i < m) out[first + i] = stage[warp][i];
  }
}

// group, group2l: bitmap bytes (8 values each) and their popcounts.
__global__ void bitmap_kernel(const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap,
                              unsigned long long* counts) {
  const std::uint64_t j = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= (n + 7) / 8) return;
  unsigned byte = 0;
  for (int k = 0; k < 8; ++k) {
    const std::uint64_t i = 8 * j + k;
    if (i < n && significant(x[i * stride], t)) byte |= 1u << k;
  }
  bitmap[j] = static_cast<std::uint8_t>(byte);
  counts[j] = static_cast<unsigned long long>(__popc(byte));
}

__global__ void compact_kernel(const float* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                               const unsigned long long* ranks, float* kept) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned byte = bitmap[i / 8], bit = static_cast<unsigned>(i % 8);
  if ((byte >> bit) & 1u) kept[ranks[i / 8] + __popc(byte & ((1u << bit) - 1u))] = x[i * stride];
}

__global__ void expand_kernel(const float* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                              const unsigned long long* ranks, float* out) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned byte = bitmap[i / 8], bit = static_cast<unsigned>(i % 8);
  out[i * stride] = (byte >> bit) & 1u ? kept[ranks[i / 8] + __popc(byte & ((1u << bit) - 1u))] : 0.0f;
}

struct FiniteOr {
  float fallback;
  __device__ float operator()(float x) const { return is_finite(x) ? x : fallback; }
};
struct Min {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__global__ void sizes_kernel(const std::uint8_t* meta, std::uint64_t blocks, unsigned long long* sizes) {
  const std::uint64_t b = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < blocks) sizes[b] = static_cast<unsigned long long>(meta[blocks + 2 * b] | (meta[blocks + 2 * b + 1] << 8));
  if (b == blocks) sizes[b] = 0;
}

// A two-level bitmap's first level from its second level and its nonzero bytes: byte j is the
// rank(j)-th nonzero byte where bit j of the second level is set, else 0.
__global__ void level1_kernel(const std::uint8_t* level2, const unsigned long long* ranks2, const std::uint8_t* nonzero,
                              std::uint64_t level1_bytes, std::uint8_t* bitmap) {
  const std::uint64_t j = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= level1_bytes) return;
  const unsigned byte = level2[j / 8], bit = static_cast<unsigned>(j % 8);
  bitmap[j] = (byte >> bit) & 1u ? nonzero[ranks2[j / 8] + __popc(byte & ((1u << bit) - 1u))] : std::uint8_t{0};
}

__global__ void popcount_kernel(const std::uint8_t* bitmap, std::uint64_t bytes, unsigned long long* counts) {
  const std::uint64_t j = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < bytes) counts[j] = static_cast<unsigned long long>(__popc(bitmap[j]));
  if (j == bytes) counts[j] = 0;
}

unsigned grid_for(std::uint64_t items, unsigned per_cta) {
  return static_cast<unsigned>((items + per_cta - 1) / per_cta);
}

std::uint64_t round_up(std::uint64_t b) { return (b + 255) / 256 * 256; }

std::uint64_t scan_temp_bytes(std::uint64_t items) {
  size_t bytes = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<unsigned long long*>(nullptr),
                                                  static_cast<unsigned long long*>(nullptr),
                                                  static_cast<std::int64_t>(items)));
  return bytes;
}

template <int V>
void launch_blocks(cudaStream_t s, const float* v, std::uint64_t n, int stride, const BlockRules& r,
                   std::uint64_t blocks, const BlockBuffers& k, bool write) {
  const unsigned grid = grid_for(blocks, kWarpsPerCta);
  if (!write) choose_kernel<V><<<grid, 32 * kWarpsPerCta, 0, s>>>(v, n, stride, r, blocks, k.meta, k.sizes, k.mids);
  else write_kernel<V><<<grid, 32 * kWarpsPerCta, 0, s>>>(v, n, stride, r, blocks, k.meta, k.mids, k.offsets, k.payload);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

template <int V>
void launch_pair_blocks(cudaStream_t s, const float2* v, std::uint64_t n, const BlockRules& r, std::uint64_t blocks,
                        const BlockBuffers& re, const BlockBuffers& im, bool write) {
  const unsigned grid = grid_for(blocks, kWarpsPerCta);
  if (!write) choose_pair_kernel<V><<<grid, 32 * kWarpsPerCta, 0, s>>>(v, n, r, blocks, re, im);
  else write_pair_kernel<V><<<grid, 32 * kWarpsPerCta, 0, s>>>(v, n, r, blocks, re, im);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void code_pair_blocks(cudaStream_t s, const float2* v, std::uint64_t n, const BlockRules& r, std::uint32_t block,
                      std::uint64_t blocks, const BlockBuffers& re, const BlockBuffers& im, bool write) {
  switch (block) {
    case 64: return launch_pair_blocks<2>(s, v, n, r, blocks, re, im, write);
    case 128: return launch_pair_blocks<4>(s, v, n, r, blocks, re, im, write);
    default: return launch_pair_blocks<8>(s, v, n, r, blocks, re, im, write);
  }
}

void code_blocks(cudaStream_t s, const float* v, std::uint64_t n, int stride, const BlockRules& r, std::uint32_t block,
                 std::uint64_t blocks, const BlockBuffers& k, bool write) {
  switch (block) {
    case 64: return launch_blocks<2>(s, v, n, stride, r, blocks, k, write);
    case 128: return launch_blocks<4>(s, v, n, stride, r, blocks, k, write);
    default: return launch_blocks<8>(s, v, n, stride, r, blocks, k, write);
  }
}

void decode_pair_blocks(cudaStream_t s, std::uint32_t block, const ComponentBlocks& re, const ComponentBlocks& im,
                        std::uint64_t blocks, std::uint64_t n, float2* out, double step, unsigned* error) {
  const unsigned grid = grid_for(blocks, kWarpsPerCta);
  switch (block) {
    case 64: decode_pair_kernel<2><<<grid, 32 * kWarpsPerCta, 0, s>>>(re, im, blocks, n, out, step, error); break;
    case 128: decode_pair_kernel<4><<<grid, 32 * kWarpsPerCta, 0, s>>>(re, im, blocks, n, out, step, error); break;
    default: decode_pair_kernel<8><<<grid, 32 * kWarpsPerCta, 0, s>>>(re, im, blocks, n, out, step, error); break;
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void decode_blocks(cudaStream_t s, std::uint32_t block, const std::uint8_t* payload, const std::uint8_t* meta,
                   const unsigned long long* offsets, std::uint64_t blocks, std::uint64_t n, float* out, int stride,
                   double step, unsigned* error) {
  const unsigned grid = grid_for(blocks, kWarpsPerCta);
  switch (block) {
    case 64: decode_kernel<2><<<grid, 32 * kWarpsPerCta, 0, s>>>(payload, meta, offsets, blocks, n, out, stride, step, error); break;
    case 128: decode_kernel<4><<<grid, 32 * kWarpsPerCta, 0, s>>>(payload, meta, offsets, blocks, n, out, stride, step, error); break;
    default: decode_kernel<8><<<grid, 32 * kWarpsPerCta, 0, s>>>(payload, meta, offsets, blocks, n, out, stride, step, error); break;
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

// Device memory from the backend (charged to its budget), kept between calls and grown when a
// call needs more; each call carves it into aligned pieces.
struct GpuCodec::Impl {
  Backend& backend;
  Stream& stream;
  Buffer workspace;
  Buffer pinned;  // small results read back by the host
  std::uint64_t used = 0;
  // The last code()'s parts (code_pair: the two components'), in the workspace.
  struct Coded {
    std::uint8_t *meta = nullptr, *payload = nullptr, *bitmap = nullptr;
    std::uint64_t blocks = 0, coded = 0, payload_bytes = 0, bitmap_bytes = 0;
  } last[2];

  Impl(Backend& b, Stream& s) : backend(b), stream(s), pinned(b.alloc_host(64, "codec: results")) {}
  cudaStream_t cuda() const { return static_cast<cudaStream_t>(stream.native()); }
  void reserve(std::uint64_t bytes) {
    used = 0;
    if (workspace.size() >= bytes) return;
    workspace = Buffer();
    workspace = backend.alloc_device(bytes, "codec workspace");
  }
  template <typename T>
  T* take(std::uint64_t count) {
    T* p = reinterpret_cast<T*>(static_cast<char*>(workspace.data()) + used);
    used += round_up(count * sizeof(T));
    return p;
  }
  unsigned long long read_back(const unsigned long long* device_value) {
    auto* host = static_cast<unsigned long long*>(pinned.data());
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, device_value, sizeof *host, cudaMemcpyDeviceToHost, cuda()));
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(cuda()));
    return *host;
  }
};

GpuCodec::GpuCodec(Backend& backend, Stream& stream) : impl_(std::make_unique<Impl>(backend, stream)) {}
GpuCodec::~GpuCodec() = default;

void GpuCodec::code(const float* x, std::uint64_t n, int stride, const codec::detail::Coding& c) {
  Impl& w = *impl_;
  Impl::Coded& out = w.last[0];
  const cudaStream_t s = w.cuda();
  const bool grouped = codec::detail::groups(c.pipeline);
  const std::uint64_t bitmap_bytes = (n + 7) / 8, max_blocks = codec::detail::div_up(n, c.block);
  const std::uint64_t temp = std::max(scan_temp_bytes(max_blocks + 1), scan_temp_bytes(bitmap_bytes + 1));
  // Upper bounds: at most n values are coded, and a block's payload is at most 4 bytes a value.
  w.reserve(round_up(3 * max_blocks) + 2 * round_up(8 * (max_blocks + 1)) + round_up(4 * max_blocks) + round_up(4 * n) + round_up(temp) +
            (grouped ? round_up(4 * n) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  out.meta = w.take<std::uint8_t>(3 * max_blocks);
  auto* sizes = w.take<unsigned long long>(max_blocks + 1);
  auto* offsets = w.take<unsigned long long>(max_blocks + 1);
  auto* mids = w.take<float>(max_blocks);
  out.payload = w.take<std::uint8_t>(4 * n);
  void* temp_storage = w.take<std::uint8_t>(temp);
  const float* values = x;
  int value_stride = stride;
  out.coded = n;
  out.bitmap_bytes = grouped ? bitmap_bytes : 0;
  if (grouped) {
    out.bitmap = w.take<std::uint8_t>(bitmap_bytes);
    auto* counts = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* ranks = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* kept = w.take<float>(n);
    bitmap_kernel<<<grid_for(bitmap_bytes + 1, 256), 256, 0, s>>>(x, n, stride, c.t, out.bitmap, counts);
    QSTAGE_CUDA_CHECK_LAUNCH();
    size_t tb = temp;
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(bitmap_bytes + 1), s));
    if (n) {
      compact_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n, stride, out.bitmap, ranks, kept);
      QSTAGE_CUDA_CHECK_LAUNCH();
    }
    out.coded = w.read_back(ranks + bitmap_bytes);
    values = kept;
    value_stride = 1;
  }
  const BlockRules rules = codec::detail::rules_for(c);
  out.blocks = codec::detail::div_up(out.coded, c.block);
  const BlockBuffers k{out.meta, sizes, offsets, mids, out.payload};
  if (out.blocks) code_blocks(s, values, out.coded, value_stride, rules, c.block, out.blocks, k, false);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(sizes + out.blocks, 0, sizeof(unsigned long long), s));
  size_t tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, sizes, offsets, static_cast<std::int64_t>(out.blocks + 1), s));
  if (out.blocks) code_blocks(s, values, out.coded, value_stride, rules, c.block, out.blocks, k, true);
  out.payload_bytes = w.read_back(offsets + out.blocks);
}

codec::detail::ComponentParts GpuCodec::parts(int component) const {
  const Impl& w = *impl_;
  const Impl::Coded& c = w.last[component];
  codec::detail::ComponentParts p;
  p.coded = c.coded;
  p.bitmap.resize(c.bitmap_bytes);
  p.meta.resize(3 * c.blocks);
  p.payload.resize(c.payload_bytes);
  // (code() laid the meta out for the blocks it coded: their states, then their sizes.)
  const cudaStream_t s = w.cuda();
  if (c.bitmap_bytes) QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.bitmap.data(), c.bitmap, c.bitmap_bytes, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.meta.data(), c.meta, 3 * c.blocks, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.payload.data(), c.payload, c.payload_bytes, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  return p;
}

bool GpuCodec::can_code_pair(const codec::detail::Coding& coding, const float* x) {
  return !codec::detail::groups(coding.pipeline) && reinterpret_cast<std::uintptr_t>(x) % alignof(float2) == 0;
}

void GpuCodec::code_pair(const float* x, std::uint64_t n, const codec::detail::Coding& c) {
  if (!can_code_pair(c, x)) throw std::logic_error("GpuCodec::code_pair: a bitmap pipeline or unaligned values");
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  const std::uint64_t blocks = codec::detail::div_up(n, c.block), temp = scan_temp_bytes(blocks + 1);
  const std::uint64_t per_part = round_up(3 * blocks) + 2 * round_up(8 * (blocks + 1)) + round_up(4 * blocks) + round_up(4 * n);
  w.reserve(2 * per_part + round_up(temp) + round_up(16));
  BlockBuffers k[2];
  for (int part = 0; part < 2; ++part) {
    Impl::Coded& out = w.last[part];
    out = Impl::Coded{};
    out.meta = w.take<std::uint8_t>(3 * blocks);
    k[part].meta = out.meta;
    k[part].sizes = w.take<unsigned long long>(blocks + 1);
    k[part].offsets = w.take<unsigned long long>(blocks + 1);
    k[part].mids = w.take<float>(blocks);
    out.payload = k[part].payload = w.take<std::uint8_t>(4 * n);
    out.coded = n;
    out.blocks = blocks;
  }
  void* temp_storage = w.take<std::uint8_t>(temp);
  auto* totals = w.take<unsigned long long>(2);
  const BlockRules rules = codec::detail::rules_for(c);
  const auto* pairs = reinterpret_cast<const float2*>(x);
  if (blocks) code_pair_blocks(s, pairs, n, rules, c.block, blocks, k[0], k[1], false);
  for (int part = 0; part < 2; ++part) {
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(k[part].sizes + blocks, 0, sizeof(unsigned long long), s));
    size_t tb = temp;
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, k[part].sizes, k[part].offsets,
                                                    static_cast<std::int64_t>(blocks + 1), s));
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(totals + part, k[part].offsets + blocks, sizeof(unsigned long long),
                                      cudaMemcpyDeviceToDevice, s));
  }
  if (blocks) code_pair_blocks(s, pairs, n, rules, c.block, blocks, k[0], k[1], true);
  auto* host = static_cast<unsigned long long*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, totals, 2 * sizeof *host, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  w.last[0].payload_bytes = host[0];
  w.last[1].payload_bytes = host[1];
}

std::vector<codec::detail::ComponentParts> GpuCodec::code_all(const float* x, std::uint64_t n, int parts,
                                                              const codec::detail::Coding& c) {
  std::vector<codec::detail::ComponentParts> out;
  if (parts == 2 && can_code_pair(c, x)) {
    code_pair(x, n, c);
    out.push_back(this->parts(0));
    out.push_back(this->parts(1));
    return out;
  }
  for (int part = 0; part < parts; ++part) {
    code(x + part, n, parts, c);
    out.push_back(this->parts(0));
  }
  return out;
}

namespace {

// Workspace for component_blocks: the meta copy, sizes and offsets of `blocks` blocks.
std::uint64_t component_blocks_bytes(std::uint64_t blocks) {
  return round_up(3 * blocks) + 2 * round_up(8 * (blocks + 1));
}

// A component's blocks on the device: its meta (read where it lies in the stream when stored raw,
// as integrated does; zstd-packed meta comes from the host) and each block's payload offset
// (sizes, then an exclusive scan), queued on the codec's stream.
ComponentBlocks component_blocks(GpuCodec::Impl& w, const codec::detail::StoredComponent& c,
                                 const std::uint8_t* device_stream, std::uint64_t blocks, void* temp_storage,
                                 std::uint64_t temp) {
  const cudaStream_t s = w.cuda();
  auto* meta_copy = w.take<std::uint8_t>(3 * blocks);
  auto* sizes = w.take<unsigned long long>(blocks + 1);
  auto* offsets = w.take<unsigned long long>(blocks + 1);
  const std::uint8_t* meta = meta_copy;
  if (c.meta_offset != codec::detail::StoredComponent::kPacked)
    meta = device_stream + c.meta_offset;
  else
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(meta_copy, c.meta.data(), 3 * blocks, cudaMemcpyHostToDevice, s));
  sizes_kernel<<<grid_for(blocks + 1, 256), 256, 0, s>>>(meta, blocks, sizes);
  QSTAGE_CUDA_CHECK_LAUNCH();
  size_t tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, sizes, offsets, static_cast<std::int64_t>(blocks + 1), s));
  return {device_stream + c.payload_offset, meta, offsets};
}

void check_decoded(GpuCodec::Impl& w, const unsigned* error) {
  auto* host = static_cast<unsigned*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, error, sizeof *host, cudaMemcpyDeviceToHost, w.cuda()));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(w.cuda()));  // also the end of the copies from the host vectors
  if (*host) throw codec::FormatError("corrupted block: a block payload does not decode consistently (GPU decoder)");
}

}  // namespace

bool GpuCodec::can_decode_pair(const codec::detail::Coding& coding, const float* out) {
  return !codec::detail::groups(coding.pipeline) && reinterpret_cast<std::uintptr_t>(out) % alignof(float2) == 0;
}

void GpuCodec::decode_pair(const codec::detail::StoredComponent& re, const codec::detail::StoredComponent& im,
                           const std::uint8_t* device_stream, std::uint64_t n, const codec::detail::Coding& coding,
                           float* out) {
  if (!can_decode_pair(coding, out) || re.coded != n || im.coded != n)
    throw std::logic_error("GpuCodec::decode_pair: not a pair of ungrouped components");
  Impl& w = *impl_;
  const std::uint64_t blocks = codec::detail::div_up(n, coding.block), temp = scan_temp_bytes(blocks + 1);
  w.reserve(2 * component_blocks_bytes(blocks) + round_up(temp) + 256);
  void* temp_storage = w.take<std::uint8_t>(temp);
  auto* error = w.take<unsigned>(1);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(unsigned), w.cuda()));
  const ComponentBlocks a = component_blocks(w, re, device_stream, blocks, temp_storage, temp);
  const ComponentBlocks b = component_blocks(w, im, device_stream, blocks, temp_storage, temp);
  if (blocks) decode_pair_blocks(w.cuda(), coding.block, a, b, blocks, n, reinterpret_cast<float2*>(out), 2 * coding.e, error);
  check_decoded(w, error);
}

void GpuCodec::decode_all(const std::vector<codec::detail::StoredComponent>& parts, const std::uint8_t* device_stream,
                          std::uint64_t n, const codec::detail::Coding& coding, float* out) {
  if (parts.size() == 2 && can_decode_pair(coding, out)) return decode_pair(parts[0], parts[1], device_stream, n, coding, out);
  const int stride = static_cast<int>(parts.size());
  for (int k = 0; k < stride; ++k) decode(parts[k], device_stream, n, stride, coding, out + k);
}

void GpuCodec::decode(const codec::detail::StoredComponent& c, const std::uint8_t* device_stream, std::uint64_t n,
                      int stride, const codec::detail::Coding& coding, float* out) {
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  const bool grouped = codec::detail::groups(coding.pipeline);
  const std::uint64_t blocks = codec::detail::div_up(c.coded, coding.block), bitmap_bytes = (n + 7) / 8;
  const std::uint64_t temp = std::max(scan_temp_bytes(blocks + 1), scan_temp_bytes(bitmap_bytes + 1));
  w.reserve(component_blocks_bytes(blocks) + round_up(temp) + 256 +
            (grouped ? round_up(4 * c.coded) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  void* temp_storage = w.take<std::uint8_t>(temp);
  auto* error = w.take<unsigned>(1);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(error, 0, sizeof(unsigned), s));
  const ComponentBlocks k = component_blocks(w, c, device_stream, blocks, temp_storage, temp);
  float* kept = grouped ? w.take<float>(c.coded) : nullptr;
  if (blocks)
    decode_blocks(s, coding.block, k.payload, k.meta, k.offsets, blocks, c.coded, grouped ? kept : out,
                  grouped ? 1 : stride, 2 * coding.e, error);
  size_t tb = temp;
  if (grouped && n) {
    auto* bitmap = w.take<std::uint8_t>(bitmap_bytes);
    auto* counts = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* ranks = w.take<unsigned long long>(bitmap_bytes + 1);
    if (c.level2_offset != codec::detail::StoredComponent::kPacked) {
      // Two levels: rebuilt from the stream's device copy (the host checked it while parsing).
      const std::uint64_t level2_bytes = (bitmap_bytes + 7) / 8;
      popcount_kernel<<<grid_for(level2_bytes + 1, 256), 256, 0, s>>>(device_stream + c.level2_offset, level2_bytes, counts);
      QSTAGE_CUDA_CHECK_LAUNCH();
      tb = temp;
      QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(level2_bytes + 1), s));
      level1_kernel<<<grid_for(bitmap_bytes, 256), 256, 0, s>>>(device_stream + c.level2_offset, ranks,
                                                                 device_stream + c.level1_offset, bitmap_bytes, bitmap);
      QSTAGE_CUDA_CHECK_LAUNCH();
    } else {
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(bitmap, c.bitmap.data(), bitmap_bytes, cudaMemcpyHostToDevice, s));
    }
    popcount_kernel<<<grid_for(bitmap_bytes + 1, 256), 256, 0, s>>>(bitmap, bitmap_bytes, counts);
    QSTAGE_CUDA_CHECK_LAUNCH();
    tb = temp;
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(bitmap_bytes + 1), s));
    expand_kernel<<<grid_for(n, 256), 256, 0, s>>>(kept, n, stride, bitmap, ranks, out);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
  check_decoded(w, error);
}

double GpuCodec::value_range(const float* x, std::uint64_t count) {
  if (count == 0) return 0.0;
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  auto lo_in = thrust::make_transform_iterator(x, FiniteOr{INFINITY});
  auto hi_in = thrust::make_transform_iterator(x, FiniteOr{-INFINITY});
  size_t temp = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, temp, lo_in, static_cast<float*>(nullptr),
                                              static_cast<std::int64_t>(count), Min{}, INFINITY, s));
  w.reserve(round_up(temp) + 256);
  void* temp_storage = w.take<std::uint8_t>(temp);
  float* result = w.take<float>(2);
  size_t tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(temp_storage, tb, lo_in, result, static_cast<std::int64_t>(count), Min{}, INFINITY, s));
  tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(temp_storage, tb, hi_in, result + 1, static_cast<std::int64_t>(count), Max{}, -INFINITY, s));
  auto* host = static_cast<float*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, result, 2 * sizeof(float), cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  return host[0] <= host[1] ? static_cast<double>(host[1]) - static_cast<double>(host[0]) : 0.0;
}

}  // namespace qstage::kernels
