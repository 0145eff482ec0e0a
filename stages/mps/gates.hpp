#pragma once
// Two-site gates that conserve the particle number, as the tables the charge-blocked update looks
// up (kernels/u1_math.hpp: U[n, m, l] = <l, n+m-l| G |n, m>).
#include <string>
#include <vector>

#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

struct GateTable {
  int d = 2;
  std::vector<cplx> u;  // d^3 entries at kernels::gate_index(n, m, l, d); invalid entries are 0
  cplx at(int n, int m, int l) const;
};

// exp(-i t H) of a Hermitian n x n matrix (row-major), by scaling and squaring of its Taylor series.
std::vector<cplx> exp_minus_i(const std::vector<cplx>& h, int n, double t);

// The table of a dense two-site gate g (d^2 x d^2, row-major; index n * d + m for occupations
// (n, m), rows new, columns old). Throws InputError naming `what` and the largest entry that
// changes the particle number if one exceeds 1e-13.
GateTable gate_table(const std::vector<cplx>& g, int d, const std::string& what);

}  // namespace qstage::stages::mps
