#include "backend/cuda_check.hpp"
#include "kernels/block_tree.cuh"
#include "kernels/linalg/dot.hpp"

namespace qstage::kernels::detail {
namespace {

constexpr int kThreads = 256;

// One block per tile; a fixed tree in double: the same sum every run.
template <typename Real>
__global__ void dotc_kernel(const Real* x, const Real* y, std::uint64_t n, std::uint64_t tile, double* partials) {
  __shared__ double re[kThreads], im[kThreads];
  const std::uint64_t begin = std::uint64_t(blockIdx.x) * tile;
  const std::uint64_t end = begin + tile < n ? begin + tile : n;
  double r = 0, m = 0;
  for (std::uint64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const double xr = x[2 * i], xi = x[2 * i + 1], yr = y[2 * i], yi = y[2 * i + 1];
    r += xr * yr + xi * yi;  // conj(x) * y
    m += xr * yi - xi * yr;
  }
  re[threadIdx.x] = r;
  im[threadIdx.x] = m;
  block_tree<kThreads>([&](unsigned to, unsigned from) {
    re[to] += re[from];
    im[to] += im[from];
  });
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = re[0];
    partials[2 * blockIdx.x + 1] = im[0];
  }
}

}  // namespace

void dotc_cuda(void* cuda_stream, const Dotc& a) {
  const std::uint64_t tiles = dotc_tiles(a);
  if (tiles == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  for (std::uint64_t first = 0; first < tiles; first += 65535) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>(tiles - first, 65535));
    const std::uint64_t offset = first * a.tile, n = a.n - offset;
    if (a.dtype == DType::complex64)
      dotc_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(a.x) + 2 * offset,
                                                          static_cast<const float*>(a.y) + 2 * offset, n, a.tile,
                                                          a.partials + 2 * first);
    else
      dotc_kernel<double><<<blocks, kThreads, 0, stream>>>(static_cast<const double*>(a.x) + 2 * offset,
                                                           static_cast<const double*>(a.y) + 2 * offset, n, a.tile,
                                                           a.partials + 2 * first);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace qstage::kernels::detail
