// Decoding on the GPU: one warp per block. The offsets come from one scan over the sizes of all
// the components' blocks (kernels/scan.cuh's look-back scan, reading the sizes from the meta);
// the bytes a dense block's values repeat from the values before come from one warp scan.
#include "kernels/codec/bit_reader.cuh"
#include "kernels/codec/blocks.cuh"
#include "kernels/scan.cuh"
#include "backend/cuda_check.hpp"

namespace qstage::kernels::codec_gpu {
namespace {

// Block b's state, payload size and where its payload starts.
struct BlockHead {
  const std::uint8_t* in;
  int state, size;
};
__device__ BlockHead block_head(const ComponentBlocks& k, std::uint64_t blocks, std::uint64_t b) {
  return {k.payload + (k.offsets[b] - k.before), k.meta[b], k.meta[blocks + 2 * b] | (k.meta[blocks + 2 * b + 1] << 8)};
}

// The phases of decoding one block, one function per block state. Each is called by the whole
// warp (lane: this lane; base = lane * V, its first value in the block; m: the block's values)
// and returns true if the payload is inconsistent; decode_block tells every lane.

// Zero and constant blocks: every value the same (the host checked the sizes of zero, constant
// and raw blocks while parsing).
template <int V>
__device__ void fill_values(float (&v)[V], float value) {
  for (int j = 0; j < V; ++j) v[j] = value;
}

// A raw block: each value's 32 bits, little-endian.
template <int V>
__device__ void decode_raw(const std::uint8_t* in, int m, int base, float (&v)[V]) {
  for (int j = 0; j < V; ++j) v[j] = base + j < m ? bits_float(get_u32(in + 4 * (base + j))) : 0.0f;
}

// A quantized block: the code width, then each value's zigzagged multiple of `step` in that many
// bits.
template <int V>
__device__ bool decode_quantized(const std::uint8_t* in, int size, int m, int base, double step, float (&v)[V]) {
  const int width = size >= 1 ? in[0] : 0;
  const bool bad = size < 1 || width > 31 || size != quantized_bytes(m, width);
  for (int j = 0; j < V; ++j) v[j] = 0.0f;
  if (bad) return true;
  BitReader codes(in + 1, base * width);
  for (int j = 0; j < V; ++j) v[j] = base + j < m ? dequantize(unzigzag(codes.take(width)), step) : 0.0f;
  return false;
}

// A sparse block: the count of stored values and the bits kept of each, their increasing
// indices, then their kept bytes; every other value is 0. `scratch`: the warp's shared scratch.
template <int V>
__device__ bool decode_sparse(const std::uint8_t* in, int size, int m, int lane, int base, float (&v)[V],
                              float* scratch) {
  const int count = in[0], bits = in[1];
  const int bytes = kept_bytes(bits);
  bool bad = count < 1 || count > m || bits < 9 || bits > 32 || size != 2 + count + count * bytes;
  for (int j = 0; j < V; ++j) v[j] = 0.0f;
  if (bad) return true;
  // Indices must increase within the block.
  for (int s = lane; s < count; s += 32) {
    const int index = in[2 + s];
    if (index >= m || (s > 0 && in[1 + s] >= index)) bad = true;
  }
  bad = __any_sync(kFull, bad);
  if (bad) return true;
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
  return false;
}

// A dense block's 2-bit codes of this lane's V values (value i's at bits 2 (i mod 4) of byte
// i / 4 of the codes, which start at in[5]), value j's at bits 2 j.
template <int V>
__device__ unsigned dense_lane_codes(const std::uint8_t* in, int lane, int code_bytes) {
  unsigned codes = 0;
  if (V == 2) {
    if (lane / 2 < code_bytes) codes = in[5 + lane / 2] >> (4 * (lane & 1));
  } else {
    for (int k = 0; k < V / 4; ++k)
      if (lane * (V / 4) + k < code_bytes) codes |= static_cast<unsigned>(in[5 + lane * (V / 4) + k]) << (8 * k);
  }
  return codes;
}

// Value i's word of a dense block is (word[i-1] & keep_i) | own_i. Maps of that form compose into
// one of the same form, so a warp scan of the lanes' composed maps (lane_own, lane_keep: this
// lane's values' maps composed) gives each lane the word before its first value (0 before the
// block's first).
__device__ inline unsigned dense_word_before_lane(unsigned lane_own, unsigned lane_keep, int lane) {
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
  return w;
}

// A dense block: the middle value, the bits kept of each value, each value's 2-bit count of
// leading bytes it shares with the value before (dense_lane_codes), then the bytes each value
// does not share, in value order (where this lane's start: a warp scan of the lanes' counts).
// On an inconsistent payload the values are left as they were.
template <int V>
__device__ bool decode_dense(const std::uint8_t* in, int size, int m, int lane, int base, float (&v)[V]) {
  const int code_bytes = (m + 3) / 4;
  const float mid = bits_float(get_u32(in));
  const int bits = in[4];
  const int bytes = kept_bytes(bits);
  bool bad = bits < 9 || bits > 32 || size < 5 + code_bytes;
  bad = __any_sync(kFull, bad);
  if (bad) return true;
  const unsigned codes = dense_lane_codes<V>(in, lane, code_bytes);
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
  if (bad) return true;
  // Each value's map: its own stored bytes, and the `lead` leading bytes it keeps of the word
  // before.
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
  unsigned w = dense_word_before_lane(lane_own, lane_keep, lane);
  for (int j = 0; j < V; ++j) {
    w = (w & keep[j]) | own[j];
    v[j] = dense_value(mid, w);
  }
  return false;
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
    case kZero: fill_values(v, 0.0f); break;
    case kConstant: fill_values(v, bits_float(get_u32(in))); break;
    case kRaw: decode_raw(in, m, base, v); break;
    case kQuantized: bad = decode_quantized(in, size, m, base, step, v); break;
    case kSparse: bad = decode_sparse(in, size, m, lane, base, v, scratch); break;
    case kDense: bad = decode_dense(in, size, m, lane, base, v); break;
    default: bad = true;
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

}  // namespace

void scan_payload_offsets(cudaStream_t s, const PayloadSize& sizes, std::uint64_t items, unsigned long long* offsets,
                          unsigned long long* look_back) {
  using qstage::kernels::detail::kScanThreads;
  using qstage::kernels::detail::kScanTile;
  qstage::kernels::detail::look_back_scan_kernel<<<grid_for(items, kScanTile), kScanThreads, 0, s>>>(
      sizes, items, offsets, look_back, look_back + 1);
  QSTAGE_CUDA_CHECK_LAUNCH();
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

}  // namespace qstage::kernels::codec_gpu
