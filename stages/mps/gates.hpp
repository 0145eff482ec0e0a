#pragma once
// Two-site gates that conserve the particle number, as the tables the charge-blocked update looks
// up (kernels/mps/u1_math.hpp: U[n, m, l] = <l, n+m-l| G |n, m>).
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
// It is unitary up to rounding of about 1e-16 |t| ||H|| (each squaring doubles the error): a large
// enough time step or coupling makes a gate that does not conserve the norm (require_unitary).
std::vector<cplx> exp_minus_i(const std::vector<cplx>& h, int n, double t);

// How far from unitary a gate may be, as max |U^dagger U - 1|: exp_minus_i stays within it up to
// |t| ||H|| of about 1e5, far beyond any sensible time step (an XXZ chain at dt = 1e16 ended with
// a norm of 1.86; at 1e20 the gates are NaN).
inline constexpr double kUnitarityTolerance = 1e-10;

// Throws InputError "{what} is not unitary in double precision: max |U^dagger U - 1| = ...;
// expected at most 1e-10: {remedy}" if the n x n matrix u is further from unitary than
// kUnitarityTolerance (or has a NaN entry).
void require_unitary(const std::vector<cplx>& u, int n, const std::string& what, const std::string& remedy);

// The table of a dense two-site gate g (d^2 x d^2, row-major; index n * d + m for occupations
// (n, m), rows new, columns old). Throws InputError naming `what` and the largest entry that
// changes the particle number if one exceeds 1e-13.
GateTable gate_table(const std::vector<cplx>& g, int d, const std::string& what);

}  // namespace qstage::stages::mps
