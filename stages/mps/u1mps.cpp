#include "stages/mps/u1mps.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/parallel.hpp"
#include "kernels/common.hpp"
#include "kernels/tensor/random.hpp"
#include "kernels/mps/u1_math.hpp"
#include "stages/mps/linalg.hpp"

namespace qstage::stages::mps {

std::vector<Sector> Bond::sectors() const {
  std::vector<Sector> out;
  for (std::int64_t i = 0; i < size(); ++i) {
    if (out.empty() || out.back().charge != charges[i]) out.push_back({charges[i], i, 0});
    ++out.back().size;
  }
  return out;
}

Sector Bond::sector(int charge) const {
  const auto lo = std::lower_bound(charges.begin(), charges.end(), charge);
  const auto hi = std::upper_bound(lo, charges.end(), charge);
  return {charge, lo - charges.begin(), hi - lo};
}

const Block* Site::find(int c_left, int c_right) const {
  auto it = std::lower_bound(blocks.begin(), blocks.end(), std::pair{c_left, c_right},
                             [](const Block& b, std::pair<int, int> k) { return std::pair{b.c_left, b.c_right} < k; });
  return it != blocks.end() && it->c_left == c_left && it->c_right == c_right ? &*it : nullptr;
}

Block* Site::find(int c_left, int c_right) {
  return const_cast<Block*>(static_cast<const Site*>(this)->find(c_left, c_right));
}

void U1Mps::check_structure() const {
  auto fail = [](const std::string& what) { throw std::runtime_error("mps: " + what); };
  if (L < 1 || d < 2) fail(fmt::format("L = {} and d = {}; expected L >= 1 and d >= 2", L, d));
  if (bonds.size() != static_cast<std::size_t>(L + 1) || sites.size() != static_cast<std::size_t>(L))
    fail(fmt::format("{} bonds and {} sites; expected L + 1 = {} and L = {}", bonds.size(), sites.size(), L + 1, L));
  // Bond 0 may carry several totals N (a mixed boundary), one index each, the largest being total_charge.
  const auto& b0 = bonds[0].charges;
  const kernels::ChargeRule cr = rule();
  // n_pair: total_charge is the largest component of bond 0's pairs.
  int largest = b0.empty() ? -1 : b0.back();
  if (pair()) {
    largest = -1;
    for (int c : b0) largest = std::max({largest, kernels::pair_ket(c), kernels::pair_bra(c)});
  }
  if (pair() && (L * (d - 1) > kernels::kPairMax || !(weight > 0) || !std::isfinite(weight)))
    fail(fmt::format("a density matrix with L (d-1) = {} photons and weight {}; expected at most {} and a finite weight > 0", L * (d - 1), weight,
                     kernels::kPairMax));
  if (b0.empty() || largest != total_charge || b0.front() < 0 || total_charge > L * (d - 1) || std::adjacent_find(b0.begin(), b0.end(), std::greater_equal<>()) != b0.end() ||
      bonds[L].charges != std::vector<int>{0})
    fail(fmt::format("boundary bonds must carry 0 (right) and distinct ascending totals 0 <= N <= {} (left), the largest N = {}",
                     L * (d - 1), total_charge));
  for (int k = 0; k <= L; ++k) {
    const Bond& b = bonds[k];
    if (b.lambda.size() != b.charges.size()) fail(fmt::format("bond {} has {} charges but {} Schmidt values", k, b.charges.size(), b.lambda.size()));
    if (!std::is_sorted(b.charges.begin(), b.charges.end())) fail(fmt::format("bond {}'s charges are not ascending", k));
  }
  for (int j = 0; j < L; ++j) {
    const auto& blocks = sites[j].blocks;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const Block& blk = blocks[i];
      if (!cr.allowed(blk.c_left, blk.c_right))
        fail(fmt::format("site {} has a block ({}, {}) whose occupation is outside [0, {}]", j, blk.c_left, blk.c_right, d - 1));
      if (i > 0 && std::pair{blocks[i - 1].c_left, blocks[i - 1].c_right} >= std::pair{blk.c_left, blk.c_right})
        fail(fmt::format("site {}'s blocks are not sorted by (c_left, c_right) without repeats", j));
      const Sector l = bonds[j].sector(blk.c_left), r = bonds[j + 1].sector(blk.c_right);
      if (l.size != blk.rows || r.size != blk.cols || blk.values.size() != static_cast<std::size_t>(blk.rows * blk.cols))
        fail(fmt::format("site {} block ({}, {}) is {} x {} but its sectors are {} x {}", j, blk.c_left, blk.c_right,
                         blk.rows, blk.cols, l.size, r.size));
    }
  }
}

U1Mps product_state(int d, const std::vector<int>& occupations) {
  U1Mps psi;
  psi.L = static_cast<int>(occupations.size());
  psi.d = d;
  psi.total_charge = std::accumulate(occupations.begin(), occupations.end(), 0);
  psi.bonds.resize(psi.L + 1);
  psi.sites.resize(psi.L);
  int right = psi.total_charge;
  for (int k = 0; k <= psi.L; ++k) {
    psi.bonds[k] = {{right}, {1.0}};
    if (k < psi.L) right -= occupations[k];
  }
  for (int j = 0; j < psi.L; ++j)
    psi.sites[j].blocks.push_back({psi.bonds[j].charges[0], psi.bonds[j + 1].charges[0], 1, 1, {cplx{1.0, 0.0}}});
  return psi;
}

U1Mps product_superposition(int d, const std::vector<std::vector<cplx>>& amplitudes, kernels::ChargeKind kind) {
  U1Mps psi;
  psi.L = static_cast<int>(amplitudes.size());
  psi.d = d;
  psi.kind = kind;
  psi.bonds.resize(psi.L + 1);
  psi.sites.resize(psi.L);
  const kernels::ChargeRule cr = psi.rule();
  const int D = cr.local_dim();
  // Right to left: the totals the sites k..L-1 reach with nonzero amplitude (ascending).
  std::vector<std::set<int>> reach(psi.L + 1);
  reach[psi.L] = {0};
  for (int k = psi.L - 1; k >= 0; --k)
    for (int c : reach[k + 1])
      for (int s = 0; s < D; ++s)
        if (amplitudes[k].at(s) != cplx{}) reach[k].insert(c + cr.delta(s));
  for (int k = 0; k <= psi.L; ++k)
    for (int c : reach[k]) psi.bonds[k].charges.push_back(c), psi.bonds[k].lambda.push_back(1.0);
  if (psi.bonds[0].charges.empty()) throw std::invalid_argument("mps: a product state with a site of amplitude 0");
  psi.total_charge = psi.bonds[0].charges.back();
  if (psi.pair()) {
    psi.total_charge = 0;
    for (int c : psi.bonds[0].charges) psi.total_charge = std::max({psi.total_charge, kernels::pair_ket(c), kernels::pair_bra(c)});
  }
  for (int j = 0; j < psi.L; ++j)
    for (int cl : psi.bonds[j].charges)
      for (int cr_ : psi.bonds[j + 1].charges)
        if (cr.allowed(cl, cr_) && amplitudes[j][cr.local(cl, cr_)] != cplx{})
          psi.sites[j].blocks.push_back({cl, cr_, 1, 1, {amplitudes[j][cr.local(cl, cr_)]}});
  canonicalize(psi);
  return psi;
}

namespace {

// The blocks of site j leaving a left sector, side by side: rows = the sector, columns = the
// concatenation of the right sectors in ascending charge.
struct RowGroup {
  std::vector<std::size_t> blocks;  // indices into the site's blocks
  std::int64_t rows = 0, cols = 0;
};

// The site's blocks grouped by their left charge (a row group: one sector of rows, the blocks
// side by side) or by their right charge (a column group: one sector of columns, stacked).
std::map<int, RowGroup> groups_by(const Site& s, bool by_left) {
  std::map<int, RowGroup> g;
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    const auto& b = s.blocks[i];
    auto& grp = g[by_left ? b.c_left : b.c_right];
    grp.blocks.push_back(i);
    if (by_left) grp.rows = b.rows, grp.cols += b.cols;
    else grp.cols = b.cols, grp.rows += b.rows;
  }
  return g;
}
std::map<int, RowGroup> groups_by_left(const Site& s) { return groups_by(s, true); }
std::map<int, RowGroup> groups_by_right(const Site& s) { return groups_by(s, false); }

// Rebuilds a bond from per-charge sizes and Schmidt values (ascending charge; sizes of 0 leave the charge out).
Bond make_bond(const std::map<int, std::vector<double>>& values) {
  Bond b;
  for (const auto& [c, lam] : values)
    for (double l : lam) {
      b.charges.push_back(c);
      b.lambda.push_back(l);
    }
  return b;
}

void drop_empty_blocks(Site& s) {
  std::erase_if(s.blocks, [](const Block& b) { return b.rows == 0 || b.cols == 0; });
}

// The end of the right-to-left sweep: per total N, the one row of site 0 now has norm 1 and U S
// (1 x 1) holds its amplitude. lambda[0] becomes the normalised |old lambda[0] U S| (sqrt P(N)),
// the phase stays in the row; totals of weight 0 are dropped.
void normalise_boundary(U1Mps& psi, const std::map<int, std::vector<cplx>>& carry) {
  Bond& b0 = psi.bonds[0];
  std::map<int, cplx> amp;
  double norm2 = 0;  // summed from |a|^2 so that a single total gets lambda = |a| / sqrt(|a|^2) = 1 exactly
  for (std::int64_t i = 0; i < b0.size(); ++i) {
    const auto it = carry.find(b0.charges[i]);
    const cplx a = it == carry.end() ? cplx{} : b0.lambda[i] * it->second.at(0);
    if (std::abs(a) > 0) amp[b0.charges[i]] = a, norm2 += std::abs(a) * std::abs(a);
  }
  if (amp.empty()) throw RuntimeFailure("mps: the state has norm 0");
  Bond kept;
  for (const auto& [c, a] : amp) {
    kept.charges.push_back(c);
    kept.lambda.push_back(std::abs(a) / std::sqrt(norm2));
  }
  std::erase_if(psi.sites[0].blocks, [&](const Block& b) { return !amp.count(b.c_left); });
  for (Block& b : psi.sites[0].blocks)
    for (cplx& v : b.values) v *= amp.at(b.c_left) / std::abs(amp.at(b.c_left));
  psi.total_charge = kept.charges.back();
  if (psi.pair()) {
    // rho = weight * (the state): the norm taken out goes into the weight.
    psi.weight *= std::sqrt(norm2);
    psi.total_charge = 0;
    for (int c : kept.charges) psi.total_charge = std::max({psi.total_charge, kernels::pair_ket(c), kernels::pair_bra(c)});
  }
  b0 = std::move(kept);
}

// Right to left: per left sector, [B(c_L, c_R) ...] = U S Vh; the site keeps Vh (orthonormal
// rows), U S moves into the site on the left. Leaves psi right-canonical with norm 1 (bond 0's
// lambda sqrt P(N)); the inner bonds' lambda are placeholders until the left-to-right sweep.
void right_to_left_sweep(U1Mps& psi, int from) {
  for (int j = from; j >= 0; --j) {
    Site& s = psi.sites[j];
    // The groups' SVDs run on the OpenMP threads (each LAPACK call on one thread, so the bits do
    // not depend on their count); each writes only its own blocks and its own slot.
    const std::map<int, RowGroup> by_left = groups_by_left(s);
    const std::vector<std::pair<int, RowGroup>> groups(by_left.begin(), by_left.end());
    std::vector<std::vector<cplx>> us_of(groups.size());  // per group: U S, old rows x kept
    std::vector<std::int64_t> kept_of(groups.size());
    const auto count = static_cast<std::int64_t>(groups.size());
    parallel_for(count, [&](std::int64_t gi) {
      const RowGroup& g = groups[gi].second;
      std::vector<cplx> m(static_cast<std::size_t>(g.rows * g.cols));
      std::int64_t col0 = 0;
      for (std::size_t bi : g.blocks) {
        const Block& b = s.blocks[bi];
        for (std::int64_t r = 0; r < b.rows; ++r)
          std::copy_n(&b.values[r * b.cols], b.cols, &m[r * g.cols + col0]);
        col0 += b.cols;
      }
      Svd f = svd(m.data(), g.rows, g.cols);
      std::int64_t keep = 0;
      while (keep < f.rank && f.s[keep] > 1e-14 * std::max(f.s[0], 1e-300)) ++keep;
      if (j == 0) keep = f.rank;  // the boundary: one row per total N, its norm goes to lambda[0]
      col0 = 0;
      for (std::size_t bi : g.blocks) {
        Block& b = s.blocks[bi];
        std::vector<cplx> v(static_cast<std::size_t>(keep * b.cols));
        for (std::int64_t r = 0; r < keep; ++r) std::copy_n(&f.vh[r * g.cols + col0], b.cols, &v[r * b.cols]);
        col0 += b.cols;
        b.rows = keep;
        b.values = std::move(v);
      }
      std::vector<cplx> us(static_cast<std::size_t>(g.rows * keep));
      for (std::int64_t r = 0; r < g.rows; ++r)
        for (std::int64_t p = 0; p < keep; ++p) us[r * keep + p] = f.u[r * f.rank + p] * f.s[p];
      us_of[gi] = std::move(us);
      kept_of[gi] = keep;
    });
    std::map<int, std::vector<double>> new_bond;
    std::map<int, std::vector<cplx>> carry;  // per charge: U S, old rows x rank
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      carry[groups[gi].first] = std::move(us_of[gi]);
      new_bond[groups[gi].first].assign(static_cast<std::size_t>(kept_of[gi]), 1.0);
    }
    drop_empty_blocks(s);
    if (j == 0) {
      normalise_boundary(psi, carry);
      continue;
    }
    psi.bonds[j] = make_bond(new_bond);
    std::vector<Block>& left = psi.sites[j - 1].blocks;
    const auto blocks = static_cast<std::int64_t>(left.size());
    const Bond& bond = psi.bonds[j];
    parallel_for(blocks, [&](std::int64_t bi) {
      Block& b = left[bi];
      const auto it = carry.find(b.c_right);
      const std::int64_t keep = it == carry.end() ? 0 : bond.sector(b.c_right).size;
      std::vector<cplx> v(static_cast<std::size_t>(b.rows * keep));
      if (keep > 0) matmul(b.values.data(), it->second.data(), v.data(), b.rows, b.cols, keep);
      b.cols = keep;
      b.values = std::move(v);
    });
    drop_empty_blocks(psi.sites[j - 1]);
  }
}

// Left to right, on a right-canonical psi: sets every inner bond's lambda to its Schmidt values.
// With `trunc`, each bond is cut there (the global truncation over its charges) before the sweep
// moves on: the SVD compression of an MPS, each cut optimal given the ones left of it. Returns
// the summed discarded weight (each cut's, normalised to the state at that point).
double left_to_right_sweep(U1Mps& psi, const TruncParams* trunc) {
  const int L = psi.L;
  double discarded = 0;
  // Left to right: X_j (per sector of bond j, the left part's gauge) times B[j], grouped by right
  // charge, is U S V; lambda[j+1] = S, B[j+1] <- V B[j+1], B[j] <- B[j] V^dagger. X_j is diagonal
  // (the previous step's S; bond 0's is lambda[0]: with a mixed boundary the left part is the
  // record of N), so X_j B[j] scales B[j]'s rows; each product is the one a dense diagonal X gave
  // (its other terms are exact zeros), at a row's cost instead of a sector's.
  std::map<int, std::vector<double>> x;  // per charge of bond j: the diagonal, one per row of its blocks
  for (std::int64_t i = 0; i < psi.bonds[0].size(); ++i) x[psi.bonds[0].charges[i]] = {psi.bonds[0].lambda[i]};
  for (int j = 0; j < L - 1; ++j) {
    Site& s = psi.sites[j];
    std::map<int, std::vector<double>> lam;
    std::map<int, std::vector<cplx>> rot;  // per right charge: V, keep x old size
    std::map<int, std::vector<double>> next_x;  // per right charge: its kept S, the next bond's X
    // Per right charge c: X(c_L) B(c_L, c) stacked over c_L, and its SVD.
    // (the groups on the OpenMP threads, as in the sweep right to left)
    const std::map<int, RowGroup> by_right = groups_by_right(s);
    const std::vector<std::pair<int, RowGroup>> groups(by_right.begin(), by_right.end());
    std::vector<std::pair<int, Svd>> factors(groups.size());
    std::vector<std::int64_t> cols(groups.size());
    const auto count = static_cast<std::int64_t>(groups.size());
    parallel_for(count, [&](std::int64_t gi) {
      const auto& [c, g] = groups[gi];
      std::int64_t rows = 0;
      for (std::size_t bi : g.blocks) rows += s.blocks[bi].rows;  // (each block's rows: its left sector's kept S)
      std::vector<cplx> m(static_cast<std::size_t>(rows * g.cols));
      std::int64_t row0 = 0;
      for (std::size_t bi : g.blocks) {
        const Block& b = s.blocks[bi];
        const std::vector<double>& xd = x.at(b.c_left);
        for (std::int64_t r = 0; r < b.rows; ++r)
          for (std::int64_t q = 0; q < b.cols; ++q) m[(row0 + r) * g.cols + q] = b.values[r * b.cols + q] * xd[r] + cplx{};
        row0 += b.rows;
      }
      factors[gi] = {c, svd(m.data(), rows, g.cols)};
      cols[gi] = g.cols;
    });
    // What each charge keeps: its values above 1e-14 (zero weight), and the global cut if asked.
    std::vector<std::int64_t> limit(factors.size());
    if (trunc) {
      std::vector<std::vector<double>> values;
      for (const auto& [c, f] : factors) values.push_back(f.s);
      const Truncation t = truncate(values, *trunc);
      limit = t.kept;
      discarded += t.discarded;
    } else {
      for (std::size_t i = 0; i < factors.size(); ++i) limit[i] = factors[i].second.rank;
    }
    for (std::size_t i = 0; i < factors.size(); ++i) {
      const auto& [c, f] = factors[i];
      const std::int64_t n_cols = cols[i];
      std::int64_t keep = 0;
      while (keep < std::min(f.rank, limit[i]) && f.s[keep] > 1e-14) ++keep;
      lam[c].assign(f.s.begin(), f.s.begin() + keep);
      rot[c].assign(f.vh.begin(), f.vh.begin() + keep * n_cols);
      next_x[c].assign(f.s.begin(), f.s.begin() + keep);
    }
    // B[j](c_L, c) <- B[j](c_L, c) V^dagger; B[j+1](c, c_R) <- V B[j+1](c, c_R). V^dagger once per
    // charge (the blocks of a right charge share it).
    std::vector<std::vector<cplx>> adjoint(factors.size());
    std::map<int, const std::vector<cplx>*> adjoint_of;
    parallel_for(static_cast<std::int64_t>(factors.size()), [&](std::int64_t i) {
      const int c = factors[i].first;
      const std::vector<cplx>& v = rot.at(c);
      const auto keep = static_cast<std::int64_t>(next_x.at(c).size());
      const std::int64_t n_cols = cols[i];
      std::vector<cplx>& vd = adjoint[i];
      vd.resize(static_cast<std::size_t>(n_cols * keep));
      for (std::int64_t p = 0; p < keep; ++p)
        for (std::int64_t q = 0; q < n_cols; ++q) vd[q * keep + p] = std::conj(v[p * n_cols + q]);
    });
    for (std::size_t i = 0; i < factors.size(); ++i) adjoint_of[factors[i].first] = &adjoint[i];
    const auto here = static_cast<std::int64_t>(s.blocks.size());
    parallel_for(here, [&](std::int64_t bi) {
      Block& b = s.blocks[bi];
      const std::vector<cplx>& vd = *adjoint_of.at(b.c_right);
      const auto keep = static_cast<std::int64_t>(next_x.at(b.c_right).size());
      std::vector<cplx> out(static_cast<std::size_t>(b.rows * keep));
      matmul(b.values.data(), vd.data(), out.data(), b.rows, b.cols, keep);
      b.cols = keep;
      b.values = std::move(out);
    });
    std::vector<Block>& right = psi.sites[j + 1].blocks;
    const auto next = static_cast<std::int64_t>(right.size());
    parallel_for(next, [&](std::int64_t bi) {
      Block& b = right[bi];
      const auto it = rot.find(b.c_left);
      const auto keep = it == rot.end() ? std::int64_t{0} : static_cast<std::int64_t>(next_x.at(b.c_left).size());
      std::vector<cplx> out(static_cast<std::size_t>(keep * b.cols));
      if (keep > 0) matmul(it->second.data(), b.values.data(), out.data(), keep, b.rows, b.cols);
      b.rows = keep;
      b.values = std::move(out);
    });
    drop_empty_blocks(s);
    drop_empty_blocks(psi.sites[j + 1]);
    psi.bonds[j + 1] = make_bond(lam);
    x = std::move(next_x);
  }
  psi.bonds[L] = {{0}, {1.0}};
  return discarded;
}

}  // namespace

// A mixed boundary is cut like an inner bond: bond 0's lambda are the Schmidt values between
// the record of the total N and the sites (one index per N), so the totals of smallest weight go.
// (Density matrices: the pairs (N_ket, N_bra) far off the diagonal.) Returns the discarded weight.
double cut_boundary(U1Mps& psi, const TruncParams& trunc) {
  Bond& b0 = psi.bonds[0];
  std::vector<std::vector<double>> values;
  for (double l : b0.lambda) values.push_back({l});
  const Truncation t = truncate(values, trunc);
  Bond kept;
  std::set<int> dropped;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (t.kept[i] == 0) {
      dropped.insert(b0.charges[i]);
      continue;
    }
    kept.charges.push_back(b0.charges[i]);
    kept.lambda.push_back(b0.lambda[i]);
  }
  if (dropped.empty()) return 0;
  std::erase_if(psi.sites[0].blocks, [&](const Block& b) { return dropped.count(b.c_left) > 0; });
  b0 = std::move(kept);
  // (the sites stay right-canonical; charges of inner bonds that only the dropped totals reached
  // have no block on their left any more, and the sweep left to right drops them)
  return t.discarded;
}

void canonicalize(U1Mps& psi, int off_form) {
  right_to_left_sweep(psi, off_form >= 0 && off_form < psi.L ? off_form : psi.L - 1);
  left_to_right_sweep(psi, nullptr);
}

double compress(U1Mps& psi, const TruncParams& trunc) {
  right_to_left_sweep(psi, psi.L - 1);
  double discarded = cut_boundary(psi, trunc);
  discarded += left_to_right_sweep(psi, &trunc);
  // The cuts leave the sites left of each one off right-canonical form: canonicalise again.
  canonicalize(psi);
  return discarded;
}

U1Mps random_state(int L, int d, int total_charge, int chi, std::uint64_t seed) {
  U1Mps psi;
  psi.L = L, psi.d = d, psi.total_charge = total_charge;
  psi.bonds.resize(L + 1);
  psi.sites.resize(L);
  const int dmax = d - 1;
  // Bond k allows the charges a right part of L-k sites and a left part of k sites can both reach;
  // up to chi indices split evenly over them (the lower charges get the remainder).
  for (int k = 0; k <= L; ++k) {
    const int lo = std::max(0, total_charge - dmax * k), hi = std::min(total_charge, dmax * (L - k));
    const int charges = hi - lo + 1;
    const int per = k == 0 || k == L ? 1 : std::max(1, chi / charges), extra = k == 0 || k == L ? 0 : std::max(0, chi - per * charges);
    for (int c = lo; c <= hi; ++c) {
      const int n = per + (c - lo < extra ? 1 : 0);
      for (int i = 0; i < n; ++i) {
        psi.bonds[k].charges.push_back(c);
        psi.bonds[k].lambda.push_back(1.0);
      }
    }
  }
  const std::uint64_t key = kernels::splitmix64(seed);
  std::uint64_t element = 0;
  for (int j = 0; j < L; ++j)
    for (const Sector& l : psi.bonds[j].sectors())
      for (const Sector& r : psi.bonds[j + 1].sectors()) {
        if (!kernels::u1_block_allowed(l.charge, r.charge, d)) continue;
        Block b{l.charge, r.charge, l.size, r.size, std::vector<cplx>(static_cast<std::size_t>(l.size * r.size))};
        for (cplx& v : b.values) {
          v = {kernels::random_double(kernels::random_bits(key, kernels::u1_component(element, 0))),
               kernels::random_double(kernels::random_bits(key, kernels::u1_component(element, 1)))};
          ++element;
        }
        psi.sites[j].blocks.push_back(std::move(b));
      }
  canonicalize(psi);
  return psi;
}

std::vector<double> densities(const U1Mps& psi) {
  std::vector<double> n(static_cast<std::size_t>(psi.L), 0.0);
  for (int j = 0; j < psi.L; ++j) {
    const Bond& left = psi.bonds[j];
    for (const Block& b : psi.sites[j].blocks) {
      const Sector l = left.sector(b.c_left);
      double w = 0;
      for (std::int64_t r = 0; r < b.rows; ++r) {
        double row = 0;
        for (std::int64_t c = 0; c < b.cols; ++c) row += std::norm(b.values[r * b.cols + c]);
        w += left.lambda[l.offset + r] * left.lambda[l.offset + r] * row;
      }
      n[j] += (b.c_left - b.c_right) * w;
    }
  }
  return n;
}

double entropy_vn(const Bond& bond) {
  double s = 0;
  for (double l : bond.lambda)
    if (l > 0) s -= l * l * std::log(l * l);
  return s;
}

double entropy_renyi2(const Bond& bond) {
  double p2 = 0;
  for (double l : bond.lambda) p2 += l * l * l * l;
  return -std::log(p2);
}

namespace {

// The left environments E(c) = sum B^dagger E B (block-diagonal by charge) at bond `upto`, grown
// from `e` on bond 0, without assuming any canonical form. Per site, the new environments of
// different right charges on the OpenMP threads; each sums its blocks in the site's order (the
// same bits with any thread count). At chi 4096, L 100 the norm took ~40 s on one thread.
std::map<int, std::vector<cplx>> left_environment(const U1Mps& psi, int upto, std::map<int, std::vector<cplx>> e) {
  for (int j = 0; j < upto; ++j) {
    // The site's blocks that meet an environment, by right charge, in the site's order.
    std::map<int, std::vector<const Block*>> by_right;
    for (const Block& b : psi.sites[j].blocks)
      if (e.count(b.c_left)) by_right[b.c_right].push_back(&b);
    std::vector<std::pair<int, std::vector<const Block*>>> work(by_right.begin(), by_right.end());
    std::vector<std::vector<cplx>> out(work.size());
    parallel_for(static_cast<std::int64_t>(work.size()), [&](std::int64_t w) {
      std::vector<cplx>& dst = out[static_cast<std::size_t>(w)];
      for (const Block* b : work[static_cast<std::size_t>(w)].second) {
        std::vector<cplx> eb(static_cast<std::size_t>(b->rows * b->cols));
        matmul(e.at(b->c_left).data(), b->values.data(), eb.data(), b->rows, b->rows, b->cols);
        std::vector<cplx> bd(static_cast<std::size_t>(b->cols * b->rows));
        for (std::int64_t r = 0; r < b->rows; ++r)
          for (std::int64_t c = 0; c < b->cols; ++c) bd[c * b->rows + r] = std::conj(b->values[r * b->cols + c]);
        if (dst.empty()) dst.assign(static_cast<std::size_t>(b->cols * b->cols), cplx{});
        matmul(bd.data(), eb.data(), dst.data(), b->cols, b->rows, b->cols, true);
      }
    });
    std::map<int, std::vector<cplx>> next;
    for (std::size_t w = 0; w < work.size(); ++w) next[work[w].first] = std::move(out[w]);
    e = std::move(next);
  }
  return e;
}

// Bond 0's weights lambda^2 as a left environment: one 1 x 1 matrix per total N.
std::map<int, std::vector<cplx>> boundary_environment(const Bond& b0) {
  std::map<int, std::vector<cplx>> e;
  for (std::int64_t i = 0; i < b0.size(); ++i) e[b0.charges[i]] = {cplx{b0.lambda[i] * b0.lambda[i], 0.0}};
  return e;
}

}  // namespace

std::vector<double> charge_distribution(const U1Mps& psi, int bond) {
  std::vector<double> p(static_cast<std::size_t>(psi.total_charge + 1), 0.0);
  const Bond& b = psi.bonds.at(bond);
  if (psi.bonds[0].size() == 1) {
    for (std::int64_t i = 0; i < b.size(); ++i) p.at(psi.total_charge - b.charges[i]) += b.lambda[i] * b.lambda[i];
    return p;
  }
  // A mixed boundary: N_left = N - c needs the total N as well as the bond's charge c. The weight
  // of (N, c) is the trace of the left environment grown from bond 0's N alone (in B form the
  // right part contributes the identity).
  for (const Sector& s : psi.bonds[0].sectors()) {
    const double w = psi.bonds[0].lambda[s.offset];
    for (const auto& [c, e] : left_environment(psi, bond, {{s.charge, {cplx{w * w, 0.0}}}})) {
      const auto rows = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(e.size()))));
      for (std::int64_t r = 0; r < rows; ++r) p.at(s.charge - c) += e[r * rows + r].real();
    }
  }
  return p;
}

std::vector<double> total_charge_distribution(const U1Mps& psi) {
  std::vector<double> p(static_cast<std::size_t>(psi.total_charge + 1), 0.0);
  const Bond& b0 = psi.bonds[0];
  for (std::int64_t i = 0; i < b0.size(); ++i) p.at(b0.charges[i]) = b0.lambda[i] * b0.lambda[i];
  return p;
}

double norm_squared(const U1Mps& psi) {
  const auto e = left_environment(psi, psi.L, boundary_environment(psi.bonds[0]));
  const auto it = e.find(0);
  return it == e.end() ? 0.0 : it->second.at(0).real();
}

double right_canonical_error(const U1Mps& psi) {
  double worst = 0;
  for (int j = 0; j < psi.L; ++j)
    for (auto& [c, g] : groups_by_left(psi.sites[j])) {
      std::vector<cplx> sum(static_cast<std::size_t>(g.rows * g.rows), cplx{});
      for (std::size_t bi : g.blocks) {
        const Block& b = psi.sites[j].blocks[bi];
        for (std::int64_t r = 0; r < b.rows; ++r)
          for (std::int64_t q = 0; q < b.rows; ++q) {
            cplx acc{};
            for (std::int64_t k = 0; k < b.cols; ++k) acc += b.values[r * b.cols + k] * std::conj(b.values[q * b.cols + k]);
            sum[r * g.rows + q] += acc;
          }
      }
      for (std::int64_t r = 0; r < g.rows; ++r)
        for (std::int64_t q = 0; q < g.rows; ++q)
          worst = std::max(worst, std::abs(sum[r * g.rows + q] - (r == q ? 1.0 : 0.0)));
    }
  return worst;
}

// ---------------------------------------------------------------- HDF5

namespace {

std::string join(const std::string& group, const char* name) { return group.empty() ? name : group + "/" + name; }

h5::Dataset put(h5::File& out, const std::string& name, DType t, const Shape& shape, const void* values, const char* doc) {
  h5::Dataset ds = out.create_dataset(name, {{t, shape, {}}, false});
  if (shape_elements(shape) > 0) ds.write_all(values);
  ds.set_attribute("description", doc);
  return ds;
}

}  // namespace

void write_mps(h5::File& out, const U1Mps& psi, const std::string& group) {
  std::vector<std::int64_t> bond_offsets{0};
  std::vector<std::int32_t> charges;
  std::vector<double> lambda;
  for (const Bond& b : psi.bonds) {
    charges.insert(charges.end(), b.charges.begin(), b.charges.end());
    lambda.insert(lambda.end(), b.lambda.begin(), b.lambda.end());
    bond_offsets.push_back(static_cast<std::int64_t>(charges.size()));
  }
  std::vector<std::int64_t> blocks, block_offsets{0};
  std::vector<cplx> values;
  for (int j = 0; j < psi.L; ++j)
    for (const Block& b : psi.sites[j].blocks) {
      const std::int64_t row0 = psi.bonds[j].sector(b.c_left).offset, col0 = psi.bonds[j + 1].sector(b.c_right).offset;
      blocks.insert(blocks.end(), {j, b.c_left, b.c_right, row0, col0, b.rows, b.cols});
      values.insert(values.end(), b.values.begin(), b.values.end());
      block_offsets.push_back(static_cast<std::int64_t>(values.size()));
    }
  const std::uint64_t nb = block_offsets.size() - 1;
  put(out, join(group, "bond_offsets"), DType::int64, {bond_offsets.size()}, bond_offsets.data(),
      "bond k (k = 0..L) occupies [bond_offsets[k], bond_offsets[k+1]) of bond_charges and lambda");
  put(out, join(group, "bond_charges"), DType::int32, {charges.size()}, charges.data(),
      "charge of each bond index: the particles right of the bond; ascending within a bond");
  put(out, join(group, "lambda"), DType::float64, {lambda.size()}, lambda.data(),
      "Schmidt value of each bond index (1 on the boundary bonds)");
  put(out, join(group, "blocks"), DType::int64, {nb, 7}, blocks.data(),
      "one row per block, site-major: (site, c_L, c_R, row0, col0, rows, cols); row0/col0 are the sector offsets in "
      "bonds site and site+1; the block's occupation is c_L - c_R");
  put(out, join(group, "block_offsets"), DType::int64, {nb + 1}, block_offsets.data(),
      "block b's values are values[block_offsets[b] : block_offsets[b+1]], rows x cols row-major");
  put(out, join(group, "values"), DType::complex128, {values.size()}, values.data(),
      "the blocks' entries in B form (right-canonical), each block row-major, in the order of 'blocks'");
  auto set = [&](h5::Object& o) {
    o.set_attribute("L", static_cast<std::int64_t>(psi.L));
    o.set_attribute("d", static_cast<std::int64_t>(psi.d));
    o.set_attribute("total_charge", static_cast<std::int64_t>(psi.total_charge));
    o.set_attribute("charge_kind", psi.pair() ? "n_pair" : "n");
    if (psi.pair()) {
      o.set_attribute("pair_shift", static_cast<std::int64_t>(kernels::kPairShift));
      o.set_attribute("weight", psi.weight);
    }
    o.set_attribute("form", "B");
    o.set_attribute("dtype", "complex128");
    if (psi.bonds[0].size() > 1) o.set_attribute("boundary", "mixed");
  };
  set(out);
}

U1Mps read_mps(const h5::File& in, const std::string& group) {
  const std::string file = in.path().string();
  auto missing = [&](const std::string& what) {
    return InputError(fmt::format("'{}' is not an MPS: {}; expected an mps.init or mps.tebd output", file, what));
  };
  for (const char* name : {"bond_offsets", "bond_charges", "lambda", "blocks", "block_offsets", "values"})
    if (!in.exists(join(group, name))) throw missing(fmt::format("it has no dataset '{}'", join(group, name)));
  const h5::Dataset v = in.open_dataset(join(group, "values"));
  for (const char* a : {"L", "d", "total_charge", "form"})
    if (!in.has_attribute(a)) throw missing(fmt::format("the file has no attribute '{}'", a));
  if (in.string_attribute("form") != "B") throw missing("its tensors are not in B form");
  if (v.dtype() != DType::complex128) throw missing("'values' is not complex128");
  U1Mps psi;
  psi.L = static_cast<int>(in.int_attribute("L"));
  psi.d = static_cast<int>(in.int_attribute("d"));
  psi.total_charge = static_cast<int>(in.int_attribute("total_charge"));
  const std::string kind = in.has_attribute("charge_kind") ? in.string_attribute("charge_kind") : "n";
  if (kind == "n_pair") {
    psi.kind = kernels::ChargeKind::n_pair;
    if (!in.has_attribute("weight") || !in.has_attribute("pair_shift") || in.int_attribute("pair_shift") != kernels::kPairShift)
      throw missing(fmt::format("its charge_kind is n_pair but it lacks the attributes weight and pair_shift = {}", kernels::kPairShift));
    psi.weight = in.double_attribute("weight");
  } else if (kind != "n") {
    throw missing(fmt::format("its charge_kind is '{}'; expected 'n' or 'n_pair'", kind));
  }
  auto read = [&](const char* name, DType t, auto& vec, std::size_t rank) {
    const h5::Dataset ds = in.open_dataset(join(group, name));
    if (ds.dtype() != t || ds.shape().size() != rank) throw missing(fmt::format("'{}' has the wrong type or rank", name));
    vec.resize(shape_elements(ds.shape()));
    if (!vec.empty()) ds.read_all(vec.data());
    return ds.shape();
  };
  std::vector<std::int64_t> bond_offsets, blocks, block_offsets;
  std::vector<std::int32_t> charges;
  std::vector<double> lambda;
  std::vector<cplx> values;
  read("bond_offsets", DType::int64, bond_offsets, 1);
  read("bond_charges", DType::int32, charges, 1);
  read("lambda", DType::float64, lambda, 1);
  read("blocks", DType::int64, blocks, 2);
  read("block_offsets", DType::int64, block_offsets, 1);
  read("values", DType::complex128, values, 1);
  if (psi.L < 1 || bond_offsets.size() != static_cast<std::size_t>(psi.L + 2) || charges.size() != lambda.size() ||
      bond_offsets.back() != static_cast<std::int64_t>(charges.size()) || blocks.size() % 7 != 0 ||
      block_offsets.size() != blocks.size() / 7 + 1 || block_offsets.back() != static_cast<std::int64_t>(values.size()))
    throw missing("its offsets tables do not match its datasets");
  psi.bonds.resize(psi.L + 1);
  psi.sites.resize(psi.L);
  for (int k = 0; k <= psi.L; ++k) {
    if (bond_offsets[k] > bond_offsets[k + 1]) throw missing("bond_offsets is not ascending");
    psi.bonds[k].charges.assign(charges.begin() + bond_offsets[k], charges.begin() + bond_offsets[k + 1]);
    psi.bonds[k].lambda.assign(lambda.begin() + bond_offsets[k], lambda.begin() + bond_offsets[k + 1]);
  }
  for (std::size_t b = 0; b + 1 < block_offsets.size(); ++b) {
    const std::int64_t* row = &blocks[7 * b];
    if (row[0] < 0 || row[0] >= psi.L || block_offsets[b] > block_offsets[b + 1] ||
        block_offsets[b + 1] - block_offsets[b] != row[5] * row[6])
      throw missing(fmt::format("block {} does not match its offsets", b));
    psi.sites[row[0]].blocks.push_back({static_cast<int>(row[1]), static_cast<int>(row[2]), row[5], row[6],
                                        std::vector<cplx>(values.begin() + block_offsets[b], values.begin() + block_offsets[b + 1])});
  }
  try {
    psi.check_structure();
  } catch (const std::runtime_error& e) {
    throw missing(e.what());
  }
  return psi;
}

}  // namespace qstage::stages::mps
