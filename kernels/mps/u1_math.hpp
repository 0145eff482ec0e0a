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

// --- charge kinds (docs/mps.md). Kind n: a charge is one particle number. Kind n_pair (a density
// matrix rho vectorised with the local index s = n_ket d + n_bra, d^2 values a site): a charge is
// the pair (N_ket, N_bra), kept in one int as the key N_ket * 2^15 + N_bra, so that keys sort by
// N_ket then N_bra (a pair's indices stay contiguous: one sector), and adding keys adds the pairs
// componentwise (each component stays below 2^15). Gates on n_pair act as G (x) conj(G): the ket
// half by G's table, the bra half by its conjugate, each looked up per component.
inline constexpr int kPairShift = 15;
inline constexpr int kPairMask = (1 << kPairShift) - 1;
inline constexpr int kPairMax = kPairMask;  // the largest component

QSTAGE_HD int pair_key(int n_ket, int n_bra) { return (n_ket << kPairShift) | n_bra; }
QSTAGE_HD int pair_ket(int key) { return key >> kPairShift; }
QSTAGE_HD int pair_bra(int key) { return key & kPairMask; }

enum class ChargeKind : int { n = 0, n_pair = 1 };

struct ChargeRule {
  ChargeKind kind = ChargeKind::n;
  int d = 2;  // levels of one mode (a site has d, or d^2 for n_pair)

  QSTAGE_HD bool pair() const { return kind == ChargeKind::n_pair; }
  // Values of a site's local index: d, or d^2.
  QSTAGE_HD int local_dim() const { return pair() ? d * d : d; }
  // Whether a site block (c_left, c_right) exists.
  QSTAGE_HD bool allowed(int c_left, int c_right) const {
    if (!pair()) return u1_block_allowed(c_left, c_right, d);
    return u1_block_allowed(pair_ket(c_left), pair_ket(c_right), d) && u1_block_allowed(pair_bra(c_left), pair_bra(c_right), d);
  }
  // The local index of the site block (c_left, c_right) (allowed() assumed): n, or n_ket d + n_bra.
  QSTAGE_HD int local(int c_left, int c_right) const {
    if (!pair()) return c_left - c_right;
    return (pair_ket(c_left) - pair_ket(c_right)) * d + (pair_bra(c_left) - pair_bra(c_right));
  }
  // The charge a local index adds: c_left = c_right + delta(s).
  QSTAGE_HD int delta(int s) const { return pair() ? pair_key(s / d, s % d) : s; }
  // Whether two sites between the outer charges c_left, c_right can hold c_left - c_right.
  QSTAGE_HD bool two_site_allowed(int c_left, int c_right) const {
    if (!pair()) return c_left >= c_right && c_left - c_right <= 2 * (d - 1);
    const int a = pair_ket(c_left) - pair_ket(c_right), b = pair_bra(c_left) - pair_bra(c_right);
    return a >= 0 && a <= 2 * (d - 1) && b >= 0 && b <= 2 * (d - 1);
  }
  // The gate's entry (table u of gate_index(n, m, l, d)) that takes the old centre charge c_old to
  // c_new between c_left and c_right; 0 where the occupations leave the cut. n_pair: u_ket conj(u_bra).
  template <class Complex>
  QSTAGE_HD Complex gate_value(const Complex* u, int c_left, int c_old, int c_new, int c_right) const {
    if (!pair()) {
      const std::int64_t e = gate_entry_for_charges(c_left, c_old, c_new, c_right, d);
      return e < 0 ? Complex{} : u[e];
    }
    const std::int64_t ek = gate_entry_for_charges(pair_ket(c_left), pair_ket(c_old), pair_ket(c_new), pair_ket(c_right), d);
    const std::int64_t eb = gate_entry_for_charges(pair_bra(c_left), pair_bra(c_old), pair_bra(c_new), pair_bra(c_right), d);
    if (ek < 0 || eb < 0) return Complex{};
    return u[ek] * conj(u[eb]);
  }
};

// Index of a flat component of complex element `element` of an MPS's `values` (real part 2e,
// imaginary 2e + 1): the counter that kernels/tensor/random.hpp's stream is drawn at for mps.init's
// random state.
QSTAGE_HD std::uint64_t u1_component(std::uint64_t element, int imaginary) { return 2 * element + imaginary; }

}  // namespace qstage::kernels
