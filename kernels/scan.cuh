#pragma once
// The device side of kernels/scan.hpp, for kernels that build on it (device code only):
//  - the decoupled look-back over tiles (tile_offset), which a kernel may run on its own tiles
//    (the codec's coder finds its payload offsets with it in the pass that sizes them);
//  - look_back_scan_kernel, an exclusive scan of the counts a functor gives, in one kernel;
//  - the compaction kernels (flags with any predicate, compact, expand).
// Templates only: each kernel instance lives in the .cu that launches it.
#include <cuda/atomic>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kernels/scan.hpp"
#include "kernels/warp.cuh"

namespace qstage::kernels::detail {

// A kernel's items form tiles, one a CTA, and a tile's offset (the sum of the counts of all
// tiles before it) comes from a decoupled look-back (Merrill and Garland, "Single-pass parallel
// prefix scan with decoupled look-back", 2016) over the tiles before it. Each tile publishes
// one word, flag and value together: first its own sum of counts, then its inclusive prefix. Sums
// of integers are exact, so the offsets are those of a separate scan on every run. Tiles are
// numbered in the order CTAs start (a ticket), so every tile a CTA waits for has started, and
// a tile publishes its own sum before it waits for any other: no CTA waits forever.
constexpr unsigned long long kTileAggregate = 1ull << 62, kTilePrefix = 2ull << 62, kTileValue = (1ull << 62) - 1;

__device__ inline unsigned long long tile_word(unsigned long long* tiles, long long t) {
  if (t < 0) return kTilePrefix;  // before the first tile: a prefix of 0
  return cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(tiles[t]).load(cuda::memory_order_relaxed);
}
// Publishes tile t's word: kTileAggregate | its own sum (kTilePrefix | it, for tile 0), then
// tile_offset's kTilePrefix | inclusive prefix. `tiles`: one zeroed word a tile.
__device__ inline void publish_tile(unsigned long long* tiles, std::uint64_t t, unsigned long long word) {
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(tiles[t]).store(word, cuda::memory_order_relaxed);
}

// Called by one whole warp, after the tile published its own sum `aggregate`: the sum of the
// counts of all tiles before `tile`, then published with it as the tile's inclusive prefix.
__device__ inline unsigned long long tile_offset(unsigned long long* tiles, std::uint64_t tile, unsigned long long aggregate) {
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

// The exclusive scan of `items` counts into offsets, in one kernel: each CTA scans a tile of
// kScanTile counts (count(i): the i-th) and finds where it starts from the tiles before it (the
// decoupled look-back; `ticket` and `tiles` zeroed: scan_scratch_words(items) words in all,
// launched on grid_for(items, kScanTile) CTAs of kScanThreads). A CUB device scan does the same
// in two kernels, and its dispatch alone took 11-17 us of host time a call on an H200, as long
// as its kernels ran (docs/benchmarks.md, "Decoding: its fixed costs").
template <typename Count>
__global__ void __launch_bounds__(kScanThreads)
    look_back_scan_kernel(Count sizes, std::uint64_t items, unsigned long long* offsets, unsigned long long* ticket,
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

// Stream compaction (kernels/scan.hpp): one thread per bitmap byte or item, 256 to a CTA.
constexpr unsigned kCompactThreads = 256;

// Bitmap bytes (8 items each: bit k of byte j where flag(x[(8 j + k) stride])) and their popcounts.
template <typename T, typename Flag>
__global__ void flag_kernel(const T* x, std::uint64_t n, int stride, Flag flag, std::uint8_t* bitmap,
                            unsigned long long* counts) {
  const std::uint64_t j = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= (n + 7) / 8) return;
  unsigned byte = 0;
  for (int k = 0; k < 8; ++k) {
    const std::uint64_t i = 8 * j + k;
    if (i < n && flag(x[i * stride])) byte |= 1u << k;
  }
  bitmap[j] = static_cast<std::uint8_t>(byte);
  counts[j] = static_cast<unsigned long long>(__popc(byte));
}

// Whether item i is flagged, and if it is, its rank among the flagged items in `rank` (how many
// flagged items come before it: its place among the kept values). ranks[j]: the flagged items
// before bitmap byte j (the exclusive scan of flag_kernel's counts); read only for a flagged item.
__device__ inline bool flagged_rank(const std::uint8_t* bitmap, const unsigned long long* ranks, std::uint64_t i,
                                    unsigned long long& rank) {
  const unsigned byte = bitmap[i / 8], bit = static_cast<unsigned>(i % 8);
  if (!((byte >> bit) & 1u)) return false;
  rank = ranks[i / 8] + __popc(byte & ((1u << bit) - 1u));
  return true;
}

// kept[rank of item i] = x[i * stride] for each flagged item i < n.
template <typename T>
__global__ void compact_kernel(const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                               const unsigned long long* ranks, T* kept) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long rank;
  if (flagged_rank(bitmap, ranks, i, rank)) kept[rank] = x[i * stride];
}

// out[i * stride] = the kept value of item i < n if flagged, else T{}.
template <typename T>
__global__ void expand_kernel(const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                              const unsigned long long* ranks, T* out) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long rank;
  out[i * stride] = flagged_rank(bitmap, ranks, i, rank) ? kept[rank] : T{};
}

// Queues flag_kernel on grid_for(bytes + 1) CTAs (bytes = (n + 7) / 8; as the codec launches it).
template <typename T, typename Flag>
void launch_flags(cudaStream_t s, const T* x, std::uint64_t n, int stride, Flag flag, std::uint8_t* bitmap,
                  unsigned long long* counts) {
  const std::uint64_t bytes = (n + 7) / 8;
  flag_kernel<<<grid_for(bytes + 1, kCompactThreads), kCompactThreads, 0, s>>>(x, n, stride, flag, bitmap, counts);
}

}  // namespace qstage::kernels::detail
