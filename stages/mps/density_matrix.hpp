#pragma once
// Measurements of a density matrix held as an n_pair MPS (docs/mps.md): traces, contracted with
// the vectorised identity (the trace vector: only the local indices n_ket = n_bra), never the
// B-form expectation values of a state vector.
#include <vector>

#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

struct TraceMeasurements {
  double trace = 0;              // Tr rho = weight * Tr(the MPS)
  std::vector<double> density;   // Tr(rho n_j) / Tr rho, j = 0..L-1
  std::vector<double> totals;    // P(N) = Tr(rho Pi_N) / Tr rho, N = 0..total_charge
  std::vector<double> left;      // P(N_left = n) left of bond `bond` (sites 0..bond-1), n = 0..total_charge
};

// All of them from one left and one right sweep of trace environments (and one left sweep per
// total N for `left`). Throws std::logic_error if psi is not n_pair.
TraceMeasurements trace_measurements(const U1Mps& psi, int bond);

// Tr(rho |n><n|) / Tr rho for the occupation pattern n (L entries): a diagonal element of rho.
double pattern_probability(const U1Mps& psi, const std::vector<int>& n);

}  // namespace qstage::stages::mps
