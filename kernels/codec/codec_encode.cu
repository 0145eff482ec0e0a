// Coding on the GPU: one warp per block, each lane holding V = block / 32 consecutive values.
// Coding takes one pass over the data: each warp chooses its block's state and size
// (kernels/codec/choose.cuh), the CTA finds where its blocks' payloads start from the tiles
// before it (a decoupled look-back, kernels/scan.cuh: exact integer sums, so the same offsets on
// every run), and each warp writes its payload there (no atomics whose order matters: quantized
// and dense payloads are ORed together in shared memory, which commutes), so the bytes are those
// of the CPU twin, codec/block_coder.cpp, on every run.
#include "kernels/codec/bit_writer.cuh"
#include "kernels/codec/blocks.cuh"
#include "kernels/codec/choose.cuh"
#include "kernels/scan.cuh"
#include "backend/cuda_check.hpp"

namespace qstage::kernels::codec_gpu {
namespace {

using qstage::kernels::detail::kTileAggregate;
using qstage::kernels::detail::kTilePrefix;
using qstage::kernels::detail::publish_tile;
using qstage::kernels::detail::tile_offset;

template <int V>
__device__ void record_choice(const Choice<V>& c, std::uint64_t b, std::uint64_t blocks, std::uint8_t* meta) {
  if (lane_id() != 0) return;
  meta[b] = static_cast<std::uint8_t>(c.state);
  meta[blocks + 2 * b] = static_cast<std::uint8_t>(c.size);
  meta[blocks + 2 * b + 1] = static_cast<std::uint8_t>(c.size >> 8);
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
      for (int j = 0; j < V; ++j) nonzero += h.has(j) && stored_in_sparse(h.y[j]);
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
        if (!h.has(j) || !stored_in_sparse(h.y[j])) continue;
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

}  // namespace

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

}  // namespace qstage::kernels::codec_gpu
