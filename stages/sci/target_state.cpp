#include "stages/sci/target_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>
#include <unordered_map>

#include "core/error.hpp"

namespace qstage::sci {

using kernels::sci::bit;
using kernels::sci::diagonal;
using kernels::sci::HamiltonianView;

OrbitalSymmetry::OrbitalSymmetry(const std::vector<int>& orbsym) {
  masks_.known = true;
  for (const int g : orbsym) masks_.known = masks_.known && g >= 1 && g <= 8;
  if (!masks_.known) return;
  for (std::size_t p = 0; p < orbsym.size(); ++p) masks_.mask[orbsym[p] - 1] |= bit(static_cast<int>(p));
}

std::vector<int> OrbitalSymmetry::reachable() const {
  std::set<int> span{0};
  for (int k = 0; k < 8; ++k) {
    if (!masks_.mask[k]) continue;
    std::set<int> more = span;
    for (const int s : span) more.insert(s ^ k);
    span = std::move(more);
  }
  std::vector<int> labels;
  for (const int s : span) labels.push_back(s + 1);
  return masks_.known ? labels : std::vector<int>{1};
}

namespace {

std::uint64_t low_bits(int k) { return k >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << k) - 1; }

// Descends from d over moves that lower the diagonal: an electron of one spin, or a pair of both
// spins, from orbital i to a (pair moves keep a closed shell closed, where single moves would stop
// half-way in a degenerate shell). With `keep`, only moves to determinants of that irrep.
Det descend(const HamiltonianView& h, int norb, Det d, const OrbitalSymmetry* keep, int irrep) {
  double e = diagonal(h, d);
  const std::uint64_t all = low_bits(norb);
  for (bool improved = true; improved;) {
    improved = false;
    for (int i = 0; i < norb; ++i)
      for (int a = 0; a < norb; ++a) {
        if (a == i) continue;
        const std::uint64_t move = bit(i) | bit(a);
        // alpha only, beta only, both
        for (int which = 1; which <= 3; ++which) {
          Det t = d;
          if (which & 1) t.alpha ^= move;
          if (which & 2) t.beta ^= move;
          const auto fits = [&](std::uint64_t before, std::uint64_t after, bool moved) {
            return !moved || (((before >> i) & 1) && !((before >> a) & 1) && (after & ~all) == 0);
          };
          if (!fits(d.alpha, t.alpha, which & 1) || !fits(d.beta, t.beta, which & 2)) continue;
          if (keep && keep->irrep(t) != irrep) continue;
          const double et = diagonal(h, t);
          if (et < e - 1e-12) {
            d = t;
            e = et;
            improved = true;
          }
        }
      }
  }
  return d;
}

// The lowest determinant one electron's move away from d that is of `irrep`, if any.
std::optional<Det> lowest_single_move_into(const HamiltonianView& h, int norb, const Det& d, const OrbitalSymmetry& sym,
                                           int irrep) {
  std::optional<Det> best;
  double best_e = 0;
  for (int spin = 0; spin < 2; ++spin)
    for (int i = 0; i < norb; ++i)
      for (int a = 0; a < norb; ++a) {
        const std::uint64_t s = spin ? d.beta : d.alpha;
        if (!((s >> i) & 1) || ((s >> a) & 1)) continue;
        Det t = d;
        (spin ? t.beta : t.alpha) ^= bit(i) | bit(a);
        if (sym.irrep(t) != irrep) continue;
        const double e = diagonal(h, t);
        if (!best || e < best_e - 1e-12) best = t, best_e = e;
      }
  return best;
}

std::string labels_text(const std::vector<int>& labels) {
  std::string out;
  for (const int g : labels) out += (out.empty() ? "" : ", ") + std::to_string(g);
  return out;
}

}  // namespace

TargetState find_target(const HamiltonianView& h, const Integrals& ints, std::optional<int> irrep,
                        const std::optional<std::vector<int>>& occupation) {
  const OrbitalSymmetry sym(ints.orbsym);
  TargetState t;
  t.ms2 = ints.ms2;
  t.symmetry_known = sym.known();
  const int na = ints.nalpha(), nb = ints.nbeta();
  const std::vector<int> reachable = sym.reachable();
  if (irrep && std::find(reachable.begin(), reachable.end(), *irrep) == reachable.end())
    throw InputError(fmt::format("parameter 'irrep' is {}, which no determinant has: ORBSYM's labels make {}; expected one of them",
                                 *irrep, labels_text(reachable)));
  if (occupation) {
    Det d{};
    for (const int so : *occupation) {
      if (so < 0 || so >= 2 * ints.norb)
        throw InputError(fmt::format("parameter 'occupation' has spin orbital {}; expected 0 to {} (2p: orbital p's alpha, "
                                     "2p + 1: its beta)", so, 2 * ints.norb - 1));
      std::uint64_t& s = so % 2 ? d.beta : d.alpha;
      if ((s >> (so / 2)) & 1) throw InputError(fmt::format("parameter 'occupation' lists spin orbital {} twice", so));
      s |= bit(so / 2);
    }
    if (std::popcount(d.alpha) != na || std::popcount(d.beta) != nb)
      throw InputError(fmt::format("parameter 'occupation' has {} alpha and {} beta electrons; expected {} and {} "
                                   "(NELEC={}, MS2={})", std::popcount(d.alpha), std::popcount(d.beta), na, nb, ints.nelec,
                                   ints.ms2));
    if (irrep && sym.irrep(d) != *irrep)
      throw InputError(fmt::format("parameter 'occupation' is a determinant of irrep {}, parameter 'irrep' asks for {}; "
                                   "expected an occupation of that irrep, or no 'irrep'", sym.irrep(d), *irrep));
    t.irrep = sym.irrep(d);
    t.irrep_from = irrep ? "parameter irrep" : "occupation";
    t.reference = d;
    t.reference_diagonal = diagonal(h, d);
    return t;
  }
  t.irrep = irrep.value_or(sym.known() ? ints.isym : 1);
  t.irrep_from = irrep ? "parameter irrep" : "ISYM";
  if (!irrep && std::find(reachable.begin(), reachable.end(), t.irrep) == reachable.end())
    throw InputError(fmt::format("the FCIDUMP's ISYM is {}, which no determinant has: ORBSYM's labels make {}; expected "
                                 "parameter 'irrep' to say which state", t.irrep, labels_text(reachable)));
  const Det aufbau{low_bits(na), low_bits(nb)};
  const Det lowest = descend(h, ints.norb, aufbau, nullptr, 0);
  Det d = lowest;
  if (sym.irrep(lowest) != t.irrep) {
    const std::optional<Det> into = lowest_single_move_into(h, ints.norb, lowest, sym, t.irrep);
    if (!into)
      throw InputError(fmt::format("no determinant of irrep {} with NELEC={}, MS2={} is one electron's move from the lowest "
                                   "one found ({}); expected parameter 'occupation' to give one",
                                   t.irrep, ints.nelec, ints.ms2, describe(lowest, ints.norb)));
    d = descend(h, ints.norb, *into, &sym, t.irrep);
  }
  t.reference = d;
  t.reference_diagonal = diagonal(h, d);
  const double lowest_e = diagonal(h, lowest);
  if (sym.irrep(lowest) != t.irrep && lowest_e < t.reference_diagonal - 1e-12) {
    t.lower_elsewhere = lowest;
    t.lower_elsewhere_diagonal = lowest_e;
    t.lower_elsewhere_irrep = sym.irrep(lowest);
  }
  return t;
}

namespace {
struct DetHash {
  std::size_t operator()(const Det& d) const {
    std::uint64_t x = d.alpha * 0x9E3779B97F4A7C15ull ^ (d.beta + 0x632BE59BD9B4E019ull + (d.alpha << 6) + (d.alpha >> 2));
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return static_cast<std::size_t>(x);
  }
};
}  // namespace

double spin_squared(const std::vector<Det>& dets, const std::vector<double>& c) {
  if (dets.empty()) return 0;
  double norm2 = 0;
  for (const double x : c) norm2 += x * x;
  if (!(norm2 > 0)) return 0;
  // S_+ = sum_p a+_{p alpha} a_{p beta}: onto |A + p, B - p> with the sign of moving past the
  // electrons below p of both spins (and all of alpha's, the same for every determinant).
  std::unordered_map<Det, double, DetHash> raised;
  raised.reserve(dets.size() * 4);
  for (std::size_t i = 0; i < dets.size(); ++i) {
    const Det& d = dets[i];
    for (std::uint64_t open = d.beta & ~d.alpha; open; open &= open - 1) {
      const int p = std::countr_zero(open);
      const std::uint64_t below = bit(p) - 1;
      const int moves = std::popcount(d.alpha & below) + std::popcount(d.beta & below);
      raised[Det{d.alpha | bit(p), d.beta & ~bit(p)}] += (moves & 1 ? -c[i] : c[i]);
    }
  }
  double plus = 0;
  for (const auto& [det, v] : raised) plus += v * v;
  const double sz = 0.5 * (std::popcount(dets[0].alpha) - std::popcount(dets[0].beta));
  return plus / norm2 + sz * (sz + 1);
}

std::string describe(const Det& d, int norb) {
  auto list = [&](std::uint64_t s) {
    std::string out;
    for (int p = 0; p < norb;) {
      if (!((s >> p) & 1)) {
        ++p;
        continue;
      }
      int q = p;
      while (q + 1 < norb && ((s >> (q + 1)) & 1)) ++q;
      out += (out.empty() ? "" : ", ") + (q == p ? std::to_string(p) : fmt::format("{}-{}", p, q));
      p = q + 1;
    }
    return out.empty() ? std::string("none") : out;
  };
  return fmt::format("alpha {}; beta {}", list(d.alpha), list(d.beta));
}

}  // namespace qstage::sci
