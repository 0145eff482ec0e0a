#include "backend/cuda_check.hpp"
#include "kernels/tensor/random.hpp"

namespace qstage::kernels::detail {
namespace {

template <typename T>
__global__ void fill_kernel(T* out, std::uint64_t key, std::uint64_t first, std::uint64_t n) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint64_t bits = random_bits(key, first + i);
    if constexpr (sizeof(T) == 4) out[i] = random_float(bits);
    else out[i] = random_double(bits);
  }
}

}  // namespace

void random_fill_cuda(void* cuda_stream, const RandomFill& a) {
  if (a.components == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const std::uint64_t key = splitmix64(a.seed);
  constexpr int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((a.components + threads - 1) / threads, 65536));
  const bool single = a.dtype == DType::float32 || a.dtype == DType::complex64;
  if (single)
    fill_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<float*>(a.out), key, a.first_component, a.components);
  else
    fill_kernel<double><<<blocks, threads, 0, stream>>>(static_cast<double*>(a.out), key, a.first_component, a.components);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
