#include "backend/cuda_check.hpp"
#include "kernels/tn/statevector.hpp"
#include "kernels/tn/statevector_math.hpp"

namespace qstage::kernels::detail {
namespace {

struct Sorted {
  int t[kMaxGateQubits];
};

// One thread per group of 2^k amplitudes; the gate travels by value in the kernel parameters.
template <typename Real>
__global__ void apply_kernel(Cx<Real>* state, std::uint64_t groups, GateOperands gate, Sorted sorted) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += stride)
    apply_group(state, i, gate, sorted.t);
}

template <typename Real>
__global__ void gather_kernel(const Cx<Real>* state, const std::uint64_t* indices, std::uint64_t n, Cx<Real>* out) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = state[indices[i]];
}

unsigned blocks_for(std::uint64_t n, unsigned threads) {
  return static_cast<unsigned>(std::max<std::uint64_t>(1, std::min<std::uint64_t>((n + threads - 1) / threads, 1u << 20)));
}

}  // namespace

void apply_gate_cuda(void* cuda_stream, const ApplyGate& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  Sorted sorted;
  sorted_targets(a.gate, sorted.t);
  const std::uint64_t groups = std::uint64_t{1} << (a.qubits - a.gate.k);
  constexpr unsigned threads = 256;
  if (a.dtype == DType::complex64)
    apply_kernel<float><<<blocks_for(groups, threads), threads, 0, stream>>>(static_cast<Cx<float>*>(a.state), groups,
                                                                             a.gate, sorted);
  else
    apply_kernel<double><<<blocks_for(groups, threads), threads, 0, stream>>>(static_cast<Cx<double>*>(a.state), groups,
                                                                              a.gate, sorted);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void gather_amplitudes_cuda(void* cuda_stream, const Gather& g) {
  if (g.count == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  constexpr unsigned threads = 256;
  const unsigned blocks = static_cast<unsigned>((g.count + threads - 1) / threads);
  if (g.dtype == DType::complex64)
    gather_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const Cx<float>*>(g.state), g.indices, g.count,
                                                         static_cast<Cx<float>*>(g.out));
  else
    gather_kernel<double><<<blocks, threads, 0, stream>>>(static_cast<const Cx<double>*>(g.state), g.indices, g.count,
                                                          static_cast<Cx<double>*>(g.out));
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
