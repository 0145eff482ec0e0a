#include "stages/mps/tebd.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <tuple>

#include <omp.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/units.hpp"
#include "engine/spill_store.hpp"
#include "kernels/mps/charge_tiles.hpp"
#include "kernels/mps/u1_math.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/linalg.hpp"

namespace qstage::stages::mps {

namespace {

// One new centre charge's block of Theta: rows the left sectors c_L in [c, c + d - 1], columns
// the right sectors c_R in [c - d + 1, c], both ascending; at `offset` in the flat C.
struct ChargeBlock {
  int charge = 0;
  std::vector<Sector> rows, cols;  // sectors of the outer bonds, with their offsets inside this block
  std::vector<std::int64_t> row0, col0;
  std::int64_t m = 0, n = 0, offset = 0;
};

// What one two-site update computes, planned on the host: the charge blocks of C(c) = gate (B B),
// the products of sector blocks that fill them (seed 001 eq. 16: the gate entry looked up by
// the charges) and where each site block sits in the packed input.
// Pairs of outer sectors whose products are below kernels::kTileMaxProduct take the gather form of
// kernels/charge_tiles (no scatter list: with a density matrix's thousands of 1 x 1 sectors that
// list ran out of memory, and its launches, one a product, made Theta's time at chi 8192): in
// shared memory when their products are small (terms m n <= kernels::kTileMaxTermsMn), else as
// wide pairs in rounds through the product workspace. The others take the products and scatters
// of kernels/charge_blocks (one cuBLAS GEMM a product). Either way each Theta element sums the
// same terms in the same order.
struct BondPlan {
  std::vector<ChargeBlock> blocks;
  std::vector<kernels::ChargeProduct> products;
  std::vector<kernels::ChargeScatter> scatters;
  std::vector<std::pair<const Block*, std::int64_t>> inputs;  // site blocks and their packed offsets
  // scratch_size: the product workspace, for the largest cuBLAS product or round of wide pairs
  std::int64_t input_size = 0, c_size = 0, scratch_size = 0;
  // The gather form's pairs (in shared memory, and wide), terms and tables (kernels::TileTables
  // without its pointers), and the wide pairs' rounds.
  std::vector<kernels::TilePair> tile_pairs, wide_pairs;
  std::vector<kernels::TileRound> rounds;
  std::vector<kernels::TileTerm> tile_terms;
  std::vector<std::int64_t> block_offset, block_cols;
  std::vector<std::int32_t> rows_of, cols_of, block_at;
  kernels::TileTables grid;
};

// The gather form's arrays and the gate table in one blob, as the backend gets them in one copy.
struct TileBlob {
  std::size_t gate = 0, pairs = 0, terms = 0, block_offset = 0, block_cols = 0, rows_of = 0, cols_of = 0, block_at = 0, size = 0;
  // gate_bytes: the gate table in the update's element type
  TileBlob(const BondPlan& p, std::size_t gate_bytes) {
    auto add = [&](std::size_t& at, std::size_t bytes) {
      at = size;
      size += (bytes + 63) / 64 * 64;
    };
    add(gate, gate_bytes);
    add(pairs, (p.tile_pairs.size() + p.wide_pairs.size()) * sizeof(kernels::TilePair));
    add(terms, p.tile_terms.size() * sizeof(kernels::TileTerm));
    add(block_offset, p.block_offset.size() * sizeof(std::int64_t));
    add(block_cols, p.block_cols.size() * sizeof(std::int64_t));
    add(rows_of, p.rows_of.size() * sizeof(std::int32_t));
    add(cols_of, p.cols_of.size() * sizeof(std::int32_t));
    add(block_at, p.block_at.size() * sizeof(std::int32_t));
  }
  template <typename T>
  void pack(const BondPlan& p, const GateTable& g, char* out) const {
    auto put = [&](std::size_t at, const auto& v) {
      if (!v.empty()) std::memcpy(out + at, v.data(), v.size() * sizeof(v[0]));
    };
    put(gate, std::vector<T>(g.u.begin(), g.u.end())), put(pairs, p.tile_pairs), put(terms, p.tile_terms), put(block_offset, p.block_offset);
    put(pairs + p.tile_pairs.size() * sizeof(kernels::TilePair), p.wide_pairs);
    put(block_cols, p.block_cols), put(rows_of, p.rows_of), put(cols_of, p.cols_of), put(block_at, p.block_at);
  }
  // The tables, pointing into a packed blob at `base` (host or backend memory).
  kernels::TileTables tables(const BondPlan& p, const char* base) const {
    kernels::TileTables t = p.grid;
    t.pairs = reinterpret_cast<const kernels::TilePair*>(base + pairs);
    t.wide = t.pairs + t.pair_count;
    t.terms = reinterpret_cast<const kernels::TileTerm*>(base + terms);
    t.block_offset = reinterpret_cast<const std::int64_t*>(base + block_offset);
    t.block_cols = reinterpret_cast<const std::int64_t*>(base + block_cols);
    t.rows_of = reinterpret_cast<const std::int32_t*>(base + rows_of);
    t.cols_of = reinterpret_cast<const std::int32_t*>(base + cols_of);
    t.block_at = reinterpret_cast<const std::int32_t*>(base + block_at);
    return t;
  }
};

// The gather form's lookup tables over the plan's blocks.
void build_tile_tables(BondPlan& plan, const kernels::ChargeRule& rule) {
  kernels::TileTables& g = plan.grid;
  g.rule = rule;
  if (plan.blocks.empty()) return;
  const int D = rule.local_dim();
  int k_lo = std::numeric_limits<int>::max(), k_hi = std::numeric_limits<int>::min(), b_lo = k_lo, b_hi = k_hi;
  for (const ChargeBlock& cb : plan.blocks) {
    const int k = rule.pair() ? kernels::pair_ket(cb.charge) : cb.charge, b = rule.pair() ? kernels::pair_bra(cb.charge) : 0;
    k_lo = std::min(k_lo, k), k_hi = std::max(k_hi, k), b_lo = std::min(b_lo, b), b_hi = std::max(b_hi, b);
  }
  g.ket0 = k_lo, g.kets = k_hi - k_lo + 1, g.bra0 = b_lo, g.bras = b_hi - b_lo + 1;
  plan.block_at.assign(static_cast<std::size_t>(g.kets) * g.bras, -1);
  plan.rows_of.assign(plan.blocks.size() * D, -1);
  plan.cols_of.assign(plan.blocks.size() * D, -1);
  for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
    const ChargeBlock& cb = plan.blocks[i];
    const int k = rule.pair() ? kernels::pair_ket(cb.charge) : cb.charge, b = rule.pair() ? kernels::pair_bra(cb.charge) : 0;
    plan.block_at[static_cast<std::size_t>(k - g.ket0) * g.bras + (b - g.bra0)] = static_cast<std::int32_t>(i);
    plan.block_offset.push_back(cb.offset);
    plan.block_cols.push_back(cb.n);
    for (std::size_t q = 0; q < cb.rows.size(); ++q) plan.rows_of[i * D + rule.local(cb.rows[q].charge, cb.charge)] = static_cast<std::int32_t>(cb.row0[q]);
    for (std::size_t q = 0; q < cb.cols.size(); ++q) plan.cols_of[i * D + rule.local(cb.charge, cb.cols[q].charge)] = static_cast<std::int32_t>(cb.col0[q]);
  }
}

// The plan's tables read in place on the host (the lookups; no pairs yet).
kernels::TileTables host_view(const BondPlan& plan) {
  kernels::TileTables t = plan.grid;
  t.block_offset = plan.block_offset.data(), t.block_cols = plan.block_cols.data();
  t.rows_of = plan.rows_of.data(), t.cols_of = plan.cols_of.data(), t.block_at = plan.block_at.data();
  return t;
}

// The charges c with lo <= c <= hi componentwise (n_pair: every key whose components lie between
// those of lo and hi), ascending.
std::vector<int> charges_between(const kernels::ChargeRule& rule, int lo, int hi) {
  std::vector<int> out;
  if (!rule.pair()) {
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    return out;
  }
  for (int a = kernels::pair_ket(lo); a <= kernels::pair_ket(hi); ++a)
    for (int b = kernels::pair_bra(lo); b <= kernels::pair_bra(hi); ++b) out.push_back(kernels::pair_key(a, b));
  return out;
}

// The blocks of Theta(c) of the update of sites j, j+1: every new centre charge c that some left
// sector can reach with a right sector, ascending, each with its row and column sectors (offsets
// not yet assigned: plan_bond lays out the blocks it is given).
std::vector<ChargeBlock> centre_blocks(const U1Mps& psi, int j) {
  const kernels::ChargeRule rule = psi.rule();
  const std::vector<Sector> ls = psi.bonds[j].sectors(), rs = psi.bonds[j + 2].sectors();
  // (n_pair: the componentwise smallest right and largest left charges)
  int c_lo = rs.front().charge, c_hi = ls.back().charge;
  if (rule.pair()) {
    int ka = kernels::kPairMax, kb = kernels::kPairMax, ha = 0, hb = 0;
    for (const Sector& s : rs) ka = std::min(ka, kernels::pair_ket(s.charge)), kb = std::min(kb, kernels::pair_bra(s.charge));
    for (const Sector& s : ls) ha = std::max(ha, kernels::pair_ket(s.charge)), hb = std::max(hb, kernels::pair_bra(s.charge));
    c_lo = kernels::pair_key(ka, kb), c_hi = kernels::pair_key(ha, hb);
  }
  std::vector<ChargeBlock> blocks;
  for (int c : charges_between(rule, c_lo, c_hi)) {
    ChargeBlock cb;
    cb.charge = c;
    for (const Sector& s : ls)
      if (rule.allowed(s.charge, c)) {
        cb.rows.push_back(s);
        cb.row0.push_back(cb.m);
        cb.m += s.size;
      }
    for (const Sector& s : rs)
      if (rule.allowed(c, s.charge)) {
        cb.cols.push_back(s);
        cb.col0.push_back(cb.n);
        cb.n += s.size;
      }
    if (cb.m == 0 || cb.n == 0) continue;
    blocks.push_back(std::move(cb));
  }
  return blocks;
}

// The plan of C(c) for `blocks` (all of centre_blocks, or a run of them: a group of an update
// that does not fit its device share). Products and gathered pairs that reach none of the blocks
// are left out, and so are the site blocks only they would read; each element of C sums the same
// terms in the same order whichever blocks are planned with it.
BondPlan plan_bond(const U1Mps& psi, int j, const GateTable& gate, std::vector<ChargeBlock> blocks) {
  const kernels::ChargeRule rule = psi.rule();
  const std::vector<Sector> ls = psi.bonds[j].sectors();
  const Site& a = psi.sites[j];
  const Site& b = psi.sites[j + 1];
  BondPlan plan;
  plan.blocks = std::move(blocks);
  std::vector<int> left_charges;  // the left sectors some planned block has as rows
  for (ChargeBlock& cb : plan.blocks) {
    cb.offset = plan.c_size;
    plan.c_size += cb.m * cb.n;
    for (const Sector& s : cb.rows) left_charges.push_back(s.charge);
  }
  std::sort(left_charges.begin(), left_charges.end());
  // Each site block's packed offset, by its position in its site (-1: not packed yet).
  std::vector<std::int64_t> packed_a(a.blocks.size(), -1), packed_b(b.blocks.size(), -1);
  auto input = [&](const Site& site, std::vector<std::int64_t>& packed, const Block* x) {
    std::int64_t& at = packed[static_cast<std::size_t>(x - site.blocks.data())];
    if (at < 0) {
      at = plan.input_size;
      plan.inputs.emplace_back(x, at);
      plan.input_size += x->rows * x->cols;
    }
    return at;
  };
  // Where each sector pair's tile of Theta(c) lies, by local index (the gather form's tables, also
  // the product path's lookup: n_pair bonds have hundreds of sectors).
  build_tile_tables(plan, rule);
  const kernels::TileTables lookup = host_view(plan);
  auto run_of = [](const Site& site, int c_left) {
    return std::lower_bound(site.blocks.begin(), site.blocks.end(), c_left, [](const Block& blk, int c) { return blk.c_left < c; });
  };

  // P(c_L, c', c_R) = B[j](c_L, c') B[j+1](c', c_R), one product per old centre sector, each mixed
  // into the C(c) of every new centre charge by the gate entry its charges select. Per left
  // sector, the terms of every right sector at once: the blocks (c_L, c') of B[j] are one run,
  // in the ascending order of the centre bond's sectors, and so are the blocks (c', c_R) of B[j+1].
  struct Term {
    int right;
    const Block* x;
    const Block* y;
    Sector mid;
  };
  std::vector<Term> terms;
  for (const Sector& l : ls) {
    if (!std::binary_search(left_charges.begin(), left_charges.end(), l.charge)) continue;
    terms.clear();
    for (auto it = run_of(a, l.charge); it != a.blocks.end() && it->c_left == l.charge; ++it) {
      const Sector mid = psi.bonds[j + 1].sector(it->c_right);
      for (auto y = run_of(b, mid.charge); y != b.blocks.end() && y->c_left == mid.charge; ++y)
        terms.push_back({y->c_right, &*it, &*y, mid});
    }
    // (stable: each pair's terms stay in the order of the old centre sectors)
    std::stable_sort(terms.begin(), terms.end(), [](const Term& u, const Term& v) { return u.right < v.right; });
    for (std::size_t first = 0, last = 0; first < terms.size(); first = last) {
      while (last < terms.size() && terms[last].right == terms[first].right) ++last;
      const Sector r = psi.bonds[j + 2].sector(terms[first].right);
      const auto count = static_cast<std::int64_t>(last - first);
      bool reaches_a_block = false;
      for (int local = 0; local < rule.local_dim() && !reaches_a_block; ++local) {
        int c = 0;
        std::int64_t ld = 0;
        reaches_a_block = lookup.tile_at(l.charge, r.charge, local, c, ld) >= 0;
      }
      if (!reaches_a_block) continue;
      std::int64_t k_max = 0;
      for (std::size_t t = first; t < last; ++t) k_max = std::max(k_max, terms[t].mid.size);
      if (l.size * k_max * r.size < kernels::kTileMaxProduct) {
        const bool shared = l.size * r.size * count <= kernels::kTileMaxTermsMn;
        (shared ? plan.tile_pairs : plan.wide_pairs)
            .push_back({l.charge, r.charge, l.size, r.size, static_cast<std::int64_t>(plan.tile_terms.size()), count});
        if (shared) plan.grid.max_terms_mn = std::max(plan.grid.max_terms_mn, l.size * r.size * count);
        for (std::size_t t = first; t < last; ++t)
          plan.tile_terms.push_back({input(a, packed_a, terms[t].x), input(b, packed_b, terms[t].y), terms[t].mid.size, terms[t].mid.charge});
        continue;
      }
      for (std::size_t t = first; t < last; ++t) {
        const Sector& mid = terms[t].mid;
        kernels::ChargeProduct p{0, 0, l.size, mid.size, r.size, static_cast<std::int64_t>(plan.scatters.size()), 0};
        // (a product's scatters go to different elements: their order does not change the sums)
        for (int local = 0; local < rule.local_dim(); ++local) {
          int c = 0;
          std::int64_t ld = 0;
          const std::int64_t at = lookup.tile_at(l.charge, r.charge, local, c, ld);
          if (at < 0) continue;
          const cplx g = rule.gate_value(gate.u.data(), l.charge, mid.charge, c, r.charge);
          if (g == cplx{}) continue;
          plan.scatters.push_back({at, ld, g});
          ++p.count;
        }
        if (p.count == 0) continue;
        p.x = input(a, packed_a, terms[t].x), p.y = input(b, packed_b, terms[t].y);
        plan.scratch_size = std::max(plan.scratch_size, p.m * p.n);
        plan.products.push_back(p);
      }
    }
  }
  plan.grid.pair_count = static_cast<std::int64_t>(plan.tile_pairs.size());
  plan.grid.wide_count = static_cast<std::int64_t>(plan.wide_pairs.size());
  // A round's products as many as the largest block's values (update_bytes' estimate of the
  // workspace), or one wide pair's.
  std::int64_t largest_block = 0;
  for (const ChargeBlock& cb : plan.blocks) largest_block = std::max(largest_block, cb.m * cb.n);
  plan.rounds = kernels::plan_tile_rounds(plan.wide_pairs, rule.local_dim(), largest_block);
  for (const kernels::TileRound& r : plan.rounds) plan.scratch_size = std::max(plan.scratch_size, r.products);
  return plan;
}

BondPlan plan_bond(const U1Mps& psi, int j, const GateTable& gate) { return plan_bond(psi, j, gate, centre_blocks(psi, j)); }

// The lambda of each row of the flat C: diag(lambda[j]) C(c) is Theta(c).
std::vector<double> row_lambdas(const BondPlan& plan, const Bond& left, std::vector<kernels::ScaledRows>& matrices) {
  std::vector<double> scale;
  for (const ChargeBlock& cb : plan.blocks) {
    matrices.push_back({cb.offset, cb.m, cb.n, static_cast<std::int64_t>(scale.size())});
    for (const Sector& s : cb.rows) scale.insert(scale.end(), left.lambda.begin() + s.offset, left.lambda.begin() + s.offset + s.size);
  }
  return scale;
}

// C(c) of the plan on the backend: the products and their scatters, then the gather form's pairs
// (`scratch`: the product workspace of either).
// `buffers(bytes)` gives the gather form's blob a host staging buffer and one on the backend (the
// tables and the gate go over in one copy).
template <typename T, class Buffers>
void fill_c(Backend& be, Stream& st, const BondPlan& plan, const GateTable& gate, const T* sites, T* c, T* scratch,
            Buffers&& buffers) {
  kernels::charge_products(st, sites, plan.products, plan.scatters, c, plan.c_size, scratch);
  if (plan.tile_pairs.empty() && plan.wide_pairs.empty()) return;
  const TileBlob blob(plan, gate.u.size() * sizeof(T));
  const auto [staged, on_backend] = buffers(blob.size);
  blob.pack<T>(plan, gate, staged);
  if (on_backend != staged) be.copy_to_device(on_backend, staged, blob.size, st);
  kernels::charge_tiles(st, sites, reinterpret_cast<const T*>(on_backend + blob.gate), blob.tables(plan, on_backend), plan.rounds,
                        c, scratch);
}

std::unique_ptr<Backend> host_backend() {
  return detail::make_cpu_backend(std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max());
}

double seconds_since(std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}

}  // namespace

double bond_expectation(const U1Mps& psi, int j, const GateTable& op) {
  GateTable identity;
  identity.d = psi.d;
  identity.u.assign(op.u.size(), cplx{});
  for (int n = 0; n < psi.d; ++n)
    for (int m = 0; m < psi.d; ++m) identity.u[kernels::gate_index(n, m, n, psi.d)] = 1.0;
  static const std::unique_ptr<Backend> host = host_backend();
  const std::unique_ptr<Stream> stream = host->make_stream();
  // Theta(c) of the identity and of op over the same blocks: <psi|op|psi> = sum conj(bra) ket.
  std::vector<std::vector<cplx>> theta;
  for (const GateTable* g : {static_cast<const GateTable*>(&identity), &op}) {
    const BondPlan plan = plan_bond(psi, j, *g);
    std::vector<cplx> in(plan.input_size), c(plan.c_size), scratch(plan.scratch_size), t(plan.c_size);
    for (const auto& [x, offset] : plan.inputs) std::copy(x->values.begin(), x->values.end(), in.begin() + offset);
    std::vector<char> blob;
    fill_c(*host, *stream, plan, *g, in.data(), c.data(), scratch.data(), [&](std::size_t bytes) {
      blob.resize(bytes);
      return std::pair{blob.data(), blob.data()};
    });
    std::vector<kernels::ScaledRows> rows;
    const std::vector<double> scale = row_lambdas(plan, psi.bonds[j], rows);
    kernels::scale_rows(*stream, c.data(), scale.data(), rows, t.data());
    theta.push_back(std::move(t));
  }
  cplx sum{};
  for (std::size_t e = 0; e < theta[0].size(); ++e) sum += std::conj(theta[0][e]) * theta[1][e];
  return sum.real();
}

// Buffers that grow to the largest update: on the backend (device memory on cuda) and pinned
// staging on the host.
struct BondUpdater::Workspace {
  // Device buffers grow with a quarter to spare (fewer reallocations as updates grow), except
  // while the updates go in groups to fit their shares (`exact`).
  bool exact = false;
  struct Grown {
    Buffer buffer;
    const bool* exact = nullptr;
    template <typename T>
    T* get(Backend& backend, std::int64_t count, bool device, const char* what) {
      const std::size_t bytes = std::max<std::size_t>(1, count * sizeof(T));
      if (buffer.size() < bytes) {
        buffer.reset();
        const std::size_t grown = device && exact && *exact ? bytes : bytes + bytes / 4;
        buffer = device ? backend.alloc_device(grown, what) : backend.alloc_host(grown, what);
      }
      return buffer.as<T>();
    }
  };
  Grown sites, c, theta, scale, s, vh, out, scratch, svd, tiles, host_in, host_scale, host_s, host_out, host_tiles;
  Workspace() {
    for (Grown* g : device()) g->exact = &exact;
  }
  std::uint64_t device_bytes() const {
    std::uint64_t sum = 0;
    for (const Grown* g : device()) sum += g->buffer.size();
    return sum;
  }
  // Frees the backend buffers (between updates or groups), so that the next grows from nothing.
  void release_device() {
    for (Grown* g : device()) g->buffer.reset();
  }

 private:
  std::array<Grown*, 10> device() { return {&sites, &c, &theta, &scale, &s, &vh, &out, &scratch, &svd, &tiles}; }
  std::array<const Grown*, 10> device() const { return {&sites, &c, &theta, &scale, &s, &vh, &out, &scratch, &svd, &tiles}; }
};

BondUpdater::BondUpdater(Backend& backend, std::int64_t gpu_svd_from, Precision precision)
    : precision_(precision), backend_(backend), stream_(backend.make_stream(true)), work_(std::make_unique<Workspace>()),
      gpu_svd_from_(gpu_svd_from) {}
BondUpdater::~BondUpdater() = default;

void BondUpdater::release_device() { work_->release_device(); }
std::uint64_t BondUpdater::device_bytes() const { return work_->device_bytes(); }

// The device bytes an update (or one group of it: blocks [first, last)) is estimated to take: the
// two sites (bounded by the blocks' size), C, Theta when it has its own buffer (`separate_theta`),
// Vh, the new left blocks (at most m min(m, n) a block), the product workspace (the largest block:
// plan_bond sizes the gather form's rounds so), the largest SVD workspace (`svd_bytes`, a
// block's), with the margin by which Workspace's buffers grow when the update is in one piece
// (`separate_theta`).
std::uint64_t update_bytes(const std::vector<ChargeBlock>& blocks, const std::vector<std::size_t>& svd_bytes, std::size_t first,
                           std::size_t last, std::size_t element, bool separate_theta) {
  std::uint64_t mn = 0, rn = 0, mr = 0, largest = 0, work = 0;
  for (std::size_t i = first; i < last; ++i) {
    const ChargeBlock& cb = blocks[i];
    const auto r = static_cast<std::uint64_t>(std::min(cb.m, cb.n)), m = static_cast<std::uint64_t>(cb.m), n = static_cast<std::uint64_t>(cb.n);
    mn += m * n, rn += r * n, mr += m * r, largest = std::max(largest, m * n), work = std::max<std::uint64_t>(work, svd_bytes[i]);
  }
  const std::uint64_t values = (separate_theta ? 3 : 2) * mn + rn + mr + largest;
  return (values * element + work) * (separate_theta ? 5 : 4) / 4;
}

// Runs of consecutive centre blocks whose groups, with C parked on the host, fit `share` device
// bytes: the boundaries, 0 first and blocks.size() last. BudgetExceeded if one block alone does
// not (LayerUpdater lends every update at least its largest block's need, or runs it alone).
std::vector<std::size_t> group_cuts(const std::vector<ChargeBlock>& blocks, const std::vector<std::size_t>& svd_bytes,
                                    std::size_t element, std::uint64_t share) {
  std::vector<std::size_t> cuts{0};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::uint64_t alone = update_bytes(blocks, svd_bytes, i, i + 1, element, false);
    if (alone > share)
      throw BudgetExceeded(fmt::format(
          "mps: one charge block of {} x {} needs about {} of device memory, the update's share is {}", blocks[i].m,
          blocks[i].n, format_bytes(static_cast<double>(alone)), format_bytes(static_cast<double>(share))));
    if (i > cuts.back() && update_bytes(blocks, svd_bytes, cuts.back(), i + 1, element, false) > share) cuts.push_back(i);
  }
  cuts.push_back(blocks.size());
  return cuts;
}

namespace {

// Each centre block's SVD workspace alone on the device (0 for the blocks the host decomposes),
// as kernels::batched_svd sizes it.
// (cuSOLVER's answers are remembered per shape: a layer's updates ask about the same few shapes,
// each an estimate before the update starts and again as it plans its groups)
template <typename T>
std::vector<std::size_t> block_svd_bytes(Stream& st, const std::vector<ChargeBlock>& blocks,
                                         std::int64_t gpu_svd_from) {
  static std::mutex mutex;
  static std::map<std::tuple<BackendKind, std::int64_t, std::int64_t, std::int64_t>, std::size_t> known;
  std::vector<std::size_t> bytes(blocks.size(), 0);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto key = std::tuple{st.kind(), blocks[i].m, blocks[i].n, gpu_svd_from};
    {
      const std::lock_guard lock(mutex);
      if (const auto it = known.find(key); it != known.end()) {
        bytes[i] = it->second;
        continue;
      }
    }
    bytes[i] =
        kernels::svd_workspace_bytes<T>(st, {{blocks[i].m, blocks[i].n, 0, 0, 0}}, kernels::SvdRouting{gpu_svd_from});
    const std::lock_guard lock(mutex);
    known.emplace(key, bytes[i]);
  }
  return bytes;
}

// What one update asks of the device budget by update_bytes' estimate: in one piece (`whole`),
// and at the least, in groups of centre charges whose largest is one charge block (`least`).
struct UpdateNeed {
  std::uint64_t whole = 0, least = 0;
};

UpdateNeed update_need(const std::vector<ChargeBlock>& blocks, const std::vector<std::size_t>& svd_bytes,
                       std::size_t element) {
  UpdateNeed need{update_bytes(blocks, svd_bytes, 0, blocks.size(), element, true), 0};
  for (std::size_t i = 0; i < blocks.size(); ++i)
    need.least = std::max(need.least, update_bytes(blocks, svd_bytes, i, i + 1, element, false));
  return need;
}

UpdateNeed update_need(Stream& st, const U1Mps& psi, int j, Precision precision, std::int64_t gpu_svd_from) {
  const std::vector<ChargeBlock> blocks = centre_blocks(psi, j);
  return precision == Precision::complex64
             ? update_need(blocks, block_svd_bytes<kernels::cplx64>(st, blocks, gpu_svd_from), sizeof(kernels::cplx64))
             : update_need(blocks, block_svd_bytes<kernels::cplx128>(st, blocks, gpu_svd_from),
                           sizeof(kernels::cplx128));
}

}  // namespace

// One update() of a BondUpdater in element type T, a step a function: the update's groups of
// centre charges (plan_groups), each group's Theta and SVDs (decompose), the global truncation on the
// host (truncate), each group's B'[j] = C Y^dagger / norm (finish), and the new bond and sites cut
// back into blocks (assemble). T: the arithmetic's element type. The sites are rounded to it as
// they are packed and widened back to complex128 as the new blocks are cut out; S reaches the
// truncation as doubles.
//
// An update whose blocks do not fit the device share goes in groups of consecutive centre
// charges: each group's Theta and SVDs in turn, its C (before the row scaling, which then runs in
// place) and its Vh parked in a spill store (engine/spill_store.hpp: pinned host memory charged to
// the host budget); after the global truncation each group's C and kept rows come back for
// C Y^dagger. Every block meets the same arithmetic as in one piece.
template <typename T>
class BondUpdate {
 public:
  BondUpdate(BondUpdater& updater, U1Mps& psi, int j, const GateTable& gate)
      : u_(updater), be_(updater.backend_), st_(*updater.stream_), w_(*updater.work_), timings_(updater.timings_),
        before_(updater.timings_), psi_(psi), j_(j), gate_(gate) {}

  // Returns the discarded weight.
  double run(const TruncParams& trunc) {
    plan_groups();
    for (std::size_t g = 0; g < gs_.size(); ++g) decompose(g);
    truncate(trunc);
    for (std::size_t g = 0, first = 0; g < gs_.size(); first += gs_[g].problems.size(), ++g) finish(g, first);
    assemble();
    ++timings_.updates;
    timings_.grouped += parked_ ? 1 : 0;
    timings_.groups += static_cast<std::int64_t>(gs_.size());
    log();
    timings_.svd_for_memory += svd_for_memory_;
    return t_.discarded;
  }

 private:
  using R = kernels::Real<T>;
  // A group's plan, SVD problems (offsets inside the group) and where its values start in the
  // update's flat C, S and Vh (the host's copies).
  struct Group {
    BondPlan plan;
    std::vector<kernels::SvdProblem> problems;
    std::int64_t c_base = 0, s_base = 0, vh_base = 0, s_size = 0, vh_size = 0;
  };

  // The centre blocks, whether C and Vh are parked on the host, the groups and the host buffers.
  void plan_groups() {
    blocks_ = centre_blocks(psi_, j_);
    const std::int64_t gpu_from = u_.gpu_svd_from_;
    svd_bytes_.assign(blocks_.size(), 0);
    std::vector<bool> svd_on_host(blocks_.size(), false);
    if (u_.device_share_ != std::numeric_limits<std::uint64_t>::max()) {
      svd_bytes_ = block_svd_bytes<T>(st_, blocks_, gpu_from);
      for (std::size_t i = 0; i < blocks_.size(); ++i) {
        // (the last resort before a budget too small: the block's SVD without its GPU workspace)
        if (u_.host_svd_when_short_ && svd_bytes_[i] > 0 &&
            update_bytes(blocks_, svd_bytes_, i, i + 1, sizeof(T), false) > u_.device_share_) {
          svd_bytes_[i] = 0, svd_on_host[i] = true;
          ++svd_for_memory_;
        }
      }
    }
    parked_ = update_bytes(blocks_, svd_bytes_, 0, blocks_.size(), sizeof(T), true) > u_.device_share_;
    cuts_ = parked_ ? group_cuts(blocks_, svd_bytes_, sizeof(T), u_.device_share_) : std::vector<std::size_t>{0, blocks_.size()};
    const std::size_t groups = cuts_.size() - 1;
    w_.exact = parked_;
    timings_.planning += seconds_since(clock_);

    gs_.resize(groups);
    std::int64_t c_total = 0, s_total = 0, vh_total = 0;
    for (std::size_t g = 0; g < groups; ++g) {
      std::int64_t c_size = 0, s_size = 0, vh_size = 0;
      for (std::size_t i = cuts_[g]; i < cuts_[g + 1]; ++i) {
        const std::int64_t r = std::min(blocks_[i].m, blocks_[i].n);
        gs_[g].problems.push_back({blocks_[i].m, blocks_[i].n, c_size, s_size, vh_size, svd_on_host[i]});
        c_size += blocks_[i].m * blocks_[i].n, s_size += r, vh_size += r * blocks_[i].n;
      }
      gs_[g].c_base = c_total, gs_[g].s_base = s_total, gs_[g].vh_base = vh_total, gs_[g].s_size = s_size, gs_[g].vh_size = vh_size;
      c_total += c_size, s_total += s_size, vh_total += vh_size;
    }
    c_total_ = c_total;
    host_s_ = w_.host_s.template get<R>(be_, s_total, false, "mps: staged singular values");
    if (parked_) {  // every group's C, then every group's Vh
      engine::SpillStore::Options o;
      o.owner = "mps: parked C and Vh blocks";
      o.space_bytes = static_cast<std::uint64_t>(c_total + vh_total) * sizeof(T);
      for (std::size_t g = 0; g < groups; ++g) {
        std::int64_t c_size = 0;
        for (const auto& p : gs_[g].problems) c_size += p.m * p.n;
        o.largest_store_bytes = std::max<std::uint64_t>({o.largest_store_bytes, static_cast<std::uint64_t>(c_size) * sizeof(T),
                                                         static_cast<std::uint64_t>(gs_[g].vh_size) * sizeof(T)});
      }
      o.largest_fetch_bytes = o.largest_store_bytes;
      // The host budget alone decides (its BudgetExceeded defers an update in flight, and names
      // --host-memory for one that runs alone), not the memory free when the store is made.
      o.host_share = std::numeric_limits<std::uint64_t>::max();
      parked_blocks_.emplace(be_, std::move(o));
      vh_at_ = c_total;
    }
  }

  // Parks `count` elements of device memory at element `at` of the store, on st_'s order: st_'s
  // later work waits for the copy (C is then scaled in place, buffers are freed).
  void park(std::int64_t at, const T* device, std::int64_t count) {
    parked_blocks_->stores_wait(st_.record());
    parked_blocks_->store(static_cast<std::uint64_t>(at) * sizeof(T), device, static_cast<std::uint64_t>(count) * sizeof(T));
    st_.wait(parked_blocks_->stored());
  }
  // Brings them back into device memory at `device`, before st_'s later work.
  void unpark(T* device, std::int64_t at, std::int64_t count) {
    parked_blocks_->fetches_wait(st_.record());
    parked_blocks_->fetch(device, static_cast<std::uint64_t>(at) * sizeof(T), static_cast<std::uint64_t>(count) * sizeof(T));
    st_.wait(parked_blocks_->fetched());
  }

  // Group g: its two sites' blocks to the device, C and Theta = diag(lambda[j]) C (in place once C
  // is parked), one SVD per charge block, and S (and when parked, C and Vh) back to the host.
  void decompose(std::size_t g) {
    Group& gr = gs_[g];
    const std::size_t groups = gs_.size();
    // (buffers grown by other updates or groups would crowd this one's out of its share)
    if (parked_ || w_.device_bytes() + update_bytes(blocks_, svd_bytes_, cuts_[g], cuts_[g + 1], sizeof(T), true) > u_.device_share_)
      w_.release_device();
    gr.plan = groups == 1 ? plan_bond(psi_, j_, gate_, std::move(blocks_))
                          : plan_bond(psi_, j_, gate_, {blocks_.begin() + cuts_[g], blocks_.begin() + cuts_[g + 1]});
    const BondPlan& plan = gr.plan;
    timings_.planning += seconds_since(clock_);

    // The two sites' blocks this group reads, packed in the plan's order.
    T* host_in = w_.host_in.template get<T>(be_, plan.input_size, false, "mps: staged site blocks");
    for (const auto& [x, offset] : plan.inputs) std::copy(x->values.begin(), x->values.end(), host_in + offset);
    T* sites = w_.sites.template get<T>(be_, plan.input_size, true, "mps: site blocks");
    be_.copy_to_device(sites, host_in, plan.input_size * sizeof(T), st_);
    std::vector<kernels::ScaledRows> rows;
    const std::vector<double> lambdas = row_lambdas(plan, psi_.bonds[j_], rows);
    double* host_scale = w_.host_scale.template get<double>(be_, static_cast<std::int64_t>(lambdas.size()), false, "mps: staged lambda");
    std::copy(lambdas.begin(), lambdas.end(), host_scale);
    double* scale = w_.scale.template get<double>(be_, static_cast<std::int64_t>(lambdas.size()), true, "mps: lambda");
    be_.copy_to_device(scale, host_scale, lambdas.size() * sizeof(double), st_);
    st_.synchronize();
    timings_.transfers += seconds_since(clock_);

    c_ = w_.c.template get<T>(be_, plan.c_size, true, "mps: C blocks");
    T* scratch = w_.scratch.template get<T>(be_, plan.scratch_size, true, "mps: product workspace");
    fill_c(be_, st_, plan, gate_, sites, c_, scratch, [&](std::size_t bytes) {
      const auto n = static_cast<std::int64_t>(bytes);
      return std::pair{w_.host_tiles.template get<char>(be_, n, false, "mps: staged tile tables"),
                       w_.tiles.template get<char>(be_, n, true, "mps: tile tables")};
    });
    T* theta = c_;
    if (parked_) {
      park(gr.c_base, c_, plan.c_size);
    } else {
      theta = w_.theta.template get<T>(be_, plan.c_size, true, "mps: Theta blocks");
    }
    kernels::scale_rows(st_, c_, scale, rows, theta);
    st_.synchronize();
    timings_.theta += seconds_since(clock_);
    timings_.products += static_cast<std::int64_t>(plan.products.size());
    timings_.gathered_pairs += static_cast<std::int64_t>(plan.tile_pairs.size() + plan.wide_pairs.size());
    timings_.wide_pairs += static_cast<std::int64_t>(plan.wide_pairs.size());
    timings_.rounds += static_cast<std::int64_t>(plan.rounds.size());

    // One SVD per charge block.
    const kernels::SvdRouting routing{u_.gpu_svd_from_};
    R* s = w_.s.template get<R>(be_, gr.s_size, true, "mps: singular values");
    vh_ = w_.vh.template get<T>(be_, gr.vh_size, true, "mps: right singular vectors");
    const std::size_t work_bytes = kernels::svd_workspace_bytes<T>(st_, gr.problems, routing);
    void* svd_work = work_bytes ? w_.svd.template get<char>(be_, static_cast<std::int64_t>(work_bytes), true, "mps: SVD workspace") : nullptr;
    timings_.svd_paths += kernels::batched_svd(st_, theta, gr.problems, s, vh_, svd_work, work_bytes, routing);
    st_.synchronize();
    timings_.svd += seconds_since(clock_);
    be_.copy_to_host(host_s_ + gr.s_base, s, gr.s_size * sizeof(R), st_);
    if (parked_) park(vh_at_ + gr.vh_base, vh_, gr.vh_size);
    st_.synchronize();
    timings_.transfers += seconds_since(clock_);
  }

  // The global truncation on the host, over every group's singular values in charge order; the
  // kept norm, in the units of the SVD (not relative): new lambda = S / that.
  void truncate(const TruncParams& trunc) {
    for (const Group& gr : gs_)
      for (std::size_t i = 0; i < gr.problems.size(); ++i) {
        const auto& p = gr.problems[i];
        values_.emplace_back(host_s_ + gr.s_base + p.s_offset, host_s_ + gr.s_base + p.s_offset + std::min(p.m, p.n));
        all_.push_back(&gr.plan.blocks[i]);
      }
    t_ = mps::truncate(values_, trunc);
    double kept2 = 0;
    for (std::size_t i = 0; i < values_.size(); ++i)
      for (std::int64_t q = 0; q < t_.kept[i]; ++q) kept2 += values_[i][q] * values_[i][q];
    kept_norm_ = std::sqrt(kept2);
    u_.last_norm_ = kept_norm_;
    timings_.truncation += seconds_since(clock_);

    // Where each block's C Y^dagger goes in host_out, then (in one piece) each kept Y after them.
    std::int64_t out_total = 0, y_total = 0;
    for (std::size_t i = 0; i < all_.size(); ++i) out_total += all_[i]->m * t_.kept[i], y_total += t_.kept[i] * all_[i]->n;
    host_out_ = w_.host_out.template get<T>(be_, out_total + y_total, false, "mps: staged new blocks");
    cy_of_.assign(all_.size(), nullptr);
    y_of_.assign(all_.size(), nullptr);
    out_at_ = 0, y_at_ = out_total;
  }

  // Group g (its blocks from `first` in the update's order): B'[j](c_L, c) = C(c) Y^dagger /
  // kept norm on the device, and both new sites back: the left blocks, then each kept Y.
  void finish(std::size_t g, std::size_t first) {
    const Group& gr = gs_[g];
    if (parked_) {
      w_.release_device();
      c_ = w_.c.template get<T>(be_, gr.plan.c_size, true, "mps: C blocks");
      vh_ = w_.vh.template get<T>(be_, gr.vh_size, true, "mps: right singular vectors");
      unpark(c_, gr.c_base, gr.plan.c_size);
      for (std::size_t i = 0; i < gr.problems.size(); ++i) {
        const auto& p = gr.problems[i];
        const std::int64_t kept_values = t_.kept[first + i] * p.n;
        if (kept_values > 0) unpark(vh_ + p.vh_offset, vh_at_ + gr.vh_base + p.vh_offset, kept_values);
      }
    }
    std::vector<kernels::AdjointProduct> products;
    std::int64_t out_size = 0;
    for (std::size_t i = 0; i < gr.problems.size(); ++i) {
      const auto& p = gr.problems[i];
      const std::int64_t k = t_.kept[first + i];
      if (k == 0) continue;
      products.push_back({p.offset, p.m, p.n, p.vh_offset, k, out_size, kept_norm_});
      cy_of_[first + i] = host_out_ + out_at_ + out_size;
      out_size += p.m * k;
    }
    T* out = w_.out.template get<T>(be_, out_size, true, "mps: new left blocks");
    kernels::times_adjoint(st_, c_, vh_, products, out);
    st_.synchronize();
    timings_.finish += seconds_since(clock_);

    be_.copy_to_host(host_out_ + out_at_, out, out_size * sizeof(T), st_);
    out_at_ += out_size;
    for (std::size_t i = 0; i < gr.problems.size(); ++i) {
      const auto& p = gr.problems[i];
      const std::int64_t k = t_.kept[first + i];
      if (k == 0) continue;
      be_.copy_to_host(host_out_ + y_at_, vh_ + p.vh_offset, k * p.n * sizeof(T), st_);
      y_of_[first + i] = host_out_ + y_at_;
      y_at_ += k * p.n;
    }
    st_.synchronize();
  }

  // The new centre bond j+1 and sites j, j+1 into psi: B'[j+1](c, c_R) = the kept rows of Y cut
  // by right sector, B'[j](c_L, c) = C Y^dagger / norm cut by left sector.
  void assemble() {
    Bond new_centre;
    Site new_a, new_b;
    for (std::size_t i = 0; i < all_.size(); ++i) {
      const ChargeBlock& cb = *all_[i];
      const std::int64_t k = t_.kept[i];
      if (k == 0) continue;
      for (std::int64_t q = 0; q < k; ++q) {
        new_centre.charges.push_back(cb.charge);
        new_centre.lambda.push_back(values_[i][q] / kept_norm_);
      }
      const T* y = y_of_[i];
      for (std::size_t sct = 0; sct < cb.cols.size(); ++sct) {
        Block blk{cb.charge, cb.cols[sct].charge, k, cb.cols[sct].size, {}};
        blk.values.resize(static_cast<std::size_t>(k * blk.cols));
        for (std::int64_t q = 0; q < k; ++q) std::copy_n(&y[q * cb.n + cb.col0[sct]], blk.cols, &blk.values[q * blk.cols]);
        new_b.blocks.push_back(std::move(blk));
      }
      const T* cy = cy_of_[i];
      for (std::size_t sct = 0; sct < cb.rows.size(); ++sct) {
        Block blk{cb.rows[sct].charge, cb.charge, cb.rows[sct].size, k, {}};
        blk.values.assign(cy + cb.row0[sct] * k, cy + (cb.row0[sct] + blk.rows) * k);
        new_a.blocks.push_back(std::move(blk));
      }
    }
    auto by_charges = [](const Block& x, const Block& y) {
      return std::pair{x.c_left, x.c_right} < std::pair{y.c_left, y.c_right};
    };
    std::sort(new_a.blocks.begin(), new_a.blocks.end(), by_charges);
    std::sort(new_b.blocks.begin(), new_b.blocks.end(), by_charges);
    psi_.bonds[j_ + 1] = std::move(new_centre);
    psi_.sites[j_] = std::move(new_a);
    psi_.sites[j_ + 1] = std::move(new_b);
    timings_.transfers += seconds_since(clock_);
  }

  // The update's blocks, products and times (debug).
  void log() const {
    if (!spdlog::should_log(spdlog::level::debug)) return;
    std::int64_t m_max = 0, n_max = 0, products = 0, scatters = 0, pairs = 0, terms = 0, wide = 0, rounds = 0;
    for (const ChargeBlock* cb : all_)
      if (std::min(cb->m, cb->n) > std::min(m_max, n_max)) m_max = cb->m, n_max = cb->n;
    for (const Group& gr : gs_) {
      products += static_cast<std::int64_t>(gr.plan.products.size()), scatters += static_cast<std::int64_t>(gr.plan.scatters.size());
      pairs += static_cast<std::int64_t>(gr.plan.tile_pairs.size() + gr.plan.wide_pairs.size());
      terms += static_cast<std::int64_t>(gr.plan.tile_terms.size());
      wide += static_cast<std::int64_t>(gr.plan.wide_pairs.size()), rounds += static_cast<std::int64_t>(gr.plan.rounds.size());
    }
    const UpdateTimings& a = timings_;
    spdlog::debug("mps.tebd: bond {}: {} charge blocks ({} values) in {} group(s), the largest {} x {}; planning {:.3f} s, Theta "
                  "{:.3f} s ({} GEMM products, {} scatters, {} sector pairs gathered with {} terms, {} of them wide in {} rounds), SVD "
                  "{:.3f} s ({} host, {} Jacobi, {} gesvdp), truncation {:.3f} s, C Y^dagger {:.3f} s, transfers {:.3f} s; kept {}",
                  j_ + 1, all_.size(), c_total_, gs_.size(), m_max, n_max, a.planning - before_.planning, a.theta - before_.theta,
                  products, scatters, pairs, terms, wide, rounds, a.svd - before_.svd, a.svd_paths.host - before_.svd_paths.host,
                  a.svd_paths.jacobi - before_.svd_paths.jacobi, a.svd_paths.polar - before_.svd_paths.polar,
                  a.truncation - before_.truncation, a.finish - before_.finish, a.transfers - before_.transfers,
                  psi_.bonds[j_ + 1].size());
  }

  BondUpdater& u_;
  Backend& be_;
  Stream& st_;
  BondUpdater::Workspace& w_;
  UpdateTimings& timings_;
  const UpdateTimings before_;
  std::chrono::steady_clock::time_point clock_ = std::chrono::steady_clock::now();
  U1Mps& psi_;
  const int j_;
  const GateTable& gate_;
  // plan_groups
  std::vector<ChargeBlock> blocks_;
  std::vector<std::size_t> svd_bytes_;
  std::int64_t svd_for_memory_ = 0;  // (counted once the update succeeds: a retried one would count twice)
  bool parked_ = false;
  std::vector<std::size_t> cuts_;
  std::vector<Group> gs_;
  std::int64_t c_total_ = 0;
  R* host_s_ = nullptr;
  std::optional<engine::SpillStore> parked_blocks_;  // parked: every group's C, then every group's Vh (at vh_at_)
  std::int64_t vh_at_ = 0;
  // decompose (the last group's device C and Vh, which finish reuses when nothing is parked)
  T *c_ = nullptr, *vh_ = nullptr;
  // truncate
  std::vector<std::vector<double>> values_;
  std::vector<const ChargeBlock*> all_;  // the update's blocks in charge order, across the groups
  Truncation t_;
  double kept_norm_ = 0;
  T* host_out_ = nullptr;
  std::vector<const T*> cy_of_, y_of_;
  std::int64_t out_at_ = 0, y_at_ = 0;
};

double BondUpdater::update(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc) {
  return precision_ == Precision::complex64 ? BondUpdate<kernels::cplx64>(*this, psi, j, gate).run(trunc)
                                            : BondUpdate<kernels::cplx128>(*this, psi, j, gate).run(trunc);
}

std::vector<std::int64_t> owned_updates(std::int64_t count, int rank, int ranks, int first) {
  std::vector<std::int64_t> mine;
  for (std::int64_t i = ((rank - first) % ranks + ranks) % ranks; i < count; i += ranks) mine.push_back(i);
  return mine;
}

LayerUpdater::LayerUpdater(Backend& backend, std::int64_t gpu_svd_from, Precision precision, comm::Communicator* ranks)
    : backend_(backend),
      gpu_svd_from_(gpu_svd_from),
      precision_(precision),
      ranks_(ranks && ranks->size() > 1 ? ranks : nullptr) {}
LayerUpdater::~LayerUpdater() = default;

void LayerUpdater::apply(U1Mps& psi, const std::vector<BondGate>& updates, const TruncParams& trunc, double& eps) {
  if (updates.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> discarded(updates.size(), 0.0), norms(updates.size(), 1.0);
  const int P = ranks_ ? ranks_->size() : 1;
  const std::vector<std::int64_t> mine = owned_updates(static_cast<std::int64_t>(updates.size()), ranks_ ? ranks_->rank() : 0,
                                                       P, static_cast<int>(exchange_.exchanges % P));
  std::exception_ptr failure;
  // The updates beside each other within the device budget, then those that need it to
  // themselves one at a time. Each update computes what it would alone: the same bits in any
  // order and at any share.
  std::vector<std::int64_t> alone;
  run_shared(psi, updates, mine, trunc, discarded, norms, failure, alone);
  if (!failure && !alone.empty()) {
    try {
      run_alone(psi, updates, alone, trunc, discarded, norms);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (ranks_) exchange(psi, updates, mine, failure, discarded, norms);
  else if (failure) std::rethrow_exception(failure);
  wall_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (double e : discarded) eps += e;
  if (psi.pair())
    for (double n : norms) psi.weight *= n;
}

namespace {

// The device budget of a layer's updates, lent as each starts (libcudf-style: the state here, the
// callers drive it). Every updater holds its stream's bytes (on cuda a cuBLAS workspace) and, while
// idle, the buffers it kept; a running update holds the share it was lent plus a margin for what
// update_bytes leaves out (the gather form's tables, the row scales, S). Updates are served in
// the order they ask: the first in line gets clamp(what is free / those in line, its least, its
// whole) and waits while even its least does not fit; before waiting it frees what idle updaters
// keep, then the idle updaters themselves (but the last). So the smaller updates run many at a time, the larger in
// groups of centre charges beside fewer, and none waits for a share it does not need.
class UpdaterSlots {
 public:
  using Make = std::function<std::unique_ptr<BondUpdater>()>;
  UpdaterSlots(std::vector<std::unique_ptr<BondUpdater>>& idle, UpdateTimings& retired, LayerUpdater::Sharing& sharing,
               std::uint64_t limit, std::uint64_t stream_bytes, Make make)
      : idle_(idle),
        retired_(retired),
        sharing_(sharing),
        limit_(limit),
        stream_(stream_bytes),
        make_(std::move(make)) {
    for (const auto& u : idle_) held_ += stream_ + u->device_bytes();
  }

  // (an eighth, and 16 KiB for the small buffers it leaves out: the row scales, S, the tables)
  static std::uint64_t with_margin(std::uint64_t share) { return share + share / 8 + (16 << 10); }

  struct Lent {
    std::unique_ptr<BondUpdater> updater;
    std::uint64_t held = 0;  // its stream, the share and the margin
    int busy = 1;            // updates running now, this one included, and those in line that fit beside them
  };

  // Blocks until `need` fits beside the running updates; BudgetExceeded if the device pool refuses
  // a new updater's stream (the caller runs that update alone).
  Lent lend(const UpdateNeed& need) {
    std::unique_lock lock(mutex_);
    const std::uint64_t ticket = next_ticket_++;
    bool waited = false;
    for (;;) {
      if (serving_ == ticket) {
        std::unique_ptr<BondUpdater> u;
        if (!idle_.empty()) u = std::move(idle_.back()), idle_.pop_back();
        const std::uint64_t kept = u ? stream_ + u->device_bytes() : 0;
        const std::uint64_t others = held_ - kept, free = limit_ > others + stream_ ? limit_ - others - stream_ : 0;
        const std::uint64_t in_line = next_ticket_ - serving_;
        // (the buffers an updater kept stay within a share that has room for them beside the estimate)
        const std::uint64_t most = need.whole + (u ? u->device_bytes() : 0);
        // (a fair part of what is free, less its margin)
        const std::uint64_t fair = free / in_line > (16 << 10) ? (free / in_line - (16 << 10)) / 9 * 8 : 0;
        const std::uint64_t share = std::clamp<std::uint64_t>(fair, need.least, std::max(most, need.least));
        if (with_margin(share) <= free) {
          if (!u) {
            lock.unlock();
            try {
              u = make_();
            } catch (...) {
              lock.lock();
              ++serving_;
              cv_.notify_all();
              throw;
            }
            lock.lock();
          }
          u->set_device_share(share);
          Lent lent{std::move(u), stream_ + with_margin(share), ++running_};
          held_ = held_ - kept + lent.held;  // (others may have given back while the updater was made)
          ++serving_;
          // (those in line start soon where what is left holds them with shares like this one's)
          const std::uint64_t left = limit_ > held_ ? limit_ - held_ : 0, behind = next_ticket_ - serving_;
          lent.busy = running_ + static_cast<int>(std::min<std::uint64_t>(behind, left / lent.held));
          sharing_.most_at_once = std::max(sharing_.most_at_once, running_);
          sharing_.waited += waited ? 1 : 0;
          cv_.notify_all();
          return lent;
        }
        // Short: what idle updaters keep, then the idle updaters themselves, then wait.
        if (u) idle_.push_back(std::move(u));
        if (free_idle()) continue;
        waited = true;
      }
      cv_.wait(lock);
    }
  }

  // An update done (or failed): its updater idle again, holding its stream and what it kept.
  void give_back(Lent&& lent) {
    const std::lock_guard lock(mutex_);
    held_ -= lent.held;
    held_ += stream_ + lent.updater->device_bytes();
    idle_.push_back(std::move(lent.updater));
    --running_;
    cv_.notify_all();
  }

 private:
  // Frees what one idle updater keeps (its buffers, else the updater, but the last): false if nothing is left to free.
  bool free_idle() {
    for (auto& u : idle_)
      if (u->device_bytes() > 0) {
        held_ -= u->device_bytes();
        u->release_device();
        return true;
      }
    if (idle_.size() <= 1) return false;  // (the one left is the next update's: it needs a stream anyway)
    retired_ += idle_.back()->timings();
    idle_.pop_back();
    held_ -= stream_;
    return true;
  }

  std::vector<std::unique_ptr<BondUpdater>>& idle_;
  UpdateTimings& retired_;
  LayerUpdater::Sharing& sharing_;
  const std::uint64_t limit_, stream_;
  Make make_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t held_ = 0, next_ticket_ = 0, serving_ = 0;
  int running_ = 0;
};

}  // namespace

void LayerUpdater::run_shared(U1Mps& psi, const std::vector<BondGate>& updates,
                              const std::vector<std::int64_t>& indices, const TruncParams& trunc,
                              std::vector<double>& discarded, std::vector<double>& norms, std::exception_ptr& failure,
                              std::vector<std::int64_t>& alone) {
  const std::uint64_t limit = backend_.device_budget().limit(), stream_bytes = backend_.blas_stream_bytes();
  // Each update's estimate (one stream for the SVD workspace queries; no device memory); one that
  // does not fit beside a single stream runs alone, and so do the bonds the pool refused before.
  if (!planner_) planner_ = backend_.make_stream(false);
  std::vector<std::pair<UpdateNeed, std::int64_t>> order;
  for (std::int64_t i : indices) {
    const int bond = updates[static_cast<std::size_t>(i)].bond;
    const UpdateNeed need =
        alone_bonds_.count(bond) ? UpdateNeed{} : update_need(*planner_, psi, bond, precision_, gpu_svd_from_);
    if (alone_bonds_.count(bond) || UpdaterSlots::with_margin(need.least) + stream_bytes > limit) {
      alone.push_back(i);
      sharing_.alone_by_pool += alone_bonds_.count(bond) ? 1 : 0;
    } else {
      order.emplace_back(need, i);
    }
  }
  // The largest first, so that the small ones fill in around them at the end.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first.whole > b.first.whole; });
  std::mutex alone_mutex;
  UpdaterSlots slots(idle_, retired_, sharing_, limit, stream_bytes, [&] {
    backend_.bind_thread();
    return std::make_unique<BondUpdater>(backend_, gpu_svd_from_, precision_);
  });
  const auto count = static_cast<std::int64_t>(order.size());
  const int threads = omp_get_max_threads();
  const int team = static_cast<int>(std::min<std::int64_t>(threads, count));
  const int saved_levels = omp_get_max_active_levels();
  if (team > 1) omp_set_max_active_levels(2);
  FirstFailure thrown;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
  for (std::int64_t k = 0; k < count; ++k)
    thrown.run([&] {
      const auto& [need, index] = order[static_cast<std::size_t>(k)];
      const auto i = static_cast<std::size_t>(index);
      backend_.bind_thread();
      UpdaterSlots::Lent lent;
      try {
        lent = slots.lend(need);
      } catch (const BudgetExceeded&) {  // (the pool refused a new stream: alone, after the others)
        const std::lock_guard lock(alone_mutex);
        alone.push_back(index);
        ++sharing_.alone_by_pool;
        return;
      }
      // Each update's host SVDs (kernels::batched_svd's OpenMP loop over blocks, nested here) get
      // the threads the busy updates leave (in core all of them are busy: one each); each SVD
      // still runs on one.
      omp_set_num_threads(std::max(1, threads / lent.busy));
      try {
        lent.updater->set_host_svd_when_short(false);
        discarded[i] = lent.updater->update(psi, updates[i].bond, *updates[i].gate, trunc);
        norms[i] = lent.updater->last_norm();
      } catch (const BudgetExceeded& e) {
        // (update() changes psi only once it has computed: rerun alone, it gives the same bits)
        spdlog::debug("mps.tebd: bond {} runs alone after the others (its share {}, its buffers {}): {}",
                      updates[i].bond + 1, format_bytes(static_cast<double>(lent.updater->device_share())),
                      format_bytes(static_cast<double>(lent.updater->device_bytes())), e.what());
        const std::lock_guard lock(alone_mutex);
        alone.push_back(index);
        alone_bonds_.insert(updates[i].bond);
        ++sharing_.alone_by_pool;
      } catch (...) {
        slots.give_back(std::move(lent));
        throw;
      }
      slots.give_back(std::move(lent));
    });
  if (!failure) failure = thrown.first();
  omp_set_max_active_levels(saved_levels);
  std::sort(alone.begin(), alone.end());
}

void LayerUpdater::run_alone(U1Mps& psi, const std::vector<BondGate>& updates, std::vector<std::int64_t> indices,
                             const TruncParams& trunc, std::vector<double>& discarded, std::vector<double>& norms) {
  std::sort(indices.begin(), indices.end());
  sharing_.alone += static_cast<std::int64_t>(indices.size());
  // One updater with the whole budget but its stream: the others and what they kept go.
  while (idle_.size() > 1) {
    retired_ += idle_.back()->timings();
    idle_.pop_back();
  }
  if (idle_.empty()) {
    try {
      backend_.bind_thread();
      idle_.push_back(std::make_unique<BondUpdater>(backend_, gpu_svd_from_, precision_));
    } catch (const BudgetExceeded& e) {
      // (on cuda the updater's stream holds a cuBLAS workspace, charged to the budget)
      throw InputError(fmt::format(
          "the device budget is too small for one two-site updater's stream: {}; expected a larger --device-memory",
          e.what()));
    }
  }
  BondUpdater& updater = *idle_.front();
  updater.release_device();
  const std::uint64_t limit = backend_.device_budget().limit(), stream_bytes = backend_.blas_stream_bytes();
  const std::uint64_t whole = limit > stream_bytes ? limit - stream_bytes : 0;
  updater.set_host_svd_when_short(true);
  sharing_.most_at_once = std::max(sharing_.most_at_once, 1);
  for (std::int64_t i : indices) {
    const BondGate& u = updates[static_cast<std::size_t>(i)];
    updater.set_device_share(whole);
    // An update whose buffers outgrow its estimate (the gather form's tables are not in it) is
    // retried in smaller groups: the share halved, up to 8 times. One whose estimate refuses it (a
    // charge block alone above the share) is not helped by a smaller share: too small a budget.
    std::string overrun;  // (the device pool's refusal that began the retries)
    for (int attempt = 0;; ++attempt) {
      try {
        discarded[static_cast<std::size_t>(i)] = updater.update(psi, u.bond, *u.gate, trunc);
        break;
      } catch (const BudgetExceeded& e) {
        // (parking C and Vh takes the whole update's values in host memory: a smaller device
        // share does not make that less)
        if (e.budget() == "host")
          throw InputError(fmt::format("the host budget is too small for one two-site update (sites {} and {}): {}; expected a larger "
                                       "--host-memory", u.bond, u.bond + 1, e.what()));
        if (e.budget().empty() || attempt == 8)
          throw InputError(
              fmt::format("the device budget is too small for one two-site update (sites {} and {}): {}{}; expected a "
                          "larger --device-memory",
                          u.bond, u.bond + 1, e.what(),
                          overrun.empty() ? "" : fmt::format(" (in smaller groups after: {})", overrun)));
        if (overrun.empty()) overrun = e.what();
        spdlog::debug("mps.tebd: bond {} alone, retried in smaller groups (its share {}, its buffers {}): {}",
                      u.bond + 1, format_bytes(static_cast<double>(updater.device_share())),
                      format_bytes(static_cast<double>(updater.device_bytes())), e.what());
        updater.set_device_share(updater.device_share() / 2);
      }
    }
    norms[static_cast<std::size_t>(i)] = updater.last_norm();
  }
  updater.release_device();  // (the next layer's updates share the budget again)
}

void LayerUpdater::exchange(U1Mps& psi, const std::vector<BondGate>& updates, const std::vector<std::int64_t>& mine,
                            const std::exception_ptr& failure, std::vector<double>& discarded, std::vector<double>& norms) {
  const auto start = std::chrono::steady_clock::now();
  // A packet: a status byte (0: the updates follow; 1 InputError, 2 CheckFailed, 3 other: its message follows).
  Packer out;
  if (failure) {
    std::uint8_t kind = 3;
    std::string message = "unknown exception";
    try {
      std::rethrow_exception(failure);
    } catch (const InputError& e) {
      kind = 1, message = e.what();
    } catch (const CheckFailed& e) {
      kind = 2, message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    out.put(kind);
    out.put_string(message);
  } else {
    out.put(std::uint8_t{0});
    for (std::int64_t i : mine) {
      const int j = updates[static_cast<std::size_t>(i)].bond;
      out.put<std::uint64_t>(static_cast<std::uint64_t>(i));
      out.put(discarded[static_cast<std::size_t>(i)]), out.put(norms[static_cast<std::size_t>(i)]);
      out.put_bond(psi.bonds[j + 1]);
      out.put_site(psi.sites[j]), out.put_site(psi.sites[j + 1]);
      ++exchange_.bonds[j];
    }
  }
  const std::string packet = out.take();
  const comm::Received<char> received_bytes = ranks_->allgatherv(comm::HostSpan<const char>(packet.data(), packet.size()));
  const int me = ranks_->rank(), P = ranks_->size(), first = static_cast<int>(exchange_.exchanges % P);
  std::vector<std::string_view> all;  // each rank's packet
  for (std::size_t q = 0, at = 0; q < received_bytes.counts.size(); at += received_bytes.counts[q++])
    all.emplace_back(received_bytes.data.data() + at, received_bytes.counts[q]);
  // Every rank sees every packet, so every rank throws the same (the lowest failed rank's).
  for (int q = 0; q < P; ++q) {
    Unpacker in(all[static_cast<std::size_t>(q)]);
    const auto kind = in.get<std::uint8_t>();
    if (kind == 0) continue;
    const std::string message = in.get_string();
    if (kind == 1) throw InputError(message);
    if (kind == 2) throw CheckFailed(message);
    throw RuntimeFailure(fmt::format("mps: two-site update on rank {}: {}", q, message));
  }
  std::size_t received = mine.size();
  for (int q = 0; q < P; ++q) {
    const std::string_view bytes = all[static_cast<std::size_t>(q)];
    exchange_.bytes_received += q == me ? 0 : bytes.size();
    if (q == me) continue;
    Unpacker in(bytes);
    in.get<std::uint8_t>();
    while (!in.done()) {
      const auto i = in.get<std::uint64_t>();
      if (i >= updates.size() || static_cast<int>((i + static_cast<std::uint64_t>(first)) % static_cast<std::uint64_t>(P)) != q)
        throw std::logic_error(fmt::format("mps: rank {} sent update {} of {}, which is not its own", q, i, updates.size()));
      const int j = updates[i].bond;
      discarded[i] = in.get<double>(), norms[i] = in.get<double>();
      psi.bonds[j + 1] = in.get_bond();
      psi.sites[j] = in.get_site();
      psi.sites[j + 1] = in.get_site();
      ++received;
    }
  }
  if (received != updates.size())
    throw std::logic_error(fmt::format("mps: the ranks exchanged {} of {} updates", received, updates.size()));
  exchange_.bytes_sent += packet.size();
  ++exchange_.exchanges;
  exchange_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void LayerUpdater::recanonicalize(U1Mps& psi, int bond) {
  const auto start = std::chrono::steady_clock::now();
  canonicalize(psi, bond);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::debug("mps.tebd: canonical form restored after the gate on sites {} and {} (not unitary) in {:.3f} s", bond, bond + 1, seconds);
  retired_.canonical += seconds;
  ++retired_.canonicalizations;
}

UpdateTimings LayerUpdater::timings() const {
  UpdateTimings t = retired_;
  for (const auto& u : idle_) t += u->timings();
  return t;
}

double update_bond(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc, Precision precision) {
  static const std::unique_ptr<Backend> host = host_backend();
  BondUpdater updater(*host, kernels::kGpuSvdFrom, precision);
  const double eps = updater.update(psi, j, gate, trunc);
  if (psi.pair()) psi.weight *= updater.last_norm();
  return eps;
}

}  // namespace qstage::stages::mps
