#pragma once
// Charge and index arithmetic of U(1)-symmetric MPS (stages/mps, docs/mps.md), shared by the CPU
// update and the GPU twin to come: the same lookups from the same code on either backend.
//
// Conventions: the charge c[k] of bond k counts the particles to the right of the bond, so a
// site between bonds k and k+1 holds n = c[k] - c[k+1] particles, 0 <= n <= d-1. A two-site
// gate that conserves the particle number is a d x d x d table
//   U[n, m, l] = <l, n+m-l| G |n, m>   (new occupations first, summed over the old ones),
// stored flat at gate_index(n, m, l, d).
#include <cstdint>

#include "core/hd.hpp"

namespace qstage::kernels {

// Whether a site block with left charge c_left and right charge c_right exists in a d-level chain.
QSTAGE_HD bool u1_block_allowed(int c_left, int c_right, int d) {
  const int n = c_left - c_right;
  return n >= 0 && n <= d - 1;
}

// Flat position of U[n, m, l] (old occupations n, m of the two sites; new occupation l of the left one).
QSTAGE_HD std::int64_t gate_index(int n, int m, int l, int d) {
  return (static_cast<std::int64_t>(n) * d + m) * d + l;
}

// Whether U[n, m, l] is a valid entry: the right site's new occupation n + m - l must lie in [0, d-1].
QSTAGE_HD bool gate_entry_allowed(int n, int m, int l, int d) {
  const int r = n + m - l;
  return n >= 0 && n < d && m >= 0 && m < d && l >= 0 && l < d && r >= 0 && r < d;
}

// The gate entry that takes the old centre charge c_old to the new centre charge c_new between
// the outer charges c_left >= c_old, c_new >= c_right (seed 001 eq. 16): old occupations
// (c_left - c_old, c_old - c_right), new ones (c_left - c_new, c_new - c_right). -1 if either
// pair of occupations leaves [0, d-1].
QSTAGE_HD std::int64_t gate_entry_for_charges(int c_left, int c_old, int c_new, int c_right, int d) {
  const int n = c_left - c_old, m = c_old - c_right, l = c_left - c_new;
  if (!gate_entry_allowed(n, m, l, d)) return -1;
  return gate_index(n, m, l, d);
}

// Index of a flat component of complex element `element` of an MPS's `values` (real part 2e,
// imaginary 2e + 1): the counter that kernels/random.hpp's stream is drawn at for mps.init's
// random state.
QSTAGE_HD std::uint64_t u1_component(std::uint64_t element, int imaginary) { return 2 * element + imaginary; }

}  // namespace qstage::kernels
