#include "backend/cuda_check.hpp"
#include "kernels/linalg/permute.hpp"

namespace qstage::kernels::detail {
namespace {

// Every extent a power of two (circuits: all of them): digits by shifts and masks. 64-bit
// division per digit made a 27-mode copy compute-bound at a fifth of memory bandwidth.
struct Pow2Gather {
  int rank = 0;
  unsigned char shift[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};
  std::int64_t base = 0;
};

template <typename T>
__global__ void gather_pow2_kernel(const T* in, T* out, Pow2Gather g, std::int64_t total) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    std::int64_t rest = i, offset = g.base;
    for (int j = g.rank - 1; j >= 0; --j) {
      offset += (rest & ((std::int64_t{1} << g.shift[j]) - 1)) * g.strides[j];
      rest >>= g.shift[j];
    }
    out[i] = in[offset];
  }
}

template <typename T>
__global__ void gather_kernel(const T* in, T* out, GatherPermute g, std::int64_t total) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    std::int64_t rest = i, offset = g.base;
    for (int j = g.rank - 1; j >= 0; --j) {
      offset += (rest % g.dims[j]) * g.strides[j];
      rest /= g.dims[j];
    }
    out[i] = in[offset];
  }
}

struct alignas(16) Bytes16 {
  double a, b;
};

}  // namespace

void gather_permute_cuda(void* cuda_stream, const GatherPermute& g) {
  std::int64_t total = 1;
  for (int j = 0; j < g.rank; ++j) total *= g.dims[j];
  if (total == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  constexpr int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((total + threads - 1) / threads, 65536));
  Pow2Gather p;
  bool pow2 = true;
  p.rank = g.rank;
  p.base = g.base;
  for (int j = 0; j < g.rank && pow2; ++j) {
    pow2 = g.dims[j] > 0 && (g.dims[j] & (g.dims[j] - 1)) == 0;
    while ((std::int64_t{1} << p.shift[j]) < g.dims[j]) ++p.shift[j];
    p.strides[j] = g.strides[j];
  }
  if (pow2) {
    switch (dtype_size(g.dtype)) {
      case 16: gather_pow2_kernel<Bytes16><<<blocks, threads, 0, stream>>>(static_cast<const Bytes16*>(g.in), static_cast<Bytes16*>(g.out), p, total); break;
      case 8: gather_pow2_kernel<double><<<blocks, threads, 0, stream>>>(static_cast<const double*>(g.in), static_cast<double*>(g.out), p, total); break;
      case 4: gather_pow2_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(g.in), static_cast<float*>(g.out), p, total); break;
      default: gather_pow2_kernel<char><<<blocks, threads, 0, stream>>>(static_cast<const char*>(g.in), static_cast<char*>(g.out), p, total); break;
    }
    QSTAGE_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (dtype_size(g.dtype)) {
    case 16: gather_kernel<Bytes16><<<blocks, threads, 0, stream>>>(static_cast<const Bytes16*>(g.in), static_cast<Bytes16*>(g.out), g, total); break;
    case 8: gather_kernel<double><<<blocks, threads, 0, stream>>>(static_cast<const double*>(g.in), static_cast<double*>(g.out), g, total); break;
    case 4: gather_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(g.in), static_cast<float*>(g.out), g, total); break;
    default: gather_kernel<char><<<blocks, threads, 0, stream>>>(static_cast<const char*>(g.in), static_cast<char*>(g.out), g, total); break;
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
