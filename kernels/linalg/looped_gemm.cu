#include <cooperative_groups.h>

#include <algorithm>

#include "backend/cuda_check.hpp"
#include "kernels/block_tree.cuh"
#include "kernels/linalg/looped_gemm.hpp"

namespace qstage::kernels::detail {
namespace {

// The tropical semiring's elements, one thread each (kernels/linalg/tropical.hpp).
__global__ void looped_tropical_kernel(LoopedGemm g, std::uint64_t total) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t e = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    looped_tropical_element(g, e);
}

// One thread per result element, grid-stride; the loop description travels by value.
template <typename Real>
__global__ void looped_gemm_kernel(LoopedGemm g, std::uint64_t total) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t e = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    looped_gemm_element<Real>(g, e);
}

// Short power-of-two sums (k = K) where one operand is small (a gate applied to a large tensor):
// one thread per row of the large operand ("own"), which it reads once. Loop groups in which the
// own operand does not move (the small operand's free modes, scattered through C) are walked
// inside the thread together with the small operand's rows, so each own row yields all its
// results; the other loop groups and the own rows make up the thread index. A block first stages
// its rows through shared memory with coalesced loads, several in flight per thread (a warp
// reading 32 rows of 128 bytes row by row touched 32 lines per instruction). Each result is
// summed over k in order with the same expression as looped_gemm_element (A's value first). One
// thread per result element walked the loop digits per element and read the large operand once
// per result: the gate steps of a 53-qubit circuit slice ran at a tenth of the memory bandwidth.
// Rows up to 16 long are staged whole and kept in registers; longer rows (32, 64) go through in
// columns of 16, each result's sum carried in registers across them (staging whole rows of 64
// left room for 12 warps per SM, and such steps ran at a fifth of the bandwidth).
constexpr int kRowsMaxResults = 64;      // results per thread (small-side rows x inner loop indices)
constexpr int kLongRowsMaxResults = 32;  // the same for rows longer than kRowsColumns
constexpr int kRowsColumns = 16;         // columns staged at a time
struct RowsWalk {
  const void* own = nullptr;
  const void* other = nullptr;
  void* c = nullptr;
  std::int64_t own_count = 1, other_count = 1;
  std::int8_t own_shift = -1;
  // Where result (own row u, other row o) sits in C: u * own_c + o * other_c.
  std::int64_t own_c = 1, other_c = 1;
  // The thread index's loop groups (innermost first) and the inner ones (own stride 0).
  int outer = 0, inner = 0;
  std::int64_t outer_extent[kMaxLoopGroups] = {}, outer_own[kMaxLoopGroups] = {},
               outer_other[kMaxLoopGroups] = {}, outer_c[kMaxLoopGroups] = {};
  std::int8_t outer_shift[kMaxLoopGroups] = {};
  std::int64_t inner_extent[kMaxLoopGroups] = {}, inner_other[kMaxLoopGroups] = {}, inner_c[kMaxLoopGroups] = {};
  std::int8_t inner_shift[kMaxLoopGroups] = {};
  std::uint64_t rows = 0, inner_total = 1;
};

// Rows of a block with odd strides in shared memory (in elements): reads of one column by the
// threads of a warp then fall in distinct banks.
constexpr int padded_row(int k) { return k | 1; }
// Threads (rows) per block: 256, fewer for long staged rows (the tile stays near 32 KiB).
template <typename Real, int Columns>
constexpr unsigned rows_block() {
  constexpr unsigned fit = 32768 / (Columns * sizeof(Complex<Real>));
  return fit < 256 ? fit : 256;
}

// Thread row r's offsets: its own row (row length k), the small operand's and C's at its loop index.
struct RowOffsets {
  std::int64_t own, other, c;
};
__device__ RowOffsets row_offsets(const RowsWalk& w, std::uint64_t r, std::int64_t k) {
  std::uint64_t rest = r;
  const std::int64_t own = next_digit(rest, w.own_count, w.own_shift);
  RowOffsets at{own * k, 0, own * w.own_c};
  for (int d = 0; d < w.outer; ++d) {
    const std::int64_t digit = next_digit(rest, w.outer_extent[d], w.outer_shift[d]);
    at.own += digit * w.outer_own[d];
    at.other += digit * w.outer_other[d];
    at.c += digit * w.outer_c[d];
  }
  return at;
}

// Thread row r of a tile: false past the last row; else its offsets, its own row's also in
// row_at[threadIdx.x] (where the tile's loader finds it).
__device__ bool tile_row(const RowsWalk& w, std::uint64_t r, std::int64_t k, std::int64_t* row_at, RowOffsets& at) {
  if (r >= w.rows) return false;
  at = row_offsets(w, r, k);
  row_at[threadIdx.x] = at.own;
  return true;
}

// Inner loop index q's offsets in the small operand and in C.
__device__ void inner_offsets(const RowsWalk& w, std::uint64_t q, std::int64_t& other, std::int64_t& c) {
  for (int d = 0; d < w.inner; ++d) {
    const std::int64_t digit = next_digit(q, w.inner_extent[d], w.inner_shift[d]);
    other += digit * w.inner_other[d];
    c += digit * w.inner_c[d];
  }
}

// Columns [first, first + W) of the block's rows (starting at row_at[]) into stage, W per row
// (padded); `left` rows are live. A full tile issues all W loads of a thread before storing.
template <typename Real, int W, unsigned T>
__device__ void stage_columns(const Complex<Real>* own, const std::int64_t* row_at, std::int64_t first,
                              std::uint64_t left, Complex<Real>* stage) {
  if (left >= T) {
    Complex<Real> loaded[W];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const unsigned x = threadIdx.x + j * T;
      loaded[j] = own[row_at[x / W] + first + x % W];
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const unsigned x = threadIdx.x + j * T;
      stage[(x / W) * padded_row(W) + x % W] = loaded[j];
    }
  } else {
    for (unsigned x = threadIdx.x; x < left * W; x += T)
      stage[(x / W) * padded_row(W) + x % W] = own[row_at[x / W] + first + x % W];
  }
}

// x · y added to (re, im) in the order of looped_gemm_element.
template <typename Real>
__device__ void multiply_add(Complex<Real> x, Complex<Real> y, Real& re, Real& im) {
  re += x.re * y.re - x.im * y.im;
  im += x.re * y.im + x.im * y.re;
}

// The sum over p < W of mine[p] · theirs[p] (own operand A) or theirs[p] · mine[p], added to
// (re, im) in order. Pairs: theirs is 16-byte aligned and complex64, read two values a load (one
// load for every eight multiply-adds instead of four: big's k = 32 steps 22 -> 26 % of the copy
// rate, n53m20's slowest 61 -> 71 % on an H100, with Complex aligned, docs/benchmarks.md).
template <typename Real, int W, bool OwnIsA, bool Pairs>
__device__ void dot_row(const Complex<Real>* mine, const Complex<Real>* theirs, Real& re, Real& im) {
  if constexpr (Pairs) {
    static_assert(sizeof(Real) == 4 && W % 2 == 0, "pairs of complex64 values");
    const float4* two = reinterpret_cast<const float4*>(theirs);
#pragma unroll
    for (int p = 0; p < W; p += 2) {
      const float4 v = two[p / 2];
      const Complex<Real> t0{v.x, v.y}, t1{v.z, v.w};
      multiply_add(OwnIsA ? mine[p] : t0, OwnIsA ? t0 : mine[p], re, im);
      multiply_add(OwnIsA ? mine[p + 1] : t1, OwnIsA ? t1 : mine[p + 1], re, im);
    }
  } else {
#pragma unroll
    for (int p = 0; p < W; ++p) multiply_add(OwnIsA ? mine[p] : theirs[p], OwnIsA ? theirs[p] : mine[p], re, im);
  }
}

template <typename Real, int K, bool OwnIsA, bool Pairs>
__global__ void __launch_bounds__(rows_block<Real, K>()) looped_gemm_rows_kernel(RowsWalk w) {
  constexpr unsigned T = rows_block<Real, K>();
  __shared__ Complex<Real> stage[T * padded_row(K)];
  __shared__ std::int64_t row_at[T];
  const auto* own_data = static_cast<const Complex<Real>*>(w.own);
  const auto* other_data = static_cast<const Complex<Real>*>(w.other);
  auto* c_data = static_cast<Complex<Real>*>(w.c);
  for (std::uint64_t tile = blockIdx.x; tile * T < w.rows; tile += gridDim.x) {
    RowOffsets at{};
    const bool live = tile_row(w, tile * T + threadIdx.x, K, row_at, at);
    __syncthreads();
    stage_columns<Real, K, T>(own_data, row_at, 0, w.rows - tile * T, stage);
    __syncthreads();
    if (live) {
      Complex<Real> mine[K];
#pragma unroll
      for (int p = 0; p < K; ++p) mine[p] = stage[threadIdx.x * padded_row(K) + p];
      for (std::uint64_t q = 0; q < w.inner_total; ++q) {
        std::int64_t other_q = at.other, c_q = at.c;
        inner_offsets(w, q, other_q, c_q);
        for (std::int64_t o = 0; o < w.other_count; ++o) {
          Real re = 0, im = 0;
          dot_row<Real, K, OwnIsA, Pairs>(mine, other_data + other_q + o * K, re, im);
          c_data[c_q + o * w.other_c] = Complex<Real>{re, im};
        }
      }
    }
    __syncthreads();  // (the next tile overwrites stage and row_at)
  }
}

// Rows longer than kRowsColumns: the block's rows go through shared memory kRowsColumns columns
// at a time; each thread carries its results' sums (at most R: 16, or 32 where that many fit
// the step) in registers. The results' offsets relative to the thread's loop index are the same
// for every thread. At 32 results a value read (16 flops a byte) the sums, not the loads, bound
// these steps (about a fifth of the FP32 rate on an H100): staging the next columns by cp.async
// into a second buffer while these are summed gained nothing and was not kept.
template <typename Real, int K, int R, bool OwnIsA, bool Pairs>
__global__ void __launch_bounds__(rows_block<Real, kRowsColumns>()) looped_gemm_long_rows_kernel(RowsWalk w) {
  constexpr int W = kRowsColumns;
  constexpr unsigned T = rows_block<Real, W>();
  __shared__ Complex<Real> stage[T * padded_row(W)];
  __shared__ std::int64_t row_at[T];
  __shared__ std::int64_t result_other[R], result_c[R];
  const auto* own_data = static_cast<const Complex<Real>*>(w.own);
  const auto* other_data = static_cast<const Complex<Real>*>(w.other);
  auto* c_data = static_cast<Complex<Real>*>(w.c);
  const int results = static_cast<int>(w.inner_total * static_cast<std::uint64_t>(w.other_count));
  if (threadIdx.x < static_cast<unsigned>(results)) {
    const std::uint64_t q = threadIdx.x / static_cast<std::uint64_t>(w.other_count);
    const std::int64_t o = threadIdx.x % w.other_count;
    std::int64_t other = o * K, c = o * w.other_c;
    inner_offsets(w, q, other, c);
    result_other[threadIdx.x] = other;
    result_c[threadIdx.x] = c;
  }
  for (std::uint64_t tile = blockIdx.x; tile * T < w.rows; tile += gridDim.x) {
    RowOffsets at{};
    const bool live = tile_row(w, tile * T + threadIdx.x, K, row_at, at);
    Real re[R], im[R];
#pragma unroll
    for (int x = 0; x < R; ++x) re[x] = im[x] = 0;
    for (int first = 0; first < K; first += W) {
      __syncthreads();  // (row_at written; the previous columns read)
      stage_columns<Real, W, T>(own_data, row_at, first, w.rows - tile * T, stage);
      __syncthreads();
      if (live) {
        Complex<Real> mine[W];
#pragma unroll
        for (int p = 0; p < W; ++p) mine[p] = stage[threadIdx.x * padded_row(W) + p];
#pragma unroll
        for (int x = 0; x < R; ++x) {
          if (x < results) dot_row<Real, W, OwnIsA, Pairs>(mine, other_data + at.other + result_other[x] + first, re[x], im[x]);
        }
      }
    }
    if (live) {
#pragma unroll
      for (int x = 0; x < R; ++x)
        if (x < results) c_data[at.c + result_c[x]] = Complex<Real>{re[x], im[x]};
    }
    __syncthreads();  // (the next tile overwrites row_at)
  }
}

// The walk for g with the own operand A (own_is_a) or B, at most max_results results per
// thread; false where the rows kernel does not apply (more results than that even without
// inner loop groups).
bool rows_walk(const LoopedGemm& g, bool own_is_a, std::int64_t max_results, RowsWalk& w) {
  w.own = own_is_a ? g.a : g.b;
  w.other = own_is_a ? g.b : g.a;
  w.c = g.c;
  w.own_count = own_is_a ? g.m : g.n;
  w.other_count = own_is_a ? g.n : g.m;
  w.own_shift = own_is_a ? g.m_shift : g.n_shift;
  w.own_c = own_is_a ? g.n : 1;
  w.other_c = own_is_a ? 1 : g.n;
  if (w.other_count > max_results) return false;
  std::int64_t results = w.other_count;
  w.rows = static_cast<std::uint64_t>(w.own_count);
  for (int d = g.groups - 1; d >= 0; --d) {  // innermost first
    const std::int64_t own_stride = own_is_a ? g.stride_a[d] : g.stride_b[d];
    const std::int64_t other_stride = own_is_a ? g.stride_b[d] : g.stride_a[d];
    if (own_stride == 0 && results * g.extent[d] <= max_results) {
      results *= g.extent[d];
      w.inner_extent[w.inner] = g.extent[d], w.inner_shift[w.inner] = g.shift[d];
      w.inner_other[w.inner] = other_stride, w.inner_c[w.inner] = g.stride_c[d];
      w.inner_total *= static_cast<std::uint64_t>(g.extent[d]);
      ++w.inner;
    } else {
      w.outer_extent[w.outer] = g.extent[d], w.outer_shift[w.outer] = g.shift[d];
      w.outer_own[w.outer] = own_stride, w.outer_other[w.outer] = other_stride, w.outer_c[w.outer] = g.stride_c[d];
      w.rows *= static_cast<std::uint64_t>(g.extent[d]);
      ++w.outer;
    }
  }
  return true;
}

// The own operand is the one with more distinct elements (the large tensor, read once).
std::uint64_t footprint(const LoopedGemm& g, bool of_a) {
  std::uint64_t elements = static_cast<std::uint64_t>((of_a ? g.m : g.n) * g.k);
  for (int d = 0; d < g.groups; ++d)
    if ((of_a ? g.stride_a[d] : g.stride_b[d]) != 0) elements *= static_cast<std::uint64_t>(g.extent[d]);
  return elements;
}

template <typename Real, int K, bool Pairs>
void launch_rows_kernel(const RowsWalk& w, bool own_is_a, cudaStream_t stream) {
  constexpr bool long_rows = K > kRowsColumns;
  constexpr unsigned threads = rows_block<Real, long_rows ? kRowsColumns : K>();
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((w.rows + threads - 1) / threads, 1u << 20));
  if constexpr (long_rows) {
    constexpr int R = kLongRowsMaxResults;
    const bool few = w.inner_total * static_cast<std::uint64_t>(w.other_count) <= R / 2;
    if (own_is_a && few) looped_gemm_long_rows_kernel<Real, K, R / 2, true, Pairs><<<blocks, threads, 0, stream>>>(w);
    else if (own_is_a) looped_gemm_long_rows_kernel<Real, K, R, true, Pairs><<<blocks, threads, 0, stream>>>(w);
    else if (few) looped_gemm_long_rows_kernel<Real, K, R / 2, false, Pairs><<<blocks, threads, 0, stream>>>(w);
    else looped_gemm_long_rows_kernel<Real, K, R, false, Pairs><<<blocks, threads, 0, stream>>>(w);
  } else {
    if (own_is_a) looped_gemm_rows_kernel<Real, K, true, Pairs><<<blocks, threads, 0, stream>>>(w);
    else looped_gemm_rows_kernel<Real, K, false, Pairs><<<blocks, threads, 0, stream>>>(w);
  }
}

// Whether every value the rows kernel reads of the small operand starts a 16-byte aligned pair
// (complex64, K even, the operand's start and all its strides even).
template <typename Real>
bool other_in_pairs(const RowsWalk& w, std::int64_t k) {
  if (sizeof(Real) != 4 || k % 2 != 0 || reinterpret_cast<std::uintptr_t>(w.other) % 16 != 0) return false;
  for (int d = 0; d < w.outer; ++d)
    if (w.outer_other[d] % 2 != 0) return false;
  for (int d = 0; d < w.inner; ++d)
    if (w.inner_other[d] % 2 != 0) return false;
  return true;
}

template <typename Real, int K>
void launch_rows(const RowsWalk& w, bool own_is_a, cudaStream_t stream) {
  if constexpr (sizeof(Real) == 4 && K % 2 == 0) {
    if (other_in_pairs<Real>(w, K)) return launch_rows_kernel<Real, K, true>(w, own_is_a, stream);
  }
  launch_rows_kernel<Real, K, false>(w, own_is_a, stream);
}

// Whether the rows kernel takes g, and launches it.
template <typename Real>
bool try_rows(const LoopedGemm& g, cudaStream_t stream) {
  if (g.k > kLoopedRowsMaxSum || (g.k & (g.k - 1)) != 0) return false;
  const std::int64_t max_results = g.k > kRowsColumns ? kLongRowsMaxResults : kRowsMaxResults;
  bool own_is_a = footprint(g, true) >= footprint(g, false);
  RowsWalk w;
  if (!rows_walk(g, own_is_a, max_results, w)) {
    own_is_a = !own_is_a;  // the large operand has too many rows: walk the small one's
    w = RowsWalk{};
    if (!rows_walk(g, own_is_a, max_results, w)) return false;
  }
  switch (g.k) {
    case 1: launch_rows<Real, 1>(w, own_is_a, stream); break;
    case 2: launch_rows<Real, 2>(w, own_is_a, stream); break;
    case 4: launch_rows<Real, 4>(w, own_is_a, stream); break;
    case 8: launch_rows<Real, 8>(w, own_is_a, stream); break;
    case 16: launch_rows<Real, 16>(w, own_is_a, stream); break;
    case 32: launch_rows<Real, 32>(w, own_is_a, stream); break;
    default: launch_rows<Real, 64>(w, own_is_a, stream); break;
  }
  return true;
}

// Long sums (k >= 32): one warp per result element. Lanes read consecutive k (coalesced: K is
// the operands' trailing block) and combine in a fixed butterfly, so the bits do not depend on
// the launch shape.
template <typename Real>
__global__ void looped_gemm_warp_kernel(LoopedGemm g, std::uint64_t total) {
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t warps = std::uint64_t(gridDim.x) * (blockDim.x / 32);
  for (std::uint64_t e = (std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; e < total; e += warps) {
    const ElementAt at = element_at(g, e);
    const auto* x = static_cast<const Complex<Real>*>(g.a) + at.a + at.i * g.k;
    const auto* y = static_cast<const Complex<Real>*>(g.b) + at.b + at.j * g.k;
    Real re = 0, im = 0;
    for (std::int64_t p = lane; p < g.k; p += 32) {
      const Complex<Real> u = x[p], v = y[p];
      re += u.re * v.re - u.im * v.im;
      im += u.re * v.im + u.im * v.re;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      re += __shfl_xor_sync(0xffffffffu, re, offset);
      im += __shfl_xor_sync(0xffffffffu, im, offset);
    }
    if (lane == 0) static_cast<Complex<Real>*>(g.c)[at.c + at.i * g.n + at.j] = Complex<Real>{re, im};
  }
}

// Very long sums (k >= kBlockSum) over few result elements (a step that reduces two large
// tensors to a handful of numbers). cuBLAS ran such a batch of 2 x 2 x 2^21 products at 1/600 of
// memory bandwidth (one CTA per product). Here each element gets a cluster of kSumBlocks blocks
// (Hopper's thread-block clusters) where the device has them: thread t of block r sums
// k = (r T + t), (r T + t) + kClusterBlocks T, ... in order, each block adds its threads' sums in a
// fixed tree in shared memory, and block 0 adds the blocks' sums in rank order, reading them from
// the other blocks' shared memory. One block per element left most SMs idle (a 8 x 4 x 2^26 step
// of a 53-qubit slice: 32 blocks on 132 SMs, 21 ms against a 2.6 ms bound). Older devices run one
// block per element (the same sums with one block), so their last bits may differ.
constexpr int kBlockSumThreads = 1024;
constexpr int kClusterBlocks = 8;

// This block's share of element e's sum (rank r of `blocks`), left in sum_re[0] and sum_im[0].
template <typename Real>
__device__ void block_share(const LoopedGemm& g, const ElementAt& at, unsigned rank, unsigned blocks, Real* sum_re,
                            Real* sum_im) {
  const auto* x = static_cast<const Complex<Real>*>(g.a) + at.a + at.i * g.k;
  const auto* y = static_cast<const Complex<Real>*>(g.b) + at.b + at.j * g.k;
  Real re = 0, im = 0;
  const std::int64_t step = std::int64_t{blocks} * kBlockSumThreads;
  for (std::int64_t p = std::int64_t{rank} * kBlockSumThreads + threadIdx.x; p < g.k; p += step) {
    const Complex<Real> u = x[p], v = y[p];
    re += u.re * v.re - u.im * v.im;
    im += u.re * v.im + u.im * v.re;
  }
  sum_re[threadIdx.x] = re;
  sum_im[threadIdx.x] = im;
  block_tree<kBlockSumThreads>([&](unsigned to, unsigned from) {
    sum_re[to] += sum_re[from];
    sum_im[to] += sum_im[from];
  });
}

template <typename Real>
__global__ void __launch_bounds__(kBlockSumThreads) looped_gemm_block_kernel(LoopedGemm g, std::uint64_t total) {
  __shared__ Real sum_re[kBlockSumThreads], sum_im[kBlockSumThreads];
  for (std::uint64_t e = blockIdx.x; e < total; e += gridDim.x) {
    const ElementAt at = element_at(g, e);
    block_share<Real>(g, at, 0, 1, sum_re, sum_im);
    if (threadIdx.x == 0) static_cast<Complex<Real>*>(g.c)[at.c + at.i * g.n + at.j] = Complex<Real>{sum_re[0], sum_im[0]};
    __syncthreads();
  }
}

template <typename Real>
__global__ void __launch_bounds__(kBlockSumThreads) looped_gemm_cluster_kernel(LoopedGemm g, std::uint64_t total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ Real sum_re[kBlockSumThreads], sum_im[kBlockSumThreads];
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const std::uint64_t clusters = gridDim.x / kClusterBlocks;
  for (std::uint64_t e = blockIdx.x / kClusterBlocks; e < total; e += clusters) {  // (the same e in a cluster)
    const ElementAt at = element_at(g, e);
    block_share<Real>(g, at, rank, kClusterBlocks, sum_re, sum_im);
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
      Real re = 0, im = 0;
      for (int b = 0; b < kClusterBlocks; ++b) {
        re += *cluster.map_shared_rank(&sum_re[0], b);
        im += *cluster.map_shared_rank(&sum_im[0], b);
      }
      static_cast<Complex<Real>*>(g.c)[at.c + at.i * g.n + at.j] = Complex<Real>{re, im};
    }
    cluster.sync();  // (block 0 has read the others' sums before they are overwritten)
  }
#endif
}

// Whether this build has the cluster kernel for the current device (compiled for sm_90 or later,
// and the device runs it).
bool clusters_available() {
  static const bool available = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9)
      return false;
    cudaFuncAttributes attributes{};
    if (cudaFuncGetAttributes(&attributes, looped_gemm_cluster_kernel<float>) != cudaSuccess) return false;
    return attributes.binaryVersion >= 90;
  }();
  return available;
}

template <typename Real>
void launch_long_sums(const LoopedGemm& g, std::uint64_t total, cudaStream_t stream) {
  if (!clusters_available()) {
    const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>(total, 1u << 20));
    looped_gemm_block_kernel<Real><<<blocks, kBlockSumThreads, 0, stream>>>(g, total);
    return;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min<std::uint64_t>(total, 1u << 16) * kClusterBlocks));
  config.blockDim = dim3(kBlockSumThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kClusterBlocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  QSTAGE_CUDA_CHECK(cudaLaunchKernelEx(&config, looped_gemm_cluster_kernel<Real>, g, total));
}

}  // namespace

void looped_gemm_cuda(void* cuda_stream, const LoopedGemm& g) {
  const std::uint64_t total = g.loops() * static_cast<std::uint64_t>(g.m * g.n);
  if (total == 0) return;
  constexpr unsigned threads = 256;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (g.semiring == Semiring::tropical) {
    const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((total + threads - 1) / threads, 1u << 20));
    looped_tropical_kernel<<<blocks, threads, 0, stream>>>(g, total);
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  if (g.k >= kLoopedBlockSum) {
    if (g.dtype == DType::complex64) launch_long_sums<float>(g, total, stream);
    else launch_long_sums<double>(g, total, stream);
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  if (g.dtype == DType::complex64 ? try_rows<float>(g, stream) : try_rows<double>(g, stream)) {
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool warp = g.k >= 32;
  const std::uint64_t workers = warp ? total * 32 : total;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((workers + threads - 1) / threads, 1u << 20));
  if (warp && g.dtype == DType::complex64) looped_gemm_warp_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else if (warp) looped_gemm_warp_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  else if (g.dtype == DType::complex64) looped_gemm_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else looped_gemm_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
