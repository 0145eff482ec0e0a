// Compiled with --fmad=false (CMakeLists.txt): H_aa's products and sums round as on the host.
#include "backend/cuda_check.hpp"
#include "kernels/sci_score.hpp"

namespace qstage::kernels::detail {
namespace {

__global__ void score_rows_kernel(SciScoreRows a) {
  const std::uint64_t r = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (r >= a.n) return;
  const sci::Det d = a.candidate(static_cast<std::uint64_t>(r));
  const unsigned char skip = sci::score_skips(a.space, a.space_size, a.irreps, d);
  a.skipped[r] = skip;
  if (!skip) a.denominator[r] = sci::floored_denominator(a.energy - sci::diagonal(a.h, d));
}

}  // namespace

void sci_score_rows_cuda(void* cuda_stream, const SciScoreRows& a) {
  if (a.n == 0) return;
  constexpr unsigned kThreads = 128;
  score_rows_kernel<<<static_cast<unsigned>((a.n + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
