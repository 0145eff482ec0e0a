#pragma once
// The per-group step of apply_gate, shared by the CPU twin and the CUDA kernel.
#include "kernels/tn/statevector.hpp"

namespace qstage::kernels::detail {

template <typename Real>
struct Cx {
  Real re, im;
};

// Applies the gate to the 2^k amplitudes of group i (the other qubits' index).
template <typename Real>
QSTAGE_HD void apply_group(Cx<Real>* state, std::uint64_t i, const GateOperands& g, const int* sorted) {
  const int dim = 1 << g.k;
  const std::uint64_t base = spread_index(i, sorted, g.k);
  std::uint64_t index[8];
  Cx<Real> in[8];
  for (int l = 0; l < dim; ++l) {
    std::uint64_t idx = base;
    for (int j = 0; j < g.k; ++j)
      if ((l >> (g.k - 1 - j)) & 1) idx |= std::uint64_t{1} << g.targets[j];
    index[l] = idx;
    in[l] = state[idx];
  }
  for (int r = 0; r < dim; ++r) {
    double re = 0, im = 0;
    for (int c = 0; c < dim; ++c) {
      const double mr = g.matrix[2 * (r * dim + c)], mi = g.matrix[2 * (r * dim + c) + 1];
      re += mr * static_cast<double>(in[c].re) - mi * static_cast<double>(in[c].im);
      im += mr * static_cast<double>(in[c].im) + mi * static_cast<double>(in[c].re);
    }
    state[index[r]] = Cx<Real>{static_cast<Real>(re), static_cast<Real>(im)};
  }
}

inline void sorted_targets(const GateOperands& g, int* out) {
  for (int j = 0; j < g.k; ++j) out[j] = g.targets[j];
  for (int a = 0; a < g.k; ++a)
    for (int b = a + 1; b < g.k; ++b)
      if (out[b] < out[a]) {
        const int t = out[a];
        out[a] = out[b];
        out[b] = t;
      }
}

}  // namespace qstage::kernels::detail
