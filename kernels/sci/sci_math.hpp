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
#include "kernels/common.hpp"

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

// A generated determinant with a tag and a value: the semistochastic PT2's records (32 bytes),
// which keys.dedup reads as a three-word key (alpha, beta, tag) and a float64 summed per key.
struct TaggedCandidate {
  std::uint64_t alpha = 0, beta = 0, tag = 0;
  double value = 0;
};
static_assert(sizeof(TaggedCandidate) == 32);

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

// <D|H|D>: the one-electron terms of the occupied orbitals, then the two-electron terms over the
// unordered pairs p < q of occupied orbitals (J and K are symmetric; a same-spin pair's own
// J_pp - K_pp is 0) and each doubly occupied orbital's J_pp, added in turn to four partial sums,
// so four additions are in flight at once: one chain of dependent additions over the ordered
// pairs (the form before) was most of a candidate's scoring on the CPU. Every product is exact
// (by 0, 1 or 2) and feeds one addition, so the CPU and the GPU round alike, contracted or not.
QSTAGE_HD double diagonal(const HamiltonianView& h, const Det& d) {
  const int n = h.norb;
  const std::uint64_t occupied = d.alpha | d.beta;
  double one = 0, s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const auto add = [&](double t) {  // (s0 gets the next term; the sums rotate)
    const double next = s0 + t;
    s0 = s1, s1 = s2, s2 = s3, s3 = next;
  };
  for (std::uint64_t ps = occupied; ps; ps &= ps - 1) {
    const int p = lowest_bit(ps);
    const int pa = static_cast<int>((d.alpha >> p) & 1), pb = static_cast<int>((d.beta >> p) & 1);
    one += (pa + pb) * h.h1[p * n + p];
    const double* coulomb = h.coulomb + p * n;
    const double* exchange = h.exchange + p * n;
    if (pa & pb) add(coulomb[p]);
    for (std::uint64_t qs = ps & (ps - 1); qs; qs &= qs - 1) {  // (q > p)
      const int q = lowest_bit(qs);
      const int qa = static_cast<int>((d.alpha >> q) & 1), qb = static_cast<int>((d.beta >> q) & 1);
      const double j = coulomb[q];
      add((pa * qa + pb * qb) * (j - exchange[q]) + (pa * qb + pb * qa) * j);
    }
  }
  return h.core + one + ((s0 + s1) + (s2 + s3));
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
  if (ea + eb == 1) {  // b -> a by one move
    const bool alpha = ea == 1;
    const std::uint64_t diff = alpha ? da : db, from = alpha ? b.alpha : b.beta, other = alpha ? b.beta : b.alpha;
    const int p = lowest_bit(diff & from), r = lowest_bit(diff & ~from);
    return single_element(h, from, other, p, r);
  }
  if (ea == 1 && eb == 1) {
    const int p = lowest_bit(da & b.alpha), r = lowest_bit(da & ~b.alpha);
    const int q = lowest_bit(db & b.beta), s = lowest_bit(db & ~b.beta);
    return excitation_sign(b.alpha, p, r) * excitation_sign(b.beta, q, s) * eri(h, p, r, q, s);
  }
  const bool alpha = ea == 2;
  const std::uint64_t diff = alpha ? da : db, from = alpha ? b.alpha : b.beta;
  const std::uint64_t holes = diff & from, parts = diff & ~from;
  const int p = lowest_bit(holes), q = lowest_bit(holes & ~bit(p));
  const int r = lowest_bit(parts), s = lowest_bit(parts & ~bit(r));
  return double_sign(from, p, r, q, s) * (eri(h, p, r, q, s) - eri(h, p, s, q, r));
}

}  // namespace qstage::kernels::sci

namespace qstage::kernels::sci {

// ---------------------------------------------------------------- coupled-configuration lists
// A source determinant's excitations are a sequence of lists, in this order: the singles of each
// occupied alpha orbital, of each occupied beta orbital, the opposite-spin doubles of each
// (alpha, beta) pair of occupied orbitals, the same-spin doubles of each alpha pair, then of each
// beta pair (orbitals and pairs ascending). Each list is cut where heat-bath screening stops it
// (cut_length), and entry k of the concatenated cut lists is "virtual excitation" k: a GPU thread
// evaluates one, the CPU twin walks them in order, and both emit the valid ones in this order.
enum class ListKind : int { single_alpha, single_beta, opposite, same_alpha, same_beta };

struct ListRef {
  ListKind kind = ListKind::single_alpha;
  int p = 0, q = 0;  // occupied orbitals (singles: p only; same-spin: p < q)
};

// How many lists a determinant with `na` alpha and `nb` beta electrons has.
QSTAGE_HD std::uint32_t list_count(int na, int nb) {
  return static_cast<std::uint32_t>(na + nb + na * nb + na * (na - 1) / 2 + nb * (nb - 1) / 2);
}

// The j of pair index m = j(j-1)/2 + i, i < j.
QSTAGE_HD int pair_high(std::uint32_t m) {
  int j = 1;
  while (static_cast<std::uint32_t>(j * (j + 1) / 2) <= m) ++j;
  return j;
}

QSTAGE_HD ListRef list_at(std::uint32_t l, int na, int nb, const int* occ_a, const int* occ_b) {
  if (l < static_cast<std::uint32_t>(na)) return {ListKind::single_alpha, occ_a[l], 0};
  l -= na;
  if (l < static_cast<std::uint32_t>(nb)) return {ListKind::single_beta, occ_b[l], 0};
  l -= nb;
  if (l < static_cast<std::uint32_t>(na * nb)) return {ListKind::opposite, occ_a[l / nb], occ_b[l % nb]};
  l -= na * nb;
  const bool alpha = l < static_cast<std::uint32_t>(na * (na - 1) / 2);
  if (!alpha) l -= na * (na - 1) / 2;
  const int j = pair_high(l), i = static_cast<int>(l) - j * (j - 1) / 2;
  const int* occ = alpha ? occ_a : occ_b;
  return {alpha ? ListKind::same_alpha : ListKind::same_beta, occ[i], occ[j]};
}

// The list's padded slots: (its row in the table, its length, its width).
struct ListSlots {
  std::uint64_t first = 0;
  std::uint32_t length = 0;
};
QSTAGE_HD ListSlots list_slots(const HamiltonianView& h, const ListRef& l) {
  switch (l.kind) {
    case ListKind::single_alpha:
    case ListKind::single_beta:
      return {static_cast<std::uint64_t>(l.p) * h.single_width, h.single_length[l.p]};
    case ListKind::opposite: {
      const std::uint64_t pair = static_cast<std::uint64_t>(l.p) * h.norb + l.q;
      return {pair * h.opposite_width, h.opposite_length[pair]};
    }
    default: {
      const std::uint64_t pair = same_pair(l.p, l.q);
      return {pair * h.same_width, h.same_length[pair]};
    }
  }
}

// |entry k|'s screening magnitude: a bound of |H| for singles, |H| for doubles.
QSTAGE_HD double list_magnitude(const HamiltonianView& h, const ListRef& l, std::uint64_t slot) {
  switch (l.kind) {
    case ListKind::single_alpha:
    case ListKind::single_beta: return h.single_bound[slot];
    case ListKind::opposite: return h.opposite_value[slot] < 0 ? -h.opposite_value[slot] : h.opposite_value[slot];
    default: return h.same_value[slot] < 0 ? -h.same_value[slot] : h.same_value[slot];
  }
}

// How many leading entries of the list pass heat-bath screening for a source with |c| = abs_c:
// magnitude * abs_c > eps (the lists are sorted by magnitude descending). A galloping search from
// the front, then a binary one: most lists of most sources pass few entries or none (a small |c|),
// and a list of 24 electrons' pairs (Cr2: 1,176 lists a source) then costs one or two probes, not
// the log of its width.
QSTAGE_HD std::uint32_t cut_length(const HamiltonianView& h, const ListRef& l, double abs_c, double eps) {
  const ListSlots s = list_slots(h, l);
  std::uint32_t lo = 0, hi = 1;  // entries before lo pass
  while (hi < s.length && list_magnitude(h, l, s.first + hi - 1) * abs_c > eps) {
    lo = hi;
    hi *= 2;
  }
  if (hi > s.length) hi = s.length;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (list_magnitude(h, l, s.first + mid) * abs_c > eps) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Entry k of the source's list l: false when it is not an excitation of this determinant (a
// target occupied) or, for singles, its exact element fails the screening; else the target
// determinant and <target|H|source> (phase included) in *out.
QSTAGE_HD bool list_entry(const HamiltonianView& h, const Det& d, const ListRef& l, std::uint32_t k, double abs_c,
                          double eps, Det* target, double* element) {
  const ListSlots s = list_slots(h, l);
  const std::uint64_t slot = s.first + k;
  switch (l.kind) {
    case ListKind::single_alpha:
    case ListKind::single_beta: {
      const bool alpha = l.kind == ListKind::single_alpha;
      const int r = h.single_target[slot];
      const std::uint64_t same = alpha ? d.alpha : d.beta, other = alpha ? d.beta : d.alpha;
      if ((same >> r) & 1) return false;
      const double v = single_element(h, same, other, l.p, r);
      if (!((v < 0 ? -v : v) * abs_c > eps)) return false;
      const std::uint64_t moved = same ^ bit(l.p) ^ bit(r);
      *target = alpha ? Det{moved, d.beta} : Det{d.alpha, moved};
      *element = v;
      return true;
    }
    case ListKind::opposite: {
      const int r = h.opposite_target[slot] & 0xff, t = h.opposite_target[slot] >> 8;
      if (((d.alpha >> r) & 1) || ((d.beta >> t) & 1)) return false;
      *target = Det{d.alpha ^ bit(l.p) ^ bit(r), d.beta ^ bit(l.q) ^ bit(t)};
      *element = excitation_sign(d.alpha, l.p, r) * excitation_sign(d.beta, l.q, t) * h.opposite_value[slot];
      return true;
    }
    default: {
      const bool alpha = l.kind == ListKind::same_alpha;
      const int r = h.same_target[slot] & 0xff, t = h.same_target[slot] >> 8;
      const std::uint64_t same = alpha ? d.alpha : d.beta;
      if (((same >> r) & 1) || ((same >> t) & 1)) return false;
      const std::uint64_t moved = same ^ bit(l.p) ^ bit(l.q) ^ bit(r) ^ bit(t);
      *target = alpha ? Det{moved, d.beta} : Det{d.alpha, moved};
      *element = double_sign(same, l.p, r, l.q, t) * h.same_value[slot];
      return true;
    }
  }
}

// The occupied orbitals of a string, ascending; returns how many.
QSTAGE_HD int occupied(std::uint64_t s, int* out) {
  int n = 0;
  while (s) {
    const int p = lowest_bit(s);
    out[n++] = p;
    s &= s - 1;
  }
  return n;
}

// The place of an excitation among a source's lists at eps = 0: (list << 16) | entry, where
// `entry` is the target's index in that list (the tables are built by sci_space_pairs.hpp's
// ListOrder, kListAbsent where a list leaves the target out: an integral of zero). With the
// list's start among the source's virtual excitations, it is the virtual excitation the
// enumeration visits the target at.
inline constexpr std::uint32_t kNotListed = ~std::uint32_t{0};
inline constexpr std::uint16_t kListAbsent = 0xffff;
struct ListOrderView {
  int norb = 0;
  const std::uint16_t* single = nullptr;    // norb x norb: p -> r
  const std::uint16_t* opposite = nullptr;  // norb^4: ((p * norb + q) * norb + r) * norb + s
  const std::uint16_t* same = nullptr;      // pairs x pairs: same_pair(p, q) x same_pair(r, s)
};

// The rank of orbital p among the occupied orbitals of string s.
QSTAGE_HD int rank_in(std::uint64_t s, int p) { return popcount(s & (bit(p) - 1)); }

// The excitation source -> target (one or two electrons apart), or kNotListed.
QSTAGE_HD std::uint32_t list_key(const ListOrderView& o, const Det& source, const Det& target, int na, int nb) {
  const std::uint64_t n = static_cast<std::uint64_t>(o.norb), pairs = n * (n - 1) / 2;
  const std::uint64_t da = source.alpha ^ target.alpha, db = source.beta ^ target.beta;
  const int ea = popcount(da) / 2, eb = popcount(db) / 2;
  const auto listed = [](std::uint64_t list, std::uint16_t entry) {
    return entry == kListAbsent ? kNotListed : static_cast<std::uint32_t>(list << 16 | entry);
  };
  if (ea + eb == 1) {
    const bool alpha = ea == 1;
    const std::uint64_t diff = alpha ? da : db, from = alpha ? source.alpha : source.beta;
    const int p = lowest_bit(diff & from), r = lowest_bit(diff & ~from);
    return listed((alpha ? 0 : na) + rank_in(from, p), o.single[p * n + r]);
  }
  const std::uint64_t first_double = static_cast<std::uint64_t>(na + nb);
  if (ea == 1 && eb == 1) {
    const int p = lowest_bit(da & source.alpha), r = lowest_bit(da & ~source.alpha);
    const int q = lowest_bit(db & source.beta), s = lowest_bit(db & ~source.beta);
    const std::uint64_t list = first_double + static_cast<std::uint64_t>(rank_in(source.alpha, p)) * nb + rank_in(source.beta, q);
    return listed(list, o.opposite[((p * n + q) * n + r) * n + s]);
  }
  const bool alpha = ea == 2;
  const std::uint64_t diff = alpha ? da : db, from = alpha ? source.alpha : source.beta;
  const std::uint64_t holes = diff & from, parts = diff & ~from;
  const int p = lowest_bit(holes), q = lowest_bit(holes & ~bit(p));
  const int r = lowest_bit(parts), s = lowest_bit(parts & ~bit(r));
  const int i = rank_in(from, p), k = rank_in(from, q);  // i < k
  std::uint64_t list = first_double + static_cast<std::uint64_t>(na) * nb + static_cast<std::uint64_t>(k * (k - 1) / 2 + i);
  if (!alpha) list += static_cast<std::uint64_t>(na) * (na - 1) / 2;
  return listed(list, o.same[same_pair(p, q) * pairs + same_pair(r, s)]);
}

// Index of `key` in the sorted `keys[0, n)`, or n when absent.
QSTAGE_HD std::uint64_t find_sorted(const Det* keys, std::uint64_t n, const Det& key) {
  std::uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && keys[lo] == key ? lo : n;
}

// A bitmap with one hashed bit per determinant of a sorted space: a determinant whose bit is
// clear is not in the space, so most lookups of excitations that leave the space end at one read
// instead of a binary search (the same index either way). Built by kernels::sci_space_filter.
struct SpaceFilter {
  const std::uint32_t* words = nullptr;  // (mask + 1) / 32 words; null: no filter, every lookup searches
  std::uint64_t mask = 0;                // bits - 1, bits a power of two
};
QSTAGE_HD std::uint64_t filter_bit(const SpaceFilter& f, const Det& d) {
  std::uint64_t x = d.alpha * 0x9E3779B97F4A7C15ull ^ (d.beta * 0xC2B2AE3D27D4EB4Full);
  x ^= x >> 31;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return x & f.mask;
}
// Index of `key` in the sorted `keys[0, n)` that `f` was built from, or n when absent.
QSTAGE_HD std::uint64_t find_filtered(const Det* keys, std::uint64_t n, const SpaceFilter& f, const Det& key) {
  if (f.words) {
    const std::uint64_t b = filter_bit(f, key);
    if (!((f.words[b >> 5] >> (b & 31)) & 1u)) return n;
  }
  return find_sorted(keys, n, key);
}

// A determinant's irrep in D2h or a subgroup: the product of its electrons' orbitals' irreps,
// labels 0-7 (the FCIDUMP's minus one) whose products are XORs. mask[g]: the orbitals of label g.
struct IrrepMasks {
  std::uint64_t mask[8] = {};
  int target = 0;      // the label looked for
  bool known = false;  // false: every determinant counts as the target's
};
QSTAGE_HD int irrep_of(const IrrepMasks& m, const Det& d) {
  int g = 0;
  for (int k = 1; k < 8; ++k)  // (label 0's electrons change nothing)
    if ((popcount(d.alpha & m.mask[k]) + popcount(d.beta & m.mask[k])) & 1) g ^= k;
  return g;
}

// Whether scoring skips a candidate: it is in the sorted space, or of another irrep.
QSTAGE_HD unsigned char score_skips(const Det* space, std::uint64_t space_size, const SpaceFilter& filter,
                                    const IrrepMasks& m, const Det& d) {
  return find_filtered(space, space_size, filter, d) < space_size || (m.known && irrep_of(m, d) != m.target);
}

// E - H_aa kept at least kDenominatorFloor from zero: a candidate degenerate with the space's
// energy (a shell the space fills only in part) would otherwise give an infinite PT2 term and
// amplitude; with the floor it scores first, joins the space, and no longer counts in PT2.
constexpr double kDenominatorFloor = 1e-6;
QSTAGE_HD double floored_denominator(double denominator) {
  if (denominator >= kDenominatorFloor || denominator <= -kDenominatorFloor) return denominator;
  return denominator < 0 ? -kDenominatorFloor : kDenominatorFloor;
}

}  // namespace qstage::kernels::sci
