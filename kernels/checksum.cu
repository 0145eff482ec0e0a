#include <cub/block/block_reduce.cuh>

#include "kernels/checksum.hpp"
#include "backend/cuda_check.hpp"

namespace qstage::kernels::detail {
namespace {

constexpr int kThreads = 256;

// Integer addition modulo 2^64 is associative and commutative, so the atomics' order does not
// change the result: the checksum is bitwise identical run to run and equal to the CPU twin's.
template <typename Word>
__global__ void checksum_kernel(const Word* words, std::uint64_t n, std::uint64_t first, unsigned long long* result) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  unsigned long long sum = 0;
  const std::uint64_t stride = std::uint64_t(gridDim.x) * kThreads;
  for (std::uint64_t i = std::uint64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    sum += qsum_term(words[i], first + i);
  sum = Reduce(tmp).Sum(sum);
  if (threadIdx.x == 0) atomicAdd(result, sum);
}

}  // namespace

void checksum_cuda(void* cuda_stream, const Checksum& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.result, 0, sizeof(std::uint64_t), stream));
  const std::uint64_t n = a.bytes / a.word_bytes;
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>((n + kThreads - 1) / kThreads, 4096));
  auto* out = reinterpret_cast<unsigned long long*>(a.result);
  if (a.word_bytes == 4)
    checksum_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint32_t*>(a.data), n, a.first_word, out);
  else
    checksum_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(a.data), n, a.first_word, out);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
