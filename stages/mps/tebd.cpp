#include "stages/mps/tebd.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "kernels/u1_math.hpp"
#include "stages/mps/linalg.hpp"

namespace qstage::stages::mps {

Truncation truncate(const std::vector<std::vector<double>>& values, const TruncParams& p) {
  struct Entry {
    double s;
    std::size_t block;
    std::size_t index;
  };
  std::vector<Entry> all;
  double total = 0;
  for (std::size_t b = 0; b < values.size(); ++b)
    for (std::size_t i = 0; i < values[b].size(); ++i) {
      all.push_back({values[b][i], b, i});
      total += values[b][i] * values[b][i];
    }
  std::sort(all.begin(), all.end(), [](const Entry& x, const Entry& y) {
    if (x.s != y.s) return x.s > y.s;
    if (x.block != y.block) return x.block < y.block;
    return x.index < y.index;
  });
  const double norm = std::sqrt(total);
  const auto n = static_cast<std::int64_t>(all.size());
  // Each constraint keeps a prefix of the ranking; apply the ones that leave at least one value.
  std::int64_t keep = n;
  auto constrain = [&](std::int64_t count) {
    if (std::min(keep, count) >= 1) keep = std::min(keep, count);
  };
  constrain(p.chi_max);
  if (p.svd_min > 0 && norm > 0) {
    std::int64_t c = 0;
    while (c < n && all[c].s / norm >= p.svd_min) ++c;
    constrain(c);
  }
  if (norm > 0) {
    // Keep position q while the summed squares from q to the end exceed trunc_cut^2.
    std::int64_t c = n;
    double tail = 0;
    while (c > 0 && tail + (all[c - 1].s / norm) * (all[c - 1].s / norm) <= p.trunc_cut * p.trunc_cut) {
      tail += (all[c - 1].s / norm) * (all[c - 1].s / norm);
      --c;
    }
    constrain(c);
  }
  Truncation t;
  t.kept.assign(values.size(), 0);
  for (std::int64_t q = 0; q < keep; ++q) ++t.kept[all[q].block];
  // eps summed directly rather than as 1 - kept: the difference would lose a small eps's digits.
  if (norm > 0) {
    double disc = 0;
    for (std::int64_t q = n - 1; q >= keep; --q) disc += (all[q].s / norm) * (all[q].s / norm);
    t.discarded = disc;
  }
  return t;
}

namespace {

// One new centre charge's Theta: rows the left sectors c_L in [c, c + d - 1], columns the right
// sectors c_R in [c - d + 1, c], both ascending.
struct ChargeBlock {
  int charge = 0;
  std::vector<Sector> rows, cols;  // sectors of the outer bonds, with their offsets inside this block
  std::vector<std::int64_t> row0, col0;
  std::int64_t m = 0, n = 0;
  std::vector<cplx> c;  // gate (B B), m x n (Hastings' C)
  Svd svd;
};

// The blocks C(c) = gate (B[j] B[j+1]) of every new centre charge c of bond (j, j+1).
std::vector<ChargeBlock> gate_blocks(const U1Mps& psi, int j, const GateTable& gate) {
  const int d = psi.d;
  const Bond& left = psi.bonds[j];
  const Bond& centre = psi.bonds[j + 1];
  const Bond& right = psi.bonds[j + 2];
  const Site& a = psi.sites[j];
  const Site& b = psi.sites[j + 1];
  const std::vector<Sector> ls = left.sectors(), cs = centre.sectors(), rs = right.sectors();

  // The new centre charges: every c that some left sector can reach with a right sector.
  std::vector<ChargeBlock> blocks;
  const int c_lo = rs.front().charge, c_hi = ls.back().charge;
  for (int c = c_lo; c <= c_hi; ++c) {
    ChargeBlock cb;
    cb.charge = c;
    for (const Sector& s : ls)
      if (kernels::u1_block_allowed(s.charge, c, d)) {
        cb.rows.push_back(s);
        cb.row0.push_back(cb.m);
        cb.m += s.size;
      }
    for (const Sector& s : rs)
      if (kernels::u1_block_allowed(c, s.charge, d)) {
        cb.cols.push_back(s);
        cb.col0.push_back(cb.n);
        cb.n += s.size;
      }
    if (cb.m == 0 || cb.n == 0) continue;
    cb.c.assign(static_cast<std::size_t>(cb.m * cb.n), cplx{});
    blocks.push_back(std::move(cb));
  }
  auto block_of = [&](int c) -> ChargeBlock* {
    for (auto& cb : blocks)
      if (cb.charge == c) return &cb;
    return nullptr;
  };

  // P(c_L, c', c_R) = B[j](c_L, c') B[j+1](c', c_R), one GEMM per old centre sector, each mixed
  // into the C(c) of every new centre charge by the gate entry its charges select.
  for (const Sector& l : ls)
    for (const Sector& r : rs) {
      if (l.charge < r.charge || l.charge - r.charge > 2 * (d - 1)) continue;
      std::vector<cplx> p(static_cast<std::size_t>(l.size * r.size));
      for (const Sector& mid : cs) {
        const Block* x = a.find(l.charge, mid.charge);
        const Block* y = b.find(mid.charge, r.charge);
        if (!x || !y) continue;
        matmul(x->values.data(), y->values.data(), p.data(), l.size, mid.size, r.size);
        for (int c = r.charge; c <= l.charge; ++c) {
          const std::int64_t e = kernels::gate_entry_for_charges(l.charge, mid.charge, c, r.charge, d);
          if (e < 0 || gate.u[e] == cplx{}) continue;
          ChargeBlock* cb = block_of(c);
          if (!cb) continue;
          const auto ri = std::find_if(cb->rows.begin(), cb->rows.end(), [&](const Sector& s) { return s.charge == l.charge; }) - cb->rows.begin();
          const auto ci = std::find_if(cb->cols.begin(), cb->cols.end(), [&](const Sector& s) { return s.charge == r.charge; }) - cb->cols.begin();
          const cplx u = gate.u[e];
          for (std::int64_t rr = 0; rr < l.size; ++rr)
            for (std::int64_t cc = 0; cc < r.size; ++cc)
              cb->c[(cb->row0[ri] + rr) * cb->n + cb->col0[ci] + cc] += u * p[rr * r.size + cc];
        }
      }
    }

  return blocks;
}

// Theta(c) = diag(lambda[j]) C(c), in place.
void scale_rows(ChargeBlock& cb, const Bond& left, std::vector<cplx>& theta) {
  for (std::size_t s = 0; s < cb.rows.size(); ++s)
    for (std::int64_t rr = 0; rr < cb.rows[s].size; ++rr) {
      const double lam = left.lambda[cb.rows[s].offset + rr];
      for (std::int64_t cc = 0; cc < cb.n; ++cc) theta[(cb.row0[s] + rr) * cb.n + cc] *= lam;
    }
}

}  // namespace

double bond_expectation(const U1Mps& psi, int j, const GateTable& op) {
  GateTable identity;
  identity.d = psi.d;
  identity.u.assign(op.u.size(), cplx{});
  for (int n = 0; n < psi.d; ++n)
    for (int m = 0; m < psi.d; ++m) identity.u[kernels::gate_index(n, m, n, psi.d)] = 1.0;
  std::vector<ChargeBlock> bra = gate_blocks(psi, j, identity), ket = gate_blocks(psi, j, op);
  cplx sum{};
  for (std::size_t i = 0; i < bra.size(); ++i) {
    scale_rows(bra[i], psi.bonds[j], bra[i].c);
    scale_rows(ket[i], psi.bonds[j], ket[i].c);
    for (std::size_t e = 0; e < bra[i].c.size(); ++e) sum += std::conj(bra[i].c[e]) * ket[i].c[e];
  }
  return sum.real();
}

double update_bond(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc) {
  const Bond& left = psi.bonds[j];
  std::vector<ChargeBlock> blocks = gate_blocks(psi, j, gate);

  // Theta(c) = diag(lambda[j]) C(c), one SVD each; blocks are independent, each SVD single-threaded
  // into its own slot, so the bits do not depend on the thread count.
  single_threaded_blas();
  const auto nblocks = static_cast<std::int64_t>(blocks.size());
  // Small SVDs cost less than waking the threads (on a busy machine, far less).
  double work = 0;
  for (const auto& cb : blocks) work += static_cast<double>(cb.m) * cb.n * std::min(cb.m, cb.n);
#pragma omp parallel for schedule(dynamic) if (nblocks > 1 && work > 2e5)
  for (std::int64_t i = 0; i < nblocks; ++i) {
    ChargeBlock& cb = blocks[i];
    std::vector<cplx> theta(cb.c);
    scale_rows(cb, left, theta);
    cb.svd = svd(theta.data(), cb.m, cb.n);
  }

  std::vector<std::vector<double>> values;
  for (const auto& cb : blocks) values.push_back(cb.svd.s);
  const Truncation t = truncate(values, trunc);
  // The kept norm, in the units of the SVD (not relative): new lambda = S / that.
  double kept2 = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (std::int64_t q = 0; q < t.kept[i]; ++q) kept2 += blocks[i].svd.s[q] * blocks[i].svd.s[q];
  const double kept_norm = std::sqrt(kept2);

  Bond new_centre;
  Site new_a, new_b;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const ChargeBlock& cb = blocks[i];
    const std::int64_t k = t.kept[i];
    if (k == 0) continue;
    for (std::int64_t q = 0; q < k; ++q) {
      new_centre.charges.push_back(cb.charge);
      new_centre.lambda.push_back(cb.svd.s[q] / kept_norm);
    }
    // B'[j+1](c, c_R) = the kept rows of Y, cut by right sector.
    for (std::size_t s = 0; s < cb.cols.size(); ++s) {
      Block blk{cb.charge, cb.cols[s].charge, k, cb.cols[s].size, {}};
      blk.values.resize(static_cast<std::size_t>(k * blk.cols));
      for (std::int64_t q = 0; q < k; ++q)
        std::copy_n(&cb.svd.vh[q * cb.n + cb.col0[s]], blk.cols, &blk.values[q * blk.cols]);
      new_b.blocks.push_back(std::move(blk));
    }
    // B'[j](c_L, c) = C(c) Y^dagger / kept_norm, cut by left sector.
    std::vector<cplx> yd(static_cast<std::size_t>(cb.n * k));
    for (std::int64_t q = 0; q < k; ++q)
      for (std::int64_t cc = 0; cc < cb.n; ++cc) yd[cc * k + q] = std::conj(cb.svd.vh[q * cb.n + cc]) / kept_norm;
    std::vector<cplx> cy(static_cast<std::size_t>(cb.m * k));
    matmul(cb.c.data(), yd.data(), cy.data(), cb.m, cb.n, k);
    for (std::size_t s = 0; s < cb.rows.size(); ++s) {
      Block blk{cb.rows[s].charge, cb.charge, cb.rows[s].size, k, {}};
      blk.values.assign(cy.begin() + cb.row0[s] * k, cy.begin() + (cb.row0[s] + blk.rows) * k);
      new_a.blocks.push_back(std::move(blk));
    }
  }
  auto by_charges = [](const Block& x, const Block& y) {
    return std::pair{x.c_left, x.c_right} < std::pair{y.c_left, y.c_right};
  };
  std::sort(new_a.blocks.begin(), new_a.blocks.end(), by_charges);
  std::sort(new_b.blocks.begin(), new_b.blocks.end(), by_charges);
  psi.bonds[j + 1] = std::move(new_centre);
  psi.sites[j] = std::move(new_a);
  psi.sites[j + 1] = std::move(new_b);
  return t.discarded;
}

}  // namespace qstage::stages::mps
