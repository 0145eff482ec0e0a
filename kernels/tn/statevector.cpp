#include "kernels/tn/statevector.hpp"

#include <stdexcept>

#include "kernels/dispatch.hpp"
#include "kernels/tn/statevector_math.hpp"

namespace qstage::kernels {

namespace {

template <typename Real>
void apply_cpu(const ApplyGate& a) {
  int sorted[kMaxGateQubits];
  detail::sorted_targets(a.gate, sorted);
  auto* state = static_cast<detail::Cx<Real>*>(a.state);
  const auto groups = static_cast<std::int64_t>(std::uint64_t{1} << (a.qubits - a.gate.k));
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < groups; ++i) detail::apply_group(state, static_cast<std::uint64_t>(i), a.gate, sorted);
}

template <typename Real>
void gather_cpu(const Gather& g) {
  const auto* state = static_cast<const detail::Cx<Real>*>(g.state);
  auto* out = static_cast<detail::Cx<Real>*>(g.out);
  for (std::uint64_t i = 0; i < g.count; ++i) out[i] = state[g.indices[i]];
}

void check(const ApplyGate& a) {
  if (a.gate.k < 1 || a.gate.k > kMaxGateQubits || a.gate.k > a.qubits)
    throw std::invalid_argument("apply_gate: gates act on 1 to 3 qubits of the state");
}

}  // namespace

void apply_gate_cpu(const ApplyGate& a) {
  check(a);
  if (a.dtype == DType::complex64) apply_cpu<float>(a);
  else apply_cpu<double>(a);
}

void apply_gate(Stream& stream, const ApplyGate& args) {
  check(args);
  QSTAGE_DISPATCH(stream, apply_gate_cpu(args), detail::apply_gate_cuda(stream.native(), args));
}

void gather_amplitudes_cpu(const Gather& g) {
  if (g.dtype == DType::complex64) gather_cpu<float>(g);
  else gather_cpu<double>(g);
}

void gather_amplitudes(Stream& stream, const Gather& args) {
  QSTAGE_DISPATCH(stream, gather_amplitudes_cpu(args), detail::gather_amplitudes_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
