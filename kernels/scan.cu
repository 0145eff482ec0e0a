// The CUDA side of kernels/scan.hpp: the look-back scan of an array of counts, the flags of
// flag_above, popcounts, compact and expand.
#include "kernels/scan.hpp"
#include "kernels/scan.cuh"
#include "backend/cuda_check.hpp"

namespace qstage::kernels::detail {
namespace {

// The counts of exclusive_scan, as look_back_scan_kernel reads them.
struct CountsAt {
  const unsigned long long* counts;
  __device__ unsigned long long operator()(std::uint64_t i) const { return counts[i]; }
};

struct FlaggedAbove {
  double t;
  __device__ bool operator()(float x) const { return flagged_above(x, t); }
};

__global__ void popcount_kernel(const std::uint8_t* bitmap, std::uint64_t bytes, unsigned long long* counts) {
  const std::uint64_t j = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < bytes) counts[j] = static_cast<unsigned long long>(__popc(bitmap[j]));
  if (j == bytes) counts[j] = 0;
}

cudaStream_t cuda(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

void exclusive_scan_cuda(void* stream, const unsigned long long* counts, std::uint64_t items,
                         unsigned long long* offsets, unsigned long long* scratch) {
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(scratch, 0, 8 * scan_scratch_words(items), cuda(stream)));
  if (items == 0) return;
  look_back_scan_kernel<<<grid_for(items, kScanTile), kScanThreads, 0, cuda(stream)>>>(CountsAt{counts}, items, offsets,
                                                                                        scratch, scratch + 1);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void flag_above_cuda(void* stream, const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap,
                     unsigned long long* counts) {
  if (n == 0) return;
  launch_flags(cuda(stream), x, n, stride, FlaggedAbove{t}, bitmap, counts);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void popcounts_cuda(void* stream, const std::uint8_t* bitmap, std::uint64_t bytes, unsigned long long* counts) {
  popcount_kernel<<<grid_for(bytes + 1, kCompactThreads), kCompactThreads, 0, cuda(stream)>>>(bitmap, bytes, counts);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void compact_cuda(void* stream, const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                  const unsigned long long* ranks, T* kept) {
  if (n == 0) return;
  compact_kernel<<<grid_for(n, kCompactThreads), kCompactThreads, 0, cuda(stream)>>>(x, n, stride, bitmap, ranks, kept);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

template <typename T>
void expand_cuda(void* stream, const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                 const unsigned long long* ranks, T* out) {
  if (n == 0) return;
  expand_kernel<<<grid_for(n, kCompactThreads), kCompactThreads, 0, cuda(stream)>>>(kept, n, stride, bitmap, ranks, out);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

#define QSTAGE_SCAN_TYPE(T)                                                                                     \
  template void compact_cuda<T>(void*, const T*, std::uint64_t, int, const std::uint8_t*, const unsigned long long*, \
                                T*);                                                                            \
  template void expand_cuda<T>(void*, const T*, std::uint64_t, int, const std::uint8_t*, const unsigned long long*, T*);
QSTAGE_SCAN_TYPE(float)
QSTAGE_SCAN_TYPE(std::uint8_t)
QSTAGE_SCAN_TYPE(std::uint64_t)
#undef QSTAGE_SCAN_TYPE

}  // namespace qstage::kernels::detail
