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
  const std::uint64_t workers = warp ? total * 32 : total;
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((workers + threads - 1) / threads, 1u << 20));
  if (warp && g.dtype == h5::DType::complex64) looped_gemm_warp_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else if (warp) looped_gemm_warp_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  else if (g.dtype == h5::DType::complex64) looped_gemm_kernel<float><<<blocks, threads, 0, stream>>>(g, total);
  else looped_gemm_kernel<double><<<blocks, threads, 0, stream>>>(g, total);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
