#pragma once
// Slater–Condon rules on determinants of two 64-bit occupation strings, shared by the CPU twins
// (.cpp) and the CUDA kernels (.cu) of selected CI, so both compute the same values from the same
// code.
//
// A determinant is (alpha, beta): bit p of a string set when spatial orbital p is occupied with
// that spin. Spin-orbitals are ordered all alpha before all beta, orbitals ascending within a
// spin; so an excitation p -> r inside one string has the phase (-1)^(occupied orbitals of that
// string strictly between p and r), and a beta excitation never crosses alpha electrons an odd
// number of times. Integrals are real: h_pq and chemists' (pq|rs) with 8-fold symmetry.
#include <cstdint>

#include "core/hd.hpp"

namespace qstage::kernels::sci {

// A determinant, and its sort key: (alpha, beta) compared as one 128-bit number, alpha high.
struct Det {
  std::uint64_t alpha = 0, beta = 0;
};
QSTAGE_HD bool operator<(const Det& a, const Det& b) {
  return a.alpha < b.alpha || (a.alpha == b.alpha && a.beta < b.beta);
}
QSTAGE_HD bool operator==(const Det& a, const Det& b) { return a.alpha == b.alpha && a.beta == b.beta; }

// A generated determinant with a value (a Hamiltonian element times the source's coefficient):
// the rows selected CI streams, 24 bytes; keys.dedup reads the first two words as the key and the
// third as a float64 summed per key.
struct Candidate {
  std::uint64_t alpha = 0, beta = 0;
  double value = 0;
};
static_assert(sizeof(Candidate) == 24);

// The Hamiltonian and its excitation tables as the kernels read them (device memory on cuda).
// Built on the host by stages/sci/excitation_tables.hpp, which documents the tables.
struct HamiltonianView {
  int norb = 0;
  double core = 0;
  const double* h1 = nullptr;        // norb x norb
  const double* eri = nullptr;       // 8-fold packed (eri_index)
  const double* coulomb = nullptr;   // J_pq = (pp|qq), norb x norb
  const double* exchange = nullptr;  // K_pq = (pq|qp), norb x norb
  // Singles: per orbital p, `single_width` slots: targets r, sorted by `single_bound` (an upper
  // bound of |H| for p -> r in any determinant) descending; single_length[p] of them are used.
  std::uint32_t single_width = 0;
  const std::uint32_t* single_length = nullptr;
  const std::uint8_t* single_target = nullptr;
  const double* single_bound = nullptr;
  // Opposite-spin doubles: per pair p (alpha) * norb + q (beta), targets r | s << 8 (r alpha,
  // s beta) with value (pr|qs), sorted by |value| descending (heat-bath order).
  std::uint32_t opposite_width = 0;
  const std::uint32_t* opposite_length = nullptr;
  const std::uint16_t* opposite_target = nullptr;
  const double* opposite_value = nullptr;
  // Same-spin doubles: per pair p < q (index q(q-1)/2 + p), targets r < s with value
  // (pr|qs) - (ps|qr), sorted by |value| descending.
  std::uint32_t same_width = 0;
  const std::uint32_t* same_length = nullptr;
  const std::uint16_t* same_target = nullptr;
  const double* same_value = nullptr;
};

QSTAGE_HD int popcount(std::uint64_t x) {
#ifdef __CUDA_ARCH__
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

QSTAGE_HD std::uint64_t bit(int p) { return std::uint64_t{1} << p; }

// 0-based index of the pair {i, j} (either order) in 8-fold packing (PySCF's s8).
QSTAGE_HD std::uint64_t eri_pair(std::uint64_t i, std::uint64_t j) { return i >= j ? i * (i + 1) / 2 + j : j * (j + 1) / 2 + i; }
QSTAGE_HD std::uint64_t eri_index(int i, int j, int k, int l) {
  return eri_pair(eri_pair(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(j)),
                  eri_pair(static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(l)));
}
QSTAGE_HD double eri(const HamiltonianView& h, int i, int j, int k, int l) { return h.eri[eri_index(i, j, k, l)]; }
QSTAGE_HD std::uint32_t same_pair(int p, int q) { return static_cast<std::uint32_t>(q * (q - 1) / 2 + p); }  // p < q

// +1 or -1: the phase of moving an electron from p to r (p != r) inside string s.
QSTAGE_HD double excitation_sign(std::uint64_t s, int p, int r) {
  const int lo = p < r ? p : r, hi = p < r ? r : p;
  const std::uint64_t between = (bit(hi) - 1) & ~(bit(lo + 1) - 1);
  return (popcount(s & between) & 1) ? -1.0 : 1.0;
}

// <D|H|D>.
QSTAGE_HD double diagonal(const HamiltonianView& h, const Det& d) {
  const int n = h.norb;
  double one = 0, two = 0;
  for (int p = 0; p < n; ++p) {
    const bool pa = (d.alpha >> p) & 1, pb = (d.beta >> p) & 1;
    if (!pa && !pb) continue;
    if (pa) one += h.h1[p * n + p];
    if (pb) one += h.h1[p * n + p];
    for (int q = 0; q < n; ++q) {
      const bool qa = (d.alpha >> q) & 1, qb = (d.beta >> q) & 1;
      const double j = h.coulomb[p * n + q], k = h.exchange[p * n + q];
      // same spin: (J - K) / 2 over ordered pairs; opposite spin: J over ordered (alpha, beta)
      if (pa && qa) two += 0.5 * (j - k);
      if (pb && qb) two += 0.5 * (j - k);
      if (pa && qb) two += j;
    }
  }
  return h.core + one + two;
}

// <D'|H|D> for D' = D with p -> r in string `same` (the other spin's string `other`), phase
// included. Additions only, so the CPU and the GPU round alike.
QSTAGE_HD double single_element(const HamiltonianView& h, std::uint64_t same, std::uint64_t other, int p, int r) {
  const int n = h.norb;
  double v = h.h1[p * n + r];
  for (int k = 0; k < n; ++k) {
    if ((same >> k) & 1) v += eri(h, p, r, k, k) - eri(h, p, k, k, r);
    if ((other >> k) & 1) v += eri(h, p, r, k, k);
  }
  return excitation_sign(same, p, r) * v;
}

// The phase of p -> r then q -> s inside one string (a same-spin double).
QSTAGE_HD double double_sign(std::uint64_t s, int p, int r, int q, int t) {
  const double first = excitation_sign(s, p, r);
  return first * excitation_sign((s & ~bit(p)) | bit(r), q, t);
}

// <a|H|b> for any two determinants (0 unless they differ by at most a double excitation).
QSTAGE_HD double element(const HamiltonianView& h, const Det& a, const Det& b) {
  const std::uint64_t da = a.alpha ^ b.alpha, db = a.beta ^ b.beta;
  const int ea = popcount(da) / 2, eb = popcount(db) / 2;
  if (ea + eb > 2) return 0;
  if (ea + eb == 0) return diagonal(h, a);
  auto lowest = [](std::uint64_t x) {
    int i = 0;
    while (!((x >> i) & 1)) ++i;
    return i;
  };
  if (ea + eb == 1) {  // b -> a by one move
    const bool alpha = ea == 1;
    const std::uint64_t diff = alpha ? da : db, from = alpha ? b.alpha : b.beta, other = alpha ? b.beta : b.alpha;
    const int p = lowest(diff & from), r = lowest(diff & ~from);
    return single_element(h, from, other, p, r);
  }
  if (ea == 1 && eb == 1) {
    const int p = lowest(da & b.alpha), r = lowest(da & ~b.alpha);
    const int q = lowest(db & b.beta), s = lowest(db & ~b.beta);
    return excitation_sign(b.alpha, p, r) * excitation_sign(b.beta, q, s) * eri(h, p, r, q, s);
  }
  const bool alpha = ea == 2;
  const std::uint64_t diff = alpha ? da : db, from = alpha ? b.alpha : b.beta;
  const std::uint64_t holes = diff & from, parts = diff & ~from;
  const int p = lowest(holes), q = lowest(holes & ~bit(p));
  const int r = lowest(parts), s = lowest(parts & ~bit(r));
  return double_sign(from, p, r, q, s) * (eri(h, p, r, q, s) - eri(h, p, s, q, r));
}

}  // namespace qstage::kernels::sci
