// Compiled with --fmad=false (CMakeLists.txt): H_aa's products and sums round as on the host.
#include "backend/cuda_check.hpp"
#include "kernels/sci/sci_score.hpp"

namespace qstage::kernels::detail {
namespace {

__global__ void score_rows_kernel(SciScoreRows a) {
  const std::uint64_t r = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (r >= a.n) return;
  const sci::Det d = a.candidate(static_cast<std::uint64_t>(r));
  const unsigned char skip = sci::score_skips(a.space, a.space_size, a.filter, a.irreps, d);
  a.skipped[r] = skip;
  if (!skip) a.denominator[r] = sci::floored_denominator(a.energy - sci::diagonal(a.h, d));
}

// A block a tile: its threads find a chunk's terms side by side, then one thread adds them in row
// order (the CPU twin's order, so the sums have its bits).
constexpr unsigned kSumThreads = 256, kSumChunk = 2048;

__global__ void tile_sums_kernel(SciTileSums a) {
  __shared__ double terms[kSumChunk];
  __shared__ unsigned char slots[kSumChunk];  // 255: skipped
  __shared__ double sums[kSciTileSumSlots];
  const std::uint64_t begin = blockIdx.x * a.tile_rows, end = begin + a.tile_rows < a.n ? begin + a.tile_rows : a.n;
  if (threadIdx.x < a.slots) sums[threadIdx.x] = 0.0;
  for (std::uint64_t chunk = begin; chunk < end; chunk += kSumChunk) {
    const std::uint64_t rows = end - chunk < kSumChunk ? end - chunk : kSumChunk;
    for (std::uint64_t i = threadIdx.x; i < rows; i += kSumThreads) {
      double term = 0;
      std::uint32_t slot = 0;
      const bool counted = sci_tile_term(a, chunk + i, term, slot);
      terms[i] = term;
      slots[i] = counted ? static_cast<unsigned char>(slot) : 255;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (std::uint64_t i = 0; i < rows; ++i)
        if (slots[i] != 255) sums[slots[i]] += terms[i];
    __syncthreads();
  }
  if (threadIdx.x < a.slots) a.sums[blockIdx.x * static_cast<std::uint64_t>(a.slots) + threadIdx.x] = sums[threadIdx.x];
}

}  // namespace

void sci_tile_sums_cuda(void* cuda_stream, const SciTileSums& a) {
  const std::uint64_t tiles = (a.n + a.tile_rows - 1) / a.tile_rows;
  if (tiles == 0) return;
  tile_sums_kernel<<<static_cast<unsigned>(tiles), kSumThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sci_score_rows_cuda(void* cuda_stream, const SciScoreRows& a) {
  if (a.n == 0) return;
  constexpr unsigned kThreads = 128;
  score_rows_kernel<<<static_cast<unsigned>((a.n + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
