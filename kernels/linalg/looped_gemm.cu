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

// Gate steps: a small operand (a gate with its free modes: at most kTileSmall values) applied to
// every row of a large one, sums of 8 to 64 over k, at least kTileResults results a row, the small
// operand the same for every row (no loop group moves both). In the rows kernels each thread
// summed one row's results reading the small operand from L1 for every two multiply-adds, and the
// compiler's complex product took seven instructions where four fused multiply-adds do: big's
// k = 32 steps ran at 26-32 % of the copy rate, its k = 16 steps at 63-69 % (H100). Here a block
// keeps the small operand in shared memory for all its tiles, laid out by k so that a result
// group's values for one k are adjacent; a tile of `rows` large rows comes in `width` columns at
// a time by cp.async into two stages (the next columns load while these are summed); each thread
// carries kTileResults results of kTileRows rows (16 sums in registers): a value of the small
// operand (read two at a time, one address for the whole warp) feeds kTileRows products, a staged
// value kTileResults. Measured on an H100 (docs/benchmarks.md): big's k = 32 steps at 58-63 % of
// the copy rate, k = 16 at 85-90 %. Registers bounded for 3 blocks an SM spilled and ran 1.2-1.9x
// slower. Each sum runs over k in order as a chain of fused multiply-adds: the bits do not depend
// on the launch shape (they differ in the last place from the rows kernels').
constexpr int kTileThreads = 256;
constexpr int kTileResults = 8;   // results a thread carries for each of its rows
constexpr int kTileRows = 2;      // rows a thread carries
constexpr int kTileSmall = 1024;  // the small operand's values kept in shared memory, at most
constexpr int kTileStage = 2048;  // values staged a tile and chunk of columns (more where that is under 8 columns)
constexpr int kTileBlocks = 2;    // blocks an SM the registers are bounded for
constexpr int kTileMinSum = 8, kTileMaxSum = 64;

// G result groups of kTileResults; the other threads of a group split the tile's rows.
template <int K, int G>
struct TileShape {
  static constexpr int lanes = kTileThreads / G;  // threads of a result group
  static constexpr int rows = lanes * kTileRows;
  static constexpr int width = K < kTileStage / rows ? K : kTileStage / rows < 8 ? 8 : kTileStage / rows;
  static constexpr int padded = width + 1;  // (odd: one column's reads fall in distinct banks)
  static constexpr int results = G * kTileResults;
  static constexpr std::size_t shared_bytes =
      (std::size_t{K} * results + 2 * std::size_t{rows} * padded) * sizeof(Complex<float>) +
      (2 * std::size_t{rows} + results) * sizeof(std::int64_t);
};

// x · y added to (re, im) by four fused multiply-adds, in a fixed order.
__device__ __forceinline__ void fused_multiply_add(Complex<float> x, Complex<float> y, float& re, float& im) {
  re = __fmaf_rn(x.re, y.re, re);
  re = __fmaf_rn(-x.im, y.im, re);
  im = __fmaf_rn(x.re, y.im, im);
  im = __fmaf_rn(x.im, y.re, im);
}

// One value (8 bytes) copied from global to shared memory without passing through registers
// (Ampere's cp.async): a tile's next columns load while these are summed.
__device__ __forceinline__ void copy_async(void* to, const void* from) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto shared = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared), "l"(from));
#else
  *static_cast<Complex<float>*>(to) = *static_cast<const Complex<float>*>(from);
#endif
}
__device__ __forceinline__ void copies_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits for this thread's copies but the last `pending` groups.
template <int Pending>
__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

template <int K, int G, bool OwnIsA>
__global__ void __launch_bounds__(kTileThreads, kTileBlocks) looped_gemm_tiles_kernel(RowsWalk w, int results) {
  using S = TileShape<K, G>;
  using C = Complex<float>;
  constexpr int chunks = K / S::width;
  constexpr int stage_size = S::rows * S::padded;
  extern __shared__ float4 tile_memory[];
  C* small = reinterpret_cast<C*>(tile_memory);  // [K][S::results]: result q's value at k = p
  C* stages = small + K * S::results;            // 2 x [S::rows][S::padded]
  auto* row_at = reinterpret_cast<std::int64_t*>(stages + 2 * stage_size);  // 2 x [S::rows]
  std::int64_t* result_c = row_at + 2 * S::rows;
  const auto* own = static_cast<const C*>(w.own);
  const auto* other = static_cast<const C*>(w.other);
  auto* c_data = static_cast<C*>(w.c);
  for (int x = threadIdx.x; x < K * S::results; x += kTileThreads) {
    const int p = x / S::results, q = x % S::results;
    C v{0, 0};
    if (q < results) {
      const std::int64_t o = q % w.other_count;
      std::int64_t at = o * K, c = o * w.other_c;
      inner_offsets(w, static_cast<std::uint64_t>(q / w.other_count), at, c);
      v = other[at + p];
      if (p == 0) result_c[q] = c;
    }
    small[x] = v;
  }
  // Units (tile, chunk of columns) in order; unit u's columns go to stage u % 2, tile t's row
  // offsets to row_at[t % 2].
  const std::uint64_t tiles = (w.rows + S::rows - 1) / S::rows;
  if (blockIdx.x >= tiles) return;
  const std::uint64_t my_tiles = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const std::uint64_t units = my_tiles * chunks;
  auto tile_of = [&](std::uint64_t u) { return blockIdx.x + (u / chunks) * gridDim.x; };
  auto rows_of = [&](std::uint64_t u) {
    for (int x = threadIdx.x; x < S::rows; x += kTileThreads) {
      const std::uint64_t row = tile_of(u) * S::rows + x;
      if (row < w.rows) row_at[((u / chunks) % 2) * S::rows + x] = row_offsets(w, row, K).own;
    }
  };
  auto load = [&](std::uint64_t u) {
    const std::uint64_t first_row = tile_of(u) * S::rows;
    const int first = static_cast<int>(u % chunks) * S::width;
    const std::int64_t* at = row_at + ((u / chunks) % 2) * S::rows;
    C* stage = stages + (u % 2) * stage_size;
#pragma unroll
    for (int j = 0; j < S::rows * S::width / kTileThreads; ++j) {
      const int x = static_cast<int>(threadIdx.x) + j * kTileThreads;
      const int row = x / S::width, col = x % S::width;
      C* to = stage + row * S::padded + col;
      if (first_row + row < w.rows)
        copy_async(to, own + at[row] + first + col);
      else
        *to = C{0, 0};
    }
    copies_commit();
  };
  const int group = static_cast<int>(threadIdx.x) / S::lanes, lane = static_cast<int>(threadIdx.x) % S::lanes;
  std::int64_t row_c[kTileRows];
  float re[kTileRows][kTileResults], im[kTileRows][kTileResults];
  rows_of(0);
  __syncthreads();  // (row_at of the first tile; the small operand)
  load(0);
  for (std::uint64_t u = 0; u < units; ++u) {
    const int chunk = static_cast<int>(u % chunks);
    if (chunk == 0) {
      const std::uint64_t first_row = tile_of(u) * S::rows;
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        const std::uint64_t row = first_row + lane + r * S::lanes;
        row_c[r] = row < w.rows ? row_offsets(w, row, K).c : -1;
#pragma unroll
        for (int x = 0; x < kTileResults; ++x) re[r][x] = im[r][x] = 0;
      }
    }
    const bool more = u + 1 < units;
    if (more && (u + 1) % chunks == 0) rows_of(u + 1);
    __syncthreads();  // (the next tile's row_at written; stage (u + 1) % 2 no longer read)
    if (more) {
      load(u + 1);
      copies_wait<1>();
    } else {
      copies_wait<0>();
    }
    __syncthreads();  // (unit u's columns in shared memory)
    const C* stage = stages + (u % 2) * stage_size;
    const int first = chunk * S::width;
#pragma unroll
    for (int p = 0; p < S::width; ++p) {
      C mine[kTileRows];
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) mine[r] = stage[(lane + r * S::lanes) * S::padded + p];
      const auto* two = reinterpret_cast<const float4*>(small + (first + p) * S::results + group * kTileResults);
#pragma unroll
      for (int h = 0; h < kTileResults / 2; ++h) {
        const float4 v = two[h];
        const C t0{v.x, v.y}, t1{v.z, v.w};
#pragma unroll
        for (int r = 0; r < kTileRows; ++r) {
          fused_multiply_add(OwnIsA ? mine[r] : t0, OwnIsA ? t0 : mine[r], re[r][2 * h], im[r][2 * h]);
          fused_multiply_add(OwnIsA ? mine[r] : t1, OwnIsA ? t1 : mine[r], re[r][2 * h + 1], im[r][2 * h + 1]);
        }
      }
    }
    if (chunk == chunks - 1) {
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        if (row_c[r] < 0) continue;
#pragma unroll
        for (int x = 0; x < kTileResults; ++x) {
          const int q = group * kTileResults + x;
          if (q < results) c_data[row_c[r] + result_c[q]] = C{re[r][x], im[r][x]};
        }
      }
    }
  }
}

// Blocks that stay resident at once (each walks many tiles, so the small operand is staged once
// a block).
template <int K, int G, bool OwnIsA>
void launch_tiles(const RowsWalk& w, int results, cudaStream_t stream) {
  using S = TileShape<K, G>;
  static const unsigned resident = [] {
    const auto kernel = looped_gemm_tiles_kernel<K, G, OwnIsA>;
    QSTAGE_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(S::shared_bytes)));
    int device = 0, sms = 0, per_sm = 0;
    QSTAGE_CUDA_CHECK(cudaGetDevice(&device));
    QSTAGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    QSTAGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTileThreads, S::shared_bytes));
    return static_cast<unsigned>(std::max(1, sms * std::max(1, per_sm)));
  }();
  const std::uint64_t tiles = (w.rows + S::rows - 1) / S::rows;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>(tiles, resident));
  looped_gemm_tiles_kernel<K, G, OwnIsA><<<blocks, kTileThreads, S::shared_bytes, stream>>>(w, results);
}

// False where the small operand would not fit (rows_walk's limit keeps it from happening).
template <int K, int G>
bool launch_tiles(const RowsWalk& w, bool own_is_a, int results, cudaStream_t stream) {
  if constexpr (K * G * kTileResults <= kTileSmall) {
    if (own_is_a)
      launch_tiles<K, G, true>(w, results, stream);
    else
      launch_tiles<K, G, false>(w, results, stream);
    return true;
  }
  return false;
}

template <int K>
bool launch_tiles(const RowsWalk& w, bool own_is_a, int results, cudaStream_t stream) {
  if (results <= kTileResults) return launch_tiles<K, 1>(w, own_is_a, results, stream);
  if (results <= 2 * kTileResults) return launch_tiles<K, 2>(w, own_is_a, results, stream);
  if (results <= 4 * kTileResults) return launch_tiles<K, 4>(w, own_is_a, results, stream);
  return launch_tiles<K, 8>(w, own_is_a, results, stream);
}

// Whether g is a complex64 gate step the tiles kernel takes, and launches it.
bool try_tiles(const LoopedGemm& g, cudaStream_t stream) {
  if (g.dtype != DType::complex64 || g.k < kTileMinSum || g.k > kTileMaxSum || (g.k & (g.k - 1)) != 0) return false;
  const bool own_is_a = footprint(g, true) >= footprint(g, false);
  RowsWalk w;
  if (!rows_walk(g, own_is_a, std::min<std::int64_t>(8 * kTileResults, kTileSmall / g.k), w)) return false;
  for (int d = 0; d < w.outer; ++d)
    if (w.outer_other[d] != 0) return false;  // (the small operand would differ between rows)
  const std::uint64_t results = w.inner_total * static_cast<std::uint64_t>(w.other_count);
  if (results < kTileResults) return false;
  const int q = static_cast<int>(results);
  switch (g.k) {
    case 8:
      return launch_tiles<8>(w, own_is_a, q, stream);
    case 16:
      return launch_tiles<16>(w, own_is_a, q, stream);
    case 32:
      return launch_tiles<32>(w, own_is_a, q, stream);
    default:
      return launch_tiles<64>(w, own_is_a, q, stream);
  }
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

// Chains (LoopedChain): a launch runs up to kChainBatch products, stage by stage; a stage's
// products are independent, so their elements are spread over the whole grid at once, one thread
// an element, and a grid-wide barrier orders the stages (it also makes a stage's writes visible
// to the next). With more than one stage the launch is cooperative: the grid is no larger than
// what the device holds at once. The products travel in the launch's parameters (up to 32 KB
// since CUDA 12.1), read in place (__grid_constant__). Each element is looped_gemm_element's (the
// CPU twin's code), so the bits do not depend on how the products are staged.
constexpr int kChainThreads = 256;
struct ChainBatch {
  int count = 0, stages = 0;
  std::uint8_t stage_first[kChainBatch + 1];    // the first product of each stage; then count
  std::uint32_t result_first[kChainBatch + 1];  // the launch's elements: product p has [result_first[p], [p + 1])
  ChainedGemm products[kChainBatch];
};
static_assert(sizeof(ChainBatch) <= 32764, "a chain's launch parameters exceed CUDA's 32 KB");

template <typename Real, bool Tropical>
__global__ void __launch_bounds__(kChainThreads) looped_chain_kernel(const __grid_constant__ ChainBatch batch) {
  const std::uint32_t threads = gridDim.x * kChainThreads;
  const std::uint32_t me = blockIdx.x * kChainThreads + threadIdx.x;
  for (int s = 0; s < batch.stages; ++s) {
    if (s > 0) cooperative_groups::this_grid().sync();
    int p = batch.stage_first[s];
    const std::uint32_t end = batch.result_first[batch.stage_first[s + 1]];
    for (std::uint32_t e = batch.result_first[p] + me; e < end; e += threads) {
      while (e >= batch.result_first[p + 1]) ++p;
      const ChainedGemm& g = batch.products[p];
      if constexpr (Tropical)
        looped_tropical_element(g, e - batch.result_first[p]);
      else
        looped_gemm_element<Real>(g, e - batch.result_first[p]);
    }
  }
}

// Blocks of looped_chain_kernel<Real, Tropical> the current device holds at once.
template <typename Real, bool Tropical>
unsigned chain_resident_blocks() {
  static const unsigned blocks = [] {
    int device = 0, sms = 0, per_sm = 0;
    QSTAGE_CUDA_CHECK(cudaGetDevice(&device));
    QSTAGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    QSTAGE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, looped_chain_kernel<Real, Tropical>, kChainThreads, 0));
    return static_cast<unsigned>(std::max(1, sms * per_sm));
  }();
  return blocks;
}

template <typename Real, bool Tropical>
void launch_chain(const ChainBatch& batch, cudaStream_t stream) {
  std::uint32_t widest = 0;  // the most elements a stage has
  for (int s = 0; s < batch.stages; ++s)
    widest = std::max(widest, batch.result_first[batch.stage_first[s + 1]] - batch.result_first[batch.stage_first[s]]);
  const unsigned wanted = std::max(1u, (widest + kChainThreads - 1) / kChainThreads);
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cooperative = {};
  config.blockDim = dim3(kChainThreads);
  config.stream = stream;
  if (batch.stages > 1) {
    config.gridDim = dim3(std::min(wanted, chain_resident_blocks<Real, Tropical>()));
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    config.attrs = &cooperative;
    config.numAttrs = 1;
  } else {
    config.gridDim = dim3(wanted);
  }
  QSTAGE_CUDA_CHECK(cudaLaunchKernelEx(&config, looped_chain_kernel<Real, Tropical>, batch));
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
  if (try_tiles(g, stream) ||
      (g.dtype == DType::complex64 ? try_rows<float>(g, stream) : try_rows<double>(g, stream))) {
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

void looped_chain_cuda(void* cuda_stream, const ChainedGemm* products, const std::uint8_t* starts_stage,
                       std::size_t count) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const bool tropical = products[0].semiring == Semiring::tropical;
  const bool single = products[0].dtype == DType::complex64;
  for (std::size_t first = 0; first < count; first += kChainBatch) {
    ChainBatch batch;
    batch.count = static_cast<int>(std::min<std::size_t>(kChainBatch, count - first));
    batch.result_first[0] = 0;
    for (int p = 0; p < batch.count; ++p) {
      const ChainedGemm& g = products[first + static_cast<std::size_t>(p)];
      batch.products[p] = g;
      batch.result_first[p + 1] =
          batch.result_first[p] + static_cast<std::uint32_t>(g.loops() * static_cast<std::uint64_t>(g.m * g.n));
      if (p == 0 || starts_stage[first + static_cast<std::size_t>(p)])
        batch.stage_first[batch.stages++] = static_cast<std::uint8_t>(p);
    }
    batch.stage_first[batch.stages] = static_cast<std::uint8_t>(batch.count);
    if (tropical)
      launch_chain<double, true>(batch, stream);
    else if (single)
      launch_chain<float, false>(batch, stream);
    else
      launch_chain<double, false>(batch, stream);
  }
}

}  // namespace qstage::kernels::detail
