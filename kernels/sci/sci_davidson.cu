// Compiled with --fmad=false (CMakeLists.txt): every product and sum rounds as on the host.
#include "backend/cuda_check.hpp"
#include "kernels/sci/sci_davidson.hpp"
#include "kernels/sci/sci_davidson_math.hpp"

namespace qstage::kernels::detail {
namespace {

constexpr unsigned kThreads = 256;

unsigned entry_grid(std::uint64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One CUDA block a block of the fixed shape: its threads first do every entry's work side by side
// (term(i): the entry's step, returning its term of the sum; coalesced, each entry once), keeping
// the terms in shared memory; then eight threads sum the eight lanes in entry order (the chains
// read shared memory, not global: no memory latency in them) and the first adds them pairwise
// into the block's partial sum. Every thread of the first warp reaches the shuffles.
template <typename Term>
__device__ void sweep_block(std::uint64_t n, double* partials, Term term) {
  __shared__ double terms[kFixedSumBlock];
  const std::uint64_t first = std::uint64_t(blockIdx.x) * kFixedSumBlock;
  const unsigned size = static_cast<unsigned>(n - first < kFixedSumBlock ? n - first : kFixedSumBlock);
  for (unsigned e = threadIdx.x; e < size; e += kThreads) terms[e] = term(first + e);
  __syncthreads();
  if (threadIdx.x >= 32) return;
  double lane = 0;
  if (threadIdx.x < 8)
    for (unsigned e = threadIdx.x; e < size; e += 8) lane += terms[e];
  double v[8];
#pragma unroll
  for (unsigned j = 0; j < 8; ++j) v[j] = __shfl_sync(0xffffffffu, lane, j);
  if (threadIdx.x == 0) partials[blockIdx.x] = lanes_total(v);
}

// sums[k] = the blocks' partial sums of dot k, added in order.
__global__ void fold_kernel(const double* partials, std::uint64_t blocks, int count, double* sums) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k < count) sums[k] = fold(partials + static_cast<std::uint64_t>(k) * blocks, blocks);
}

void launch_fold(cudaStream_t stream, const double* partials, std::uint64_t n, int count, double* sums) {
  fold_kernel<<<(count + 127) / 128, 128, 0, stream>>>(partials, fixed_sum_blocks(n), count, sums);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

__global__ void dots_kernel(FixedDots a) {
  const std::uint64_t k = blockIdx.y;
  const double* x = a.a + k * a.a_step;
  const double* y = a.b + k * a.b_step;
  sweep_block(a.n, a.partials + k * fixed_sum_blocks(a.n), [&](std::uint64_t i) { return x[i] * y[i]; });
}

__global__ void subtract_then_dot_kernel(SubtractThenDot a) {
  const double d = a.b ? *a.d : 0.0;
  sweep_block(a.n, a.partials, [&](std::uint64_t i) {
    double t = a.t[i];
    if (a.b) a.t[i] = t = t - d * a.b[i];
    return (a.c == a.t ? t : a.c[i]) * t;
  });
}

__global__ void scale_to_unit_kernel(ScaleToUnit a) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < a.n) a.t[i] *= 1 / sqrt(*a.square);
}

__global__ void ritz_vector_kernel(RitzVector a) {
  sweep_block(a.n, a.partials, [&](std::uint64_t i) {
    double x = 0, ax = 0;
    for (int j = 0; j < a.m; ++j) {
      const double y = a.y[j];
      x += y * a.basis[j * a.stride + i];
      ax += y * a.products[j * a.stride + i];
    }
    const double r = ax - a.theta * x;
    a.x[i] = x, a.ax[i] = ax, a.r[i] = r;
    return r * r;
  });
}

__global__ void precondition_kernel(Precondition a) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < a.n) a.t[i] = preconditioned(a.t[i], a.theta, a.diagonal[i]);
}

}  // namespace

void fixed_dots_cuda(void* cuda_stream, const FixedDots& a) {
  if (a.n == 0 || a.count == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  dots_kernel<<<dim3(static_cast<unsigned>(fixed_sum_blocks(a.n)), static_cast<unsigned>(a.count)), kThreads, 0, stream>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
  launch_fold(stream, a.partials, a.n, a.count, a.sums);
}

void subtract_then_dot_cuda(void* cuda_stream, const SubtractThenDot& a) {
  if (a.n == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  subtract_then_dot_kernel<<<static_cast<unsigned>(fixed_sum_blocks(a.n)), kThreads, 0, stream>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
  launch_fold(stream, a.partials, a.n, 1, a.sum);
}

void scale_to_unit_cuda(void* cuda_stream, const ScaleToUnit& a) {
  if (a.n == 0) return;
  scale_to_unit_kernel<<<entry_grid(a.n), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void ritz_vector_cuda(void* cuda_stream, const RitzVector& a) {
  if (a.n == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  ritz_vector_kernel<<<static_cast<unsigned>(fixed_sum_blocks(a.n)), kThreads, 0, stream>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
  launch_fold(stream, a.partials, a.n, 1, a.sum);
}

void precondition_cuda(void* cuda_stream, const Precondition& a) {
  if (a.n == 0) return;
  precondition_kernel<<<entry_grid(a.n), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
