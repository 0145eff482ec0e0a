#pragma once
// A block's per-thread partials combined in a fixed binary tree (CUDA device code only).

namespace qstage::kernels::detail {

// Combines the N partials of a block (in shared memory, one per thread, already written):
// combine(i, i + half) for half = N/2, N/4, ..., 1, a barrier before each level; partial 0 then
// holds the total. Every thread of the block calls it. The order does not depend on the device
// or the run, so neither do the bits.
template <int N, typename Combine>
__device__ void block_tree(Combine&& combine) {
  __syncthreads();
  for (int half = N / 2; half > 0; half /= 2) {
    if (threadIdx.x < static_cast<unsigned>(half)) combine(threadIdx.x, threadIdx.x + half);
    __syncthreads();
  }
}

}  // namespace qstage::kernels::detail
