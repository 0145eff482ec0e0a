#include "backend/cuda_check.hpp"
#include "kernels/block_tree.cuh"
#include "kernels/tensor/stats.hpp"
#include "kernels/tensor/stats_math.hpp"

namespace qstage::kernels::detail {
namespace {

constexpr int kThreads = 256;

// One block per tile. Each thread folds a strided subset of the tile in order, then the block
// merges the threads' partials in a fixed binary tree: deterministic for a given tile size.
template <typename T>
__global__ void stats_kernel(const void* data, std::uint64_t elements, std::uint64_t tile_elements, bool complex,
                             std::uint64_t first_word, StatsPartial* partials) {
  __shared__ StatsPartial part[kThreads];
  const std::uint64_t begin = std::uint64_t(blockIdx.x) * tile_elements;
  const std::uint64_t end = begin + tile_elements < elements ? begin + tile_elements : elements;
  StatsPartial p;
  for (std::uint64_t e = begin + threadIdx.x; e < end; e += kThreads) {
    double re, im;
    load<T>(data, e, complex, re, im);
    accumulate(p, re, im, complex);
    add_qsum<T>(p, data, e, complex, first_word);
  }
  part[threadIdx.x] = p;
  block_tree<kThreads>([&](unsigned to, unsigned from) { merge(part[to], part[from]); });
  if (threadIdx.x == 0) partials[blockIdx.x] = part[0];
}

}  // namespace

void stats_cuda(void* cuda_stream, const Stats& a) {
  const std::uint64_t tiles = stats_tiles(a);
  if (tiles == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const bool complex = dtype_is_complex(a.dtype);
  const bool single = a.dtype == DType::float32 || a.dtype == DType::complex64;
  for (std::uint64_t first = 0; first < tiles; first += 65535) {  // grid.x limit per launch
    const unsigned n = static_cast<unsigned>(std::min<std::uint64_t>(tiles - first, 65535));
    const std::size_t offset = first * a.tile_elements * dtype_size(a.dtype);
    const void* data = static_cast<const char*>(a.data) + offset;
    const std::uint64_t elements = a.elements - first * a.tile_elements;
    const std::uint64_t first_word = a.first_word + offset / 4;
    if (single)
      stats_kernel<float><<<n, kThreads, 0, stream>>>(data, elements, a.tile_elements, complex, first_word,
                                                      a.partials + first);
    else
      stats_kernel<double><<<n, kThreads, 0, stream>>>(data, elements, a.tile_elements, complex, first_word,
                                                       a.partials + first);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace qstage::kernels::detail
