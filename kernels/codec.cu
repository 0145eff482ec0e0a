// The codec's blocks on the GPU: one warp per block, each lane holding V = block / 32
// consecutive values. Coding takes one pass over the data: each warp chooses its block's state
// and size, the CTA finds where its blocks' payloads start from the tiles before it (a
// decoupled look-back: exact integer sums, so the same offsets on every run), and each warp
// writes its payload there (no atomics whose order matters: quantized and dense payloads are
// ORed together in shared memory, which commutes), so the bytes are those of the CPU twin,
// io/codec/block_coder.cpp, on every run. Decoding takes the offsets from one scan over the
// sizes of all the components' blocks (a kernel of its own, with the same look-back); the bytes
// a dense block's values repeat from the values before come from one warp scan.
#include <cuda/atomic>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/transform_iterator.h>

#include <fmt/format.h>

#include "io/codec/block_math.hpp"
#include "kernels/codec.hpp"
#include "backend/cuda_check.hpp"

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

// Floats ordered as signed integers (the same order for all but NaN; -0 before +0), so that
// a warp's minimum or maximum is one reduction instruction.
__device__ int ordered(float v) {
  const int b = static_cast<int>(float_bits(v));
  return b ^ ((b >> 31) & 0x7fffffff);
}
__device__ float unordered(int k) { return bits_float(static_cast<unsigned>(k ^ ((k >> 31) & 0x7fffffff))); }
__device__ float warp_min(float v) { return unordered(__reduce_min_sync(kFull, ordered(v))); }
__device__ float warp_max(float v) { return unordered(__reduce_max_sync(kFull, ordered(v))); }

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

// thresholded(x, t) in floats: |x| <= t exactly when |x| <= t_below (NaN stays NaN).
__device__ float thresholded_f(float x, const BlockRules& r) { return fabsf(x) <= r.t_below ? 0.0f : x; }

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
// midpoint is the same unless every thresholded value is a zero, and such a block is a zero block.)
template <int V>
__device__ Choice<V> choose(const Held<V>& h, const BlockRules& r) {
  bool finite = true, zero_ok = true;
  int nonzero = 0;
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    finite = finite && is_finite(h.x[j]);
    nonzero += (float_bits(h.y[j]) & 0x7fffffffu) != 0;
    zero_ok = zero_ok && fabsf(h.x[j]) <= r.te_below;
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

__device__ void put_u32(std::uint8_t* out, unsigned w) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(w >> (8 * i));
}
__device__ unsigned get_u32(const std::uint8_t* in) {
  unsigned w = 0;
  for (int i = 0; i < 4; ++i) w |= static_cast<unsigned>(in[i]) << (8 * i);
  return w;
}

// A component's coded blocks in device memory: meta (states, then u16 sizes) and the payload;
// `tiles` and `total` are the look-back's state (code_kernel).
struct BlockBuffers {
  std::uint8_t* meta;
  std::uint8_t* payload;
  unsigned long long* tiles;
  unsigned long long* total;
};

template <int V>
__device__ void record_choice(const Choice<V>& c, std::uint64_t b, std::uint64_t blocks, std::uint8_t* meta) {
  if (lane_id() != 0) return;
  meta[b] = static_cast<std::uint8_t>(c.state);
  meta[blocks + 2 * b] = static_cast<std::uint8_t>(c.size);
  meta[blocks + 2 * b + 1] = static_cast<std::uint8_t>(c.size >> 8);
}

// Payload offsets in the same pass that chooses the blocks: a CTA's blocks form a tile, and a
// tile's offset comes from a decoupled look-back (Merrill and Garland, "Single-pass parallel
// prefix scan with decoupled look-back", 2016) over the tiles before it. Each tile publishes
// one word, flag and value together: first its own sum of sizes, then its inclusive prefix. Sums
// of integers are exact, so the offsets are those of a separate scan on every run. Tiles are
// numbered in the order CTAs start (a ticket), so every tile a CTA waits for has started, and
// a tile publishes its own sum before it waits for any other: no CTA waits forever.
constexpr unsigned long long kTileAggregate = 1ull << 62, kTilePrefix = 2ull << 62, kTileValue = (1ull << 62) - 1;

__device__ unsigned long long tile_word(unsigned long long* tiles, long long t) {
  if (t < 0) return kTilePrefix;  // before the first tile: a prefix of 0
  return cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(tiles[t]).load(cuda::memory_order_relaxed);
}
__device__ void publish_tile(unsigned long long* tiles, std::uint64_t t, unsigned long long word) {
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(tiles[t]).store(word, cuda::memory_order_relaxed);
}
__device__ unsigned long long warp_sum(unsigned long long v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Called by one whole warp, after the tile published its sum of sizes (publish_sizes): the sum of
// the sizes of all tiles before `tile`, then published with it as the tile's inclusive prefix.
__device__ unsigned long long tile_offset(unsigned long long* tiles, std::uint64_t tile, unsigned long long aggregate) {
  if (tile == 0) return 0;
  const int lane = lane_id();
  unsigned long long before = 0;
  for (long long newest = static_cast<long long>(tile) - 1;; newest -= 32) {
    unsigned long long word = tile_word(tiles, newest - lane);
    while (__any_sync(kFull, word < kTileAggregate)) word = tile_word(tiles, newest - lane);
    const unsigned prefixes = __ballot_sync(kFull, word >= kTilePrefix);
    const int last = prefixes ? __ffs(prefixes) - 1 : 31;  // lanes up to the newest prefix count
    before += warp_sum(lane <= last ? word & kTileValue : 0ull);
    if (prefixes) break;
  }
  if (lane == 0) publish_tile(tiles, tile, kTilePrefix | (before + aggregate));
  return before;
}

// The tile this CTA codes, and this warp's block in it (threadIdx.x 0 takes the ticket; all
// threads must call).
struct TileBlock {
  std::uint64_t tiles, tile, b;
  int warp;
};
__device__ TileBlock take_tile(unsigned long long* ticket, std::uint64_t blocks) {
  __shared__ std::uint64_t tile;
  if (threadIdx.x == 0) tile = atomicAdd(ticket, 1ull);
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x / 32);
  return {(blocks + kWarpsPerCta - 1) / kWarpsPerCta, tile, tile * kWarpsPerCta + warp, warp};
}

// Copies `size` bytes from the shared words `from` (one word more than they hold is read) to
// global memory at any `to`: whole words, each from two shared ones, and the bytes around them.
__device__ void store_bytes(std::uint8_t* to, const unsigned* from, int size) {
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

// A dense block's payload, put together in the warp's shared `words`.
template <int V>
__device__ void assemble_dense(const Held<V>& h, const Dense<V>& d, float mid, unsigned* words) {
  const int lane = lane_id();
  auto* out = reinterpret_cast<std::uint8_t*>(words);
  const int code_bytes = (h.m + 3) / 4;
  // Each lane's stored bytes follow one another from `at`: they are packed into whole words in
  // a register and ORed into its (zeroed) words, after the codes (a lane's first and last word
  // may be a neighbour's or the codes' too; OR commutes, so the bytes are the same every run).
  const int at = 5 + code_bytes + warp_exclusive_sum(d.stored);
  if (d.stored > 0)
    for (int k = at / 4; k < (at + d.stored + 3) / 4; ++k) words[k] = 0;
  __syncwarp();
  if (lane == 0) {
    put_u32(out, float_bits(mid));
    out[4] = static_cast<std::uint8_t>(d.bits);
  }
  // Codes: 2 bits per value, value i at bits 2 (i mod 4) of byte i / 4.
  unsigned codes = 0;  // this lane's 2V bits
  for (int j = 0; j < V; ++j)
    if (h.has(j)) codes |= static_cast<unsigned>(d.lead[j]) << (2 * j);
  if (V == 2) {  // two lanes share a byte
    const unsigned odd = __shfl_down_sync(kFull, codes, 1);
    if ((lane & 1) == 0 && lane / 2 < code_bytes) out[5 + lane / 2] = static_cast<std::uint8_t>(codes | (odd << 4));
  } else {
    for (int k = 0; k < V / 4; ++k)
      if (lane * (V / 4) + k < code_bytes) out[5 + lane * (V / 4) + k] = static_cast<std::uint8_t>(codes >> (8 * k));
  }
  __syncwarp();  // (the codes are in)
  unsigned long long pending = 0;  // bytes not yet ORed in, the first at byte 0 of words[word]
  int fill = at & 3, word = at / 4;
  for (int j = 0; j < V; ++j) {
    if (!h.has(j)) continue;
    // The word's bytes lead .. bytes - 1, most significant first, as the low bytes (the bytes
    // past the kept ones are 0).
    pending |= static_cast<unsigned long long>(__byte_perm(d.w[j] << (8 * d.lead[j]), 0, 0x0123)) << (8 * fill);
    fill += d.bytes - d.lead[j];
    if (fill >= 4) {
      atomicOr(&words[word++], static_cast<unsigned>(pending));
      pending >>= 32;
      fill -= 4;
    }
  }
  if (fill > 0) atomicOr(&words[word], static_cast<unsigned>(pending));
}

// A block's payload as choose() chose it, put together in the warp's shared `words` (32 V + 1 of
// them), so that it goes out in whole words (store_block) once its offset is known: lanes
// writing a few bytes each straight to global memory would touch a sector per lane per byte.
// Quantized blocks are put together later, in store_block.
template <int V>
__device__ void assemble_block(const Held<V>& h, const Choice<V>& c, const BlockRules& r, unsigned* words) {
  const int lane = lane_id();
  auto* out = reinterpret_cast<std::uint8_t*>(words);
  switch (c.state) {
    case kConstant:
      if (lane == 0) put_u32(out, float_bits(c.mid));
      break;
    case kRaw:
      for (int j = 0; j < V; ++j)
        if (h.has(j)) put_u32(out + 4 * (h.base + j), float_bits(h.x[j]));
      break;
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
      break;
    }
    case kDense:
      assemble_dense(h, dense(h, c.mid, r), c.mid, words);
      break;
    default: break;  // zero: no payload; quantized: store_block
  }
}

// The block's payload at `to`: as assemble_block left it in `words`, or, quantized, each value's
// bits ORed together in `words` (OR commutes: the same bytes on every run) and stored in bytes.
template <int V>
__device__ void store_block(const Held<V>& h, const Choice<V>& c, const BlockRules& r, std::uint8_t* to,
                            unsigned* words) {
  const int lane = lane_id();
  __syncwarp();  // (assemble_block's bytes are in)
  if (c.state != kQuantized) {
    store_bytes(to, words, c.size);
    return;
  }
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
  if (lane == 0) to[0] = static_cast<std::uint8_t>(width);
  for (int k = lane; k < bytes; k += 32) to[1 + k] = static_cast<std::uint8_t>(words[k / 4] >> (8 * (k % 4)));
}

// After the blocks' sizes (shared, one per warp and component) are in: warp p publishes the
// tile's sum of sizes of component p and returns it (on its lanes).
template <int Parts>
__device__ unsigned long long publish_sizes(const int (&sizes)[Parts][kWarpsPerCta], const BlockBuffers* k,
                                            std::uint64_t tile) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = lane_id();
  if (warp >= Parts) return 0;
  const unsigned long long aggregate =
      static_cast<unsigned long long>(__reduce_add_sync(kFull, lane < kWarpsPerCta ? sizes[warp][lane] : 0));
  if (lane == 0) publish_tile(k[warp].tiles, tile, (tile == 0 ? kTilePrefix : kTileAggregate) | aggregate);
  return aggregate;
}

// Then, after the payloads are put together (the tiles before have had that long to publish
// their prefixes): warp p finds where component p of the tile starts.
template <int Parts>
__device__ void find_tile_starts(const BlockBuffers* k, std::uint64_t tile, std::uint64_t tiles,
                                 unsigned long long aggregate, unsigned long long (&start)[Parts]) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = lane_id();
  if (warp < Parts) {
    const unsigned long long before = tile_offset(k[warp].tiles, tile, aggregate);
    if (lane == 0) {
      start[warp] = before;
      if (tile + 1 == tiles) *k[warp].total = before + aggregate;
    }
  }
  __syncthreads();  // the starts are in
}

// Where warp `warp`'s block of a component goes: the tile's start plus the sizes of the warps before.
__device__ unsigned long long block_start(unsigned long long tile_start, const int (&sizes)[kWarpsPerCta], int warp) {
  for (int w = 0; w < warp; ++w) tile_start += static_cast<unsigned long long>(sizes[w]);
  return tile_start;
}

// One pass: each block's state, size and payload (meta: states, then u16 sizes). (Three CTAs an
// SM: on an H100 that coded 10-15 % faster than the two that 114 registers allow, despite a
// few spilled ones.)
template <int V>
__global__ void __launch_bounds__(32 * kWarpsPerCta, 3)
    code_kernel(const float* values, std::uint64_t n, int stride, BlockRules r, std::uint64_t blocks, BlockBuffers k,
                unsigned long long* ticket) {
  __shared__ float stage[kWarpsPerCta][kStaged<float, V> + 1];  // the loads' staging, then the payload
  __shared__ int sizes[1][kWarpsPerCta];
  __shared__ unsigned long long start[1];
  const auto [tiles, tile, b, warp] = take_tile(ticket, blocks);
  auto* words = reinterpret_cast<unsigned*>(stage[warp]);
  Held<V> h;
  Choice<V> c{kZero, 0, 0.0f};
  if (b < blocks) {
    h = load<V>(values, b * (32 * V), n, stride, r, stage[warp]);
    c = choose(h, r);
    record_choice(c, b, blocks, k.meta);
  }
  if (lane_id() == 0) sizes[0][warp] = c.size;
  __syncthreads();  // the sizes are in
  const unsigned long long aggregate = publish_sizes<1>(sizes, &k, tile);
  if (b < blocks) assemble_block(h, c, r, words);
  find_tile_starts<1>(&k, tile, tiles, aggregate, start);
  if (b < blocks) store_block(h, c, r, k.payload + block_start(start[0], sizes[0], warp), words);
}

// Both components of complex values, loaded once as pairs.
template <int V>
__global__ void __launch_bounds__(32 * kWarpsPerCta, 3)
    code_pair_kernel(const float2* values, std::uint64_t n, BlockRules r, std::uint64_t blocks, BlockBuffers re,
                     BlockBuffers im, unsigned long long* ticket) {
  __shared__ float2 stage[kWarpsPerCta][kStaged<float2, V> + 1];  // the loads' staging, then both payloads
  __shared__ int sizes[2][kWarpsPerCta];
  __shared__ unsigned long long start[2];
  const auto [tiles, tile, b, warp] = take_tile(ticket, blocks);
  auto* words_re = reinterpret_cast<unsigned*>(stage[warp]);
  auto* words_im = words_re + 32 * V + 1;
  Held<V> hr, hi;
  Choice<V> cr{kZero, 0, 0.0f}, ci{kZero, 0, 0.0f};
  if (b < blocks) {
    load_pair<V>(values, b * (32 * V), n, r, stage[warp], hr, hi);
    cr = choose(hr, r);
    ci = choose(hi, r);
    record_choice(cr, b, blocks, re.meta);
    record_choice(ci, b, blocks, im.meta);
  }
  if (lane_id() == 0) {
    sizes[0][warp] = cr.size;
    sizes[1][warp] = ci.size;
  }
  __syncthreads();  // the sizes are in
  const BlockBuffers parts[2] = {re, im};
  const unsigned long long aggregate = publish_sizes<2>(sizes, parts, tile);
  if (b < blocks) {
    assemble_block(hr, cr, r, words_re);
    assemble_block(hi, ci, r, words_im);
  }
  find_tile_starts<2>(parts, tile, tiles, aggregate, start);
  if (b < blocks) {
    store_block(hr, cr, r, re.payload + block_start(start[0], sizes[0], warp), words_re);
    store_block(hi, ci, r, im.payload + block_start(start[1], sizes[1], warp), words_im);
  }
}

// Decoding: one warp per block.
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

// A component's coded blocks in device memory, to decode: block b's payload starts at
// payload + offsets[b] - before (the components' offsets come from one scan over all their
// blocks; `before`: the payload bytes of the components scanned before this one).
struct ComponentBlocks {
  const std::uint8_t* payload;
  const std::uint8_t* meta;
  const unsigned long long* offsets;
  unsigned long long before;
};

// Block b's state, payload size and where its payload starts.
struct BlockHead {
  const std::uint8_t* in;
  int state, size;
};
__device__ BlockHead block_head(const ComponentBlocks& k, std::uint64_t blocks, std::uint64_t b) {
  return {k.payload + (k.offsets[b] - k.before), k.meta[b], k.meta[blocks + 2 * b] | (k.meta[blocks + 2 * b + 1] << 8)};
}

// Leaves block h's values in each lane's v (lane l has values lV .. lV + V - 1) and returns true
// (on every lane) if its payload is inconsistent; the block's values are then unspecified but in
// bounds. `scratch` is the warp's shared scratch (kStaged<float, V> floats).
template <int V>
__device__ bool decode_block(const BlockHead& h, int m, double step, float (&v)[V], float* scratch) {
  const int lane = lane_id(), base = lane * V;
  const std::uint8_t* in = h.in;
  const int size = h.size;
  bool bad = false;
  switch (h.state) {
    case kZero:  // (the host checked the sizes of zero, constant and raw blocks while parsing)
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
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
      if (bad) break;
      BitReader codes(in + 1, base * width);
      for (int j = 0; j < V; ++j) v[j] = base + j < m ? dequantize(unzigzag(codes.take(width)), step) : 0.0f;
      break;
    }
    case kSparse: {
      const int count = in[0], bits = in[1];
      const int bytes = kept_bytes(bits);
      bad = count < 1 || count > m || bits < 9 || bits > 32 || size != 2 + count + count * bytes;
      for (int j = 0; j < V; ++j) v[j] = 0.0f;
      if (bad) break;
      // Indices must increase within the block.
      for (int s = lane; s < count; s += 32) {
        const int index = in[2 + s];
        if (index >= m || (s > 0 && in[1 + s] >= index)) bad = true;
      }
      bad = __any_sync(kFull, bad);
      if (bad) break;
      // The stored values scattered to their positions in the warp's scratch, then read back.
      for (int j = 0; j < V; ++j) scratch[padded<float>(j * 32 + lane)] = 0.0f;
      __syncwarp();
      for (int s = lane; s < count; s += 32) {
        unsigned w = 0;
        for (int k = 0; k < bytes; ++k) w |= static_cast<unsigned>(in[2 + count + s * bytes + k]) << (24 - 8 * k);
        scratch[padded<float>(in[2 + s])] = bits_float(w);
      }
      __syncwarp();
      for (int j = 0; j < V; ++j) v[j] = scratch[padded<float>(base + j)];
      __syncwarp();
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
      // This lane's codes: 2 bits a value, value i at bits 2 (i mod 4) of byte i / 4.
      unsigned codes = 0;
      if (V == 2) {
        if (lane / 2 < code_bytes) codes = in[5 + lane / 2] >> (4 * (lane & 1));
      } else {
        for (int k = 0; k < V / 4; ++k)
          if (lane * (V / 4) + k < code_bytes) codes |= static_cast<unsigned>(in[5 + lane * (V / 4) + k]) << (8 * k);
      }
      int lead[V], stored = 0;
      for (int j = 0; j < V; ++j) {
        const int i = base + j;
        lead[j] = i < m ? (codes >> (2 * j)) & 3 : 0;
        if (lead[j] > bytes) bad = true;
        stored += i < m ? bytes - lead[j] : 0;
      }
      const int at = 5 + code_bytes + warp_exclusive_sum(stored);
      const int end = __shfl_sync(kFull, at + stored, 31);
      bad = __any_sync(kFull, bad || end != size);
      if (bad) break;
      // Value i's word is (word[i-1] & keep_i) | own_i: its own stored bytes, and the `lead` leading
      // bytes it shares with the value before (0 before the first). Maps of that form compose
      // into one of the same form, so a warp scan of the lanes' composed maps gives each lane
      // the word before its first value.
      unsigned own[V], keep[V], lane_own = 0, lane_keep = ~0u;
      BitReader stored_bytes(in + at);
      for (int j = 0; j < V; ++j) {
        own[j] = 0;
        keep[j] = ~0u;  // past the block's end: the identity
        if (base + j < m) {
          keep[j] = lead[j] ? ~0u << (32 - 8 * lead[j]) : 0u;
          // Bytes lead .. bytes - 1 of the word, most significant first: reversed into place.
          own[j] = __byte_perm(stored_bytes.take(8 * (bytes - lead[j])), 0, 0x0123) >> (8 * lead[j]);
        }
        lane_own = (lane_own & keep[j]) | own[j];
        lane_keep &= keep[j];
      }
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned own_before = __shfl_up_sync(kFull, lane_own, o);
        const unsigned keep_before = __shfl_up_sync(kFull, lane_keep, o);
        if (lane >= o) {
          lane_own = (own_before & lane_keep) | lane_own;
          lane_keep &= keep_before;
        }
      }
      unsigned w = __shfl_up_sync(kFull, lane_own, 1);
      if (lane == 0) w = 0;
      for (int j = 0; j < V; ++j) {
        w = (w & keep[j]) | own[j];
        v[j] = dense_value(mid, w);
      }
      break;
    }
    default:
      bad = true;
  }
  return __any_sync(kFull, bad);
}

// The block a decoding warp takes: block b, whose values start at value `first`, m of them
// (lane: this lane, holding values base .. base + V - 1 of the block). Not `valid` past the last.
template <int V>
struct DecodedBlock {
  int warp, lane, base, m;
  std::uint64_t b, first;
  bool valid;
};
template <int V>
__device__ DecodedBlock<V> decoded_block(std::uint64_t blocks, std::uint64_t n) {
  DecodedBlock<V> k;
  k.warp = static_cast<int>(threadIdx.x / 32);
  k.lane = lane_id();
  k.base = k.lane * V;
  k.b = std::uint64_t(blockIdx.x) * kWarpsPerCta + k.warp;
  k.valid = k.b < blocks;
  k.first = k.b * (32 * V);
  k.m = k.valid ? block_values<V>(n, k.first) : 0;
  return k;
}

// Decodes one component into out[0], out[stride], ...; an inconsistent payload sets *error (in
// pinned host memory; the host then refuses the stream).
template <int V>
__global__ void decode_kernel(ComponentBlocks k, std::uint64_t blocks, std::uint64_t n, float* out, int stride,
                              double step, unsigned* error) {
  __shared__ float stage[kWarpsPerCta][kStaged<float, V>];
  const auto [warp, lane, base, m, b, first, valid] = decoded_block<V>(blocks, n);
  if (!valid) return;
  float v[V];
  if (decode_block<V>(block_head(k, blocks, b), m, step, v, stage[warp])) {
    if (lane == 0) *error = 1u;  // (every writer writes the same value)
    return;
  }
  // Stores go through shared memory too, so that lanes write consecutive values.
  for (int j = 0; j < V; ++j) stage[warp][padded<float>(base + j)] = v[j];
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane;
    if (i < m) out[(first + i) * stride] = stage[warp][padded<float>(i)];
  }
}

// The two components of complex values at once: a warp decodes block b of the real and of the
// imaginary parts (their blocks cover the same elements) and writes the pairs as float2, so the
// output is written once, in whole sectors, instead of half of every sector twice.
template <int V>
__global__ void decode_pair_kernel(ComponentBlocks re, ComponentBlocks im, std::uint64_t blocks, std::uint64_t n,
                                   float2* out, double step, unsigned* error) {
  __shared__ float scratch[kWarpsPerCta][kStaged<float, V>];
  __shared__ float2 stage[kWarpsPerCta][kStaged<float2, V>];
  const auto [warp, lane, base, m, b, first, valid] = decoded_block<V>(blocks, n);
  if (!valid) return;
  // Both blocks' heads first, so that their loads overlap.
  const BlockHead head_re = block_head(re, blocks, b), head_im = block_head(im, blocks, b);
  float v[V];
  bool bad = decode_block<V>(head_re, m, step, v, scratch[warp]);
  for (int j = 0; j < V; ++j) stage[warp][padded<float2>(base + j)].x = v[j];
  __syncwarp();
  bad = decode_block<V>(head_im, m, step, v, scratch[warp]) || bad;
  if (bad) {
    if (lane == 0) *error = 1u;  // (every writer writes the same value)
    return;
  }
  for (int j = 0; j < V; ++j) stage[warp][padded<float2>(base + j)].y = v[j];
  __syncwarp();
  for (int j = 0; j < V; ++j) {
    const int i = j * 32 + lane;
    if (i < m) out[first + i] = stage[warp][padded<float2>(i)];
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

// The exclusive scan of `items` sizes into offsets, in one kernel: each CTA scans a tile of
// kScanTile sizes and finds where it starts from the tiles before it (the coder's decoupled
// look-back; `ticket` and `tiles` zeroed). A CUB device scan does the same in two kernels, and
// its dispatch alone took 11-17 us of host time a call on an H200, as long as its kernels ran
// (docs/benchmarks.md, "Decoding: its fixed costs").
constexpr int kScanThreads = 256, kScanPerThread = 8, kScanTile = kScanThreads * kScanPerThread;

__global__ void __launch_bounds__(kScanThreads)
    offsets_kernel(PayloadSize sizes, std::uint64_t items, unsigned long long* offsets, unsigned long long* ticket,
                   unsigned long long* tiles) {
  using BlockScan = cub::BlockScan<unsigned long long, kScanThreads>;
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ std::uint64_t tile;
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) tile = atomicAdd(ticket, 1ull);
  __syncthreads();
  const std::uint64_t first = tile * kScanTile + threadIdx.x * kScanPerThread;
  unsigned long long v[kScanPerThread];
  for (int j = 0; j < kScanPerThread; ++j) v[j] = first + j < items ? sizes(first + j) : 0ull;
  unsigned long long aggregate = 0;
  BlockScan(scan).ExclusiveSum(v, v, aggregate);
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) publish_tile(tiles, tile, (tile == 0 ? kTilePrefix : kTileAggregate) | aggregate);
    const unsigned long long before = tile_offset(tiles, tile, aggregate);
    if (threadIdx.x == 0) start = before;
  }
  __syncthreads();
  for (int j = 0; j < kScanPerThread; ++j)
    if (first + j < items) offsets[first + j] = start + v[j];
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
                   std::uint64_t blocks, const BlockBuffers& k, unsigned long long* ticket) {
  code_kernel<V><<<grid_for(blocks, kWarpsPerCta), 32 * kWarpsPerCta, 0, s>>>(v, n, stride, r, blocks, k, ticket);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

template <int V>
void launch_pair_blocks(cudaStream_t s, const float2* v, std::uint64_t n, const BlockRules& r, std::uint64_t blocks,
                        const BlockBuffers& re, const BlockBuffers& im, unsigned long long* ticket) {
  code_pair_kernel<V><<<grid_for(blocks, kWarpsPerCta), 32 * kWarpsPerCta, 0, s>>>(v, n, r, blocks, re, im, ticket);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void code_pair_blocks(cudaStream_t s, const float2* v, std::uint64_t n, const BlockRules& r, std::uint32_t block,
                      std::uint64_t blocks, const BlockBuffers& re, const BlockBuffers& im, unsigned long long* ticket) {
  switch (block) {
    case 64: return launch_pair_blocks<2>(s, v, n, r, blocks, re, im, ticket);
    case 128: return launch_pair_blocks<4>(s, v, n, r, blocks, re, im, ticket);
    default: return launch_pair_blocks<8>(s, v, n, r, blocks, re, im, ticket);
  }
}

void code_blocks(cudaStream_t s, const float* v, std::uint64_t n, int stride, const BlockRules& r, std::uint32_t block,
                 std::uint64_t blocks, const BlockBuffers& k, unsigned long long* ticket) {
  switch (block) {
    case 64: return launch_blocks<2>(s, v, n, stride, r, blocks, k, ticket);
    case 128: return launch_blocks<4>(s, v, n, stride, r, blocks, k, ticket);
    default: return launch_blocks<8>(s, v, n, stride, r, blocks, k, ticket);
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

void decode_blocks(cudaStream_t s, std::uint32_t block, const ComponentBlocks& k, std::uint64_t blocks,
                   std::uint64_t n, float* out, int stride, double step, unsigned* error) {
  const unsigned grid = grid_for(blocks, kWarpsPerCta);
  switch (block) {
    case 64: decode_kernel<2><<<grid, 32 * kWarpsPerCta, 0, s>>>(k, blocks, n, out, stride, step, error); break;
    case 128: decode_kernel<4><<<grid, 32 * kWarpsPerCta, 0, s>>>(k, blocks, n, out, stride, step, error); break;
    default: decode_kernel<8><<<grid, 32 * kWarpsPerCta, 0, s>>>(k, blocks, n, out, stride, step, error); break;
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace

// The look-back's state for `parts` components coded in one pass, zeroed: the CTAs' ticket, each
// component's payload total, and each component's tile words.
struct LookBack {
  unsigned long long *ticket, *totals, *tiles;
  std::uint64_t tiles_per_part;
  BlockBuffers part(int p, std::uint8_t* meta, std::uint8_t* payload) const {
    return {meta, payload, tiles + p * tiles_per_part, totals + p};
  }
};

std::uint64_t look_back_words(std::uint64_t blocks, int parts) {
  return 1 + parts * (1 + (blocks + kWarpsPerCta - 1) / kWarpsPerCta);
}
std::uint64_t look_back_bytes(std::uint64_t blocks, int parts) { return round_up(8 * look_back_words(blocks, parts)); }

// Device memory from the backend (charged to its budget), kept between calls and grown when a
// call needs more; each call carves it into aligned pieces.
struct GpuCodec::Impl {
  Backend& backend;
  Stream& stream;
  Buffer workspace;
  Buffer pinned;  // small results read back by the host (64 bytes: totals, then the decoders' error flag)
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
  // `count` look-back words (tickets, tile words), zeroed on the codec's stream.
  unsigned long long* take_zeroed_words(std::uint64_t count) {
    auto* words = take<unsigned long long>(count);
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(words, 0, 8 * count, cuda()));
    return words;
  }
  LookBack take_look_back(std::uint64_t blocks, int parts) {
    auto* words = take_zeroed_words(look_back_words(blocks, parts));
    return {words, words + 1, words + 1 + parts, (blocks + kWarpsPerCta - 1) / kWarpsPerCta};
  }
  unsigned* decode_error() { return reinterpret_cast<unsigned*>(static_cast<char*>(pinned.data()) + 32); }
  unsigned* decode_error_on_device = nullptr;  // (the same flag as the kernels address it; found once)
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
  const std::uint64_t temp = grouped ? scan_temp_bytes(bitmap_bytes + 1) : 0;
  // Upper bounds: at most n values are coded, and a block's payload is at most 4 bytes a value.
  w.reserve(round_up(3 * max_blocks) + round_up(4 * n) + look_back_bytes(max_blocks, 1) + round_up(temp) +
            (grouped ? round_up(4 * n) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  out.meta = w.take<std::uint8_t>(3 * max_blocks);
  out.payload = w.take<std::uint8_t>(4 * n);
  const LookBack look_back = w.take_look_back(max_blocks, 1);
  const float* values = x;
  int value_stride = stride;
  out.coded = n;
  out.bitmap_bytes = grouped ? bitmap_bytes : 0;
  if (grouped) {
    void* temp_storage = w.take<std::uint8_t>(temp);
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
  if (out.blocks)
    code_blocks(s, values, out.coded, value_stride, rules, c.block, out.blocks, look_back.part(0, out.meta, out.payload),
                look_back.ticket);
  out.payload_bytes = w.read_back(look_back.totals);
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
  const std::uint64_t blocks = codec::detail::div_up(n, c.block);
  w.reserve(2 * (round_up(3 * blocks) + round_up(4 * n)) + look_back_bytes(blocks, 2));
  for (Impl::Coded& out : w.last) {
    out = Impl::Coded{};
    out.meta = w.take<std::uint8_t>(3 * blocks);
    out.payload = w.take<std::uint8_t>(4 * n);
    out.coded = n;
    out.blocks = blocks;
  }
  const LookBack look_back = w.take_look_back(blocks, 2);
  if (blocks)
    code_pair_blocks(s, reinterpret_cast<const float2*>(x), n, codec::detail::rules_for(c), c.block, blocks,
                     look_back.part(0, w.last[0].meta, w.last[0].payload),
                     look_back.part(1, w.last[1].meta, w.last[1].payload), look_back.ticket);
  auto* host = static_cast<unsigned long long*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, look_back.totals, 2 * sizeof *host, cudaMemcpyDeviceToHost, s));
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

// Workspace for component_blocks: `parts` meta copies and offsets of `blocks` blocks each, and
// the offsets scan's look-back state.
std::uint64_t offsets_items(std::uint64_t blocks, int parts) { return parts * (blocks + 1); }
std::uint64_t offsets_look_back_words(std::uint64_t blocks, int parts) {
  return 1 + (offsets_items(blocks, parts) + kScanTile - 1) / kScanTile;
}
std::uint64_t component_blocks_bytes(std::uint64_t blocks, int parts) {
  return parts * round_up(3 * blocks) + round_up(8 * offsets_items(blocks, parts)) +
         round_up(8 * offsets_look_back_words(blocks, parts));
}

// `parts` components' blocks on the device (cs[k] into out[k]): each one's meta (read where it
// lies in the stream when stored raw, as integrated does; zstd-packed meta comes from the host)
// and its blocks' payload offsets (one scan over all the components' blocks), queued on the
// codec's stream. (The host checked, parsing the stream, that each component's sizes add up to
// its payload.)
void component_blocks(GpuCodec::Impl& w, const codec::detail::StoredComponent* const* cs, int parts,
                      const std::uint8_t* device_stream, std::uint64_t blocks, ComponentBlocks* out) {
  const cudaStream_t s = w.cuda();
  PayloadSize sizes{{nullptr, nullptr}, blocks};
  unsigned long long before = 0;
  for (int k = 0; k < parts; ++k) {
    const codec::detail::StoredComponent& c = *cs[k];
    const std::uint8_t* meta = nullptr;
    if (c.meta_offset != codec::detail::StoredComponent::kPacked) {
      meta = device_stream + c.meta_offset;
    } else {
      auto* copy = w.take<std::uint8_t>(3 * blocks);
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(copy, c.meta.data(), 3 * blocks, cudaMemcpyHostToDevice, s));
      meta = copy;
    }
    sizes.meta[k] = meta;
    out[k] = {device_stream + c.payload_offset, meta, nullptr, before};
    before += c.payload_bytes;
  }
  const std::uint64_t items = offsets_items(blocks, parts), words = offsets_look_back_words(blocks, parts);
  auto* offsets = w.take<unsigned long long>(items);
  for (int k = 0; k < parts; ++k) out[k].offsets = offsets + k * (blocks + 1);  // (its own blocks' entries)
  auto* look_back = w.take_zeroed_words(words);
  offsets_kernel<<<grid_for(items, kScanTile), kScanThreads, 0, s>>>(sizes, items, offsets, look_back, look_back + 1);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

// The decoders' error flag, cleared: in pinned host memory, which the kernels write directly, so
// that neither clearing it nor reading it back takes a copy, only the wait for the stream
// (check_decoded).
unsigned* cleared_decode_error(GpuCodec::Impl& w) {
  unsigned* flag = w.decode_error();
  *flag = 0;  // (no kernel that writes it is in flight: each decode waits for its stream)
  if (!w.decode_error_on_device) {
    void* device = nullptr;
    QSTAGE_CUDA_CHECK(cudaHostGetDevicePointer(&device, flag, 0));
    w.decode_error_on_device = static_cast<unsigned*>(device);
  }
  return w.decode_error_on_device;
}

void check_decoded(GpuCodec::Impl& w) {
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(w.cuda()));  // also the end of the copies from the host vectors
  if (*w.decode_error()) throw codec::FormatError("corrupted block: a block payload does not decode consistently (GPU decoder)");
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
  const std::uint64_t blocks = codec::detail::div_up(n, coding.block);
  w.reserve(component_blocks_bytes(blocks, 2));
  unsigned* error = cleared_decode_error(w);
  const codec::detail::StoredComponent* both[2] = {&re, &im};
  ComponentBlocks k[2];
  component_blocks(w, both, 2, device_stream, blocks, k);
  if (blocks) decode_pair_blocks(w.cuda(), coding.block, k[0], k[1], blocks, n, reinterpret_cast<float2*>(out), 2 * coding.e, error);
  check_decoded(w);
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
  const std::uint64_t temp = grouped ? scan_temp_bytes(bitmap_bytes + 1) : 0;  // (the bitmap's ranks)
  w.reserve(component_blocks_bytes(blocks, 1) +
            (grouped ? round_up(temp) + round_up(4 * c.coded) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  unsigned* error = cleared_decode_error(w);
  const codec::detail::StoredComponent* one[1] = {&c};
  ComponentBlocks k;
  component_blocks(w, one, 1, device_stream, blocks, &k);
  float* kept = grouped ? w.take<float>(c.coded) : nullptr;
  if (blocks)
    decode_blocks(s, coding.block, k, blocks, c.coded, grouped ? kept : out,
                  grouped ? 1 : stride, 2 * coding.e, error);
  if (grouped && n) {
    void* temp_storage = w.take<std::uint8_t>(temp);
    size_t tb = temp;
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
  check_decoded(w);
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
