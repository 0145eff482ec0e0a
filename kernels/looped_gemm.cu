#include <algorithm>

#include "kernels/cuda_check.hpp"
#include "kernels/looped_gemm.hpp"

namespace qstage::kernels::detail {
namespace {

// One thread per result element, grid-stride; the loop description travels by value.
template <typename Real>
__global__ void looped_gemm_kernel(LoopedGemm g, std::uint64_t total) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t e = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    looped_gemm_element<Real>(g, e);
}

// Short power-of-two sums (k = K) with one small side (at most kRowsOther rows): one thread per
// row of the larger operand, across all the loop indices. The thread finds its loop offsets
// once, keeps its row in registers, and walks the small side's rows (shared by the threads of
// one loop index, so they come from L1), writing that many results; each result is summed over
// k in order with the same expression as looped_gemm_element (A's value first). With one thread
// per result element, each element walked the loop digits and read both its rows: the gate
// steps of a 53-qubit circuit slice (128 x 2 x 16 over 2^21 loop indices) ran at a tenth of
// the memory bandwidth.
constexpr std::int64_t kRowsOther = 32;
template <typename Real, int K, bool RowsOfA>
__global__ void looped_gemm_rows_kernel(LoopedGemm g, std::uint64_t rows) {
  const std::int64_t own_count = RowsOfA ? g.m : g.n, other_count = RowsOfA ? g.n : g.m;
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t r = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
    std::uint64_t loop = r;
    const std::int64_t own = next_digit(loop, own_count, RowsOfA ? g.m_shift : g.n_shift);
    // The loop's first element (i = j = 0): its offsets in A, B and C.
    const ElementAt at = element_at(g, loop * static_cast<std::uint64_t>(g.m * g.n));
    const auto* a = static_cast<const Complex<Real>*>(g.a) + at.a;
    const auto* b = static_cast<const Complex<Real>*>(g.b) + at.b;
    auto* c = static_cast<Complex<Real>*>(g.c) + at.c;
    Complex<Real> mine[K];
    const Complex<Real>* row = (RowsOfA ? a : b) + own * K;
#pragma unroll
    for (int p = 0; p < K; ++p) mine[p] = row[p];
    for (std::int64_t o = 0; o < other_count; ++o) {
      const Complex<Real>* theirs = (RowsOfA ? b : a) + o * K;
      Real re = 0, im = 0;
#pragma unroll
      for (int p = 0; p < K; ++p) {
        const Complex<Real> x = RowsOfA ? mine[p] : theirs[p], y = RowsOfA ? theirs[p] : mine[p];
        re += x.re * y.re - x.im * y.im;
        im += x.re * y.im + x.im * y.re;
      }
      const std::int64_t i = RowsOfA ? own : o, j = RowsOfA ? o : own;
      c[i * g.n + j] = Complex<Real>{re, im};
    }
  }
}

template <typename Real, int K>
void launch_rows(const LoopedGemm& g, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  const bool rows_of_a = g.m >= g.n;
  const std::uint64_t rows = g.loops() * static_cast<std::uint64_t>(rows_of_a ? g.m : g.n);
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((rows + threads - 1) / threads, 1u << 20));
  if (rows_of_a) looped_gemm_rows_kernel<Real, K, true><<<blocks, threads, 0, stream>>>(g, rows);
  else looped_gemm_rows_kernel<Real, K, false><<<blocks, threads, 0, stream>>>(g, rows);
}

// Whether the rows kernel takes g, and launches it.
template <typename Real>
bool try_rows(const LoopedGemm& g, cudaStream_t stream) {
  if (std::min(g.m, g.n) > kRowsOther) return false;
  switch (g.k) {
    case 1: launch_rows<Real, 1>(g, stream); return true;
    case 2: launch_rows<Real, 2>(g, stream); return true;
    case 4: launch_rows<Real, 4>(g, stream); return true;
    case 8: launch_rows<Real, 8>(g, stream); return true;
    case 16: launch_rows<Real, 16>(g, stream); return true;
    default: return false;
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
// tensors to a handful of numbers): one block per element, each thread summing a strided share of
// k in order, then a fixed tree in shared memory. cuBLAS ran such a batch of 2 x 2 x 2^21
// products at 1/600 of memory bandwidth (one CTA per product).
constexpr int kBlockSumThreads = 1024;
template <typename Real>
__global__ void __launch_bounds__(kBlockSumThreads) looped_gemm_block_kernel(LoopedGemm g, std::uint64_t total) {
  __shared__ Real sum_re[kBlockSumThreads], sum_im[kBlockSumThreads];
  for (std::uint64_t e = blockIdx.x; e < total; e += gridDim.x) {
    const ElementAt at = element_at(g, e);
    const auto* x = static_cast<const Complex<Real>*>(g.a) + at.a + at.i * g.k;
    const auto* y = static_cast<const Complex<Real>*>(g.b) + at.b + at.j * g.k;
    Real re = 0, im = 0;
    for (std::int64_t p = threadIdx.x; p < g.k; p += kBlockSumThreads) {
      const Complex<Real> u = x[p], v = y[p];
      re += u.re * v.re - u.im * v.im;
      im += u.re * v.im + u.im * v.re;
    }
    sum_re[threadIdx.x] = re;
    sum_im[threadIdx.x] = im;
    __syncthreads();
    for (int half = kBlockSumThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        sum_re[threadIdx.x] += sum_re[threadIdx.x + half];
        sum_im[threadIdx.x] += sum_im[threadIdx.x + half];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) static_cast<Complex<Real>*>(g.c)[at.c + at.i * g.n + at.j] = Complex<Real>{sum_re[0], sum_im[0]};
    __syncthreads();
  }
}

}  // namespace

void looped_gemm_cuda(void* cuda_stream, const LoopedGemm& g) {
  const std::uint64_t total = g.loops() * static_cast<std::uint64_t>(g.m * g.n);
  if (total == 0) return;
  constexpr unsigned threads = 256;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (g.k >= kLoopedBlockSum) {
    const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>(total, 1u << 20));
    if (g.dtype == h5::DType::complex64) looped_gemm_block_kernel<float><<<blocks, kBlockSumThreads, 0, stream>>>(g, total);
    else looped_gemm_block_kernel<double><<<blocks, kBlockSumThreads, 0, stream>>>(g, total);
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool warp = g.k >= 32;
  if (!warp && (g.dtype == h5::DType::complex64 ? try_rows<float>(g, stream) : try_rows<double>(g, stream))) {
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  const std::uint64_t workers = warp ? total * 32 : total;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((workers + threads - 1) / threads, 1u << 20));
  if (warp && g.dtype == h5::DType::complex64) looped_gemm_warp_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else if (warp) looped_gemm_warp_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  else if (g.dtype == h5::DType::complex64) looped_gemm_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else looped_gemm_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
