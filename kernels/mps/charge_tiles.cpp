#include "kernels/mps/charge_tiles.hpp"

#include <vector>

#include "kernels/mps/charge_blocks.hpp"
#include "kernels/linalg/dense_linalg.hpp"
#include "core/parallel.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {

// One pair: its products (kernels::matmul, as charge_products), then each destination tile's
// sums in term order (as charge_products' scatters add them).
template <typename T>
void pair_tiles(const T* sites, const T* gate, const TileTables& t, const TilePair& p, std::vector<T>& products,
                std::vector<T>& u, T* c) {
  const std::int64_t mn = p.m * p.n;
  products.resize(static_cast<std::size_t>(p.terms * mn));
  u.resize(static_cast<std::size_t>(p.terms));  // the gate entries of one tile's terms
  for (std::int64_t i = 0; i < p.terms; ++i) {
    const TileTerm& x = t.terms[p.first_term + i];
    matmul(sites + x.x, sites + x.y, products.data() + i * mn, p.m, x.k, p.n);
  }
  const int D = t.rule.local_dim();
  for (int local = 0; local < D; ++local) {
    int centre = 0;
    std::int64_t ld = 0;
    const std::int64_t at = t.tile_at(p.l, p.r, local, centre, ld);
    if (at < 0) continue;
    T* tile = c + at;
    for (std::int64_t i = 0; i < p.terms; ++i) u[i] = t.rule.gate_value(gate, p.l, t.terms[p.first_term + i].mid, centre, p.r);
    for (std::int64_t e = 0; e < mn; ++e) {
      T sum{};
      for (std::int64_t i = 0; i < p.terms; ++i) {
        if (u[i] == T{}) continue;
        sum += u[i] * products[i * mn + e];
      }
      tile[(e / p.n) * ld + e % p.n] += sum;
    }
  }
}

// Pairs write disjoint tiles: any thread count gives the same bits. Wide pairs are pairs as any
// other here (no rounds: each thread holds one pair's products).
template <typename T>
void tiles_on_host(const T* sites, const T* gate, const TileTables& tables, T* c) {
  single_threaded_blas();
  const std::int64_t count = tables.pair_count + tables.wide_count;
  FirstFailure failure;  // (growing the buffers can throw std::bad_alloc)
#pragma omp parallel
  {
    std::vector<T> products, u;
#pragma omp for schedule(dynamic, 64)
    for (std::int64_t i = 0; i < count; ++i)
      failure.run([&] {
        const TilePair& p = i < tables.pair_count ? tables.pairs[i] : tables.wide[i - tables.pair_count];
        pair_tiles(sites, gate, tables, p, products, u, c);
      });
  }
  failure.rethrow();
}

}  // namespace

std::vector<TileRound> plan_tile_rounds(std::vector<TilePair>& wide, int local_dim, std::int64_t limit) {
  std::vector<TileRound> rounds;
  for (std::size_t i = 0; i < wide.size(); ++i) {
    TilePair& p = wide[i];
    const std::int64_t products = p.terms * p.m * p.n;
    if (rounds.empty() || (rounds.back().count > 0 && rounds.back().products + products > limit))
      rounds.push_back({static_cast<std::int64_t>(i), 0, 0, 0});
    TileRound& r = rounds.back();
    p.work = r.products, p.mix = r.mixes;
    r.products += products, r.mixes += local_dim * p.m * p.n;
    ++r.count;
  }
  return rounds;
}

template <typename T>
void charge_tiles(Stream& stream, const T* sites, const T* gate, const TileTables& tables,
                  const std::vector<TileRound>& rounds, T* c, T* workspace) {
  QSTAGE_DISPATCH(stream, tiles_on_host(sites, gate, tables, c),
                  detail::charge_tiles_cuda(stream, sites, gate, tables, rounds, c, workspace));
}
template void charge_tiles(Stream&, const cplx128*, const cplx128*, const TileTables&, const std::vector<TileRound>&,
                           cplx128*, cplx128*);
template void charge_tiles(Stream&, const cplx64*, const cplx64*, const TileTables&, const std::vector<TileRound>&,
                           cplx64*, cplx64*);

}  // namespace qstage::kernels
