#include "kernels/charge_tiles.hpp"

#include <vector>

#include "kernels/dense_linalg.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {

using cplx = std::complex<double>;

// One pair: its products (kernels::matmul, as charge_products), then each destination tile's
// sums in term order (as charge_products' scatters add them).
void pair_tiles(const cplx* sites, const cplx* gate, const TileTables& t, const TilePair& p, std::vector<cplx>& products,
                cplx* c) {
  const std::int64_t mn = p.m * p.n;
  products.resize(static_cast<std::size_t>(p.terms * mn));
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
    cplx* tile = c + at;
    for (std::int64_t e = 0; e < mn; ++e) {
      cplx sum{};
      for (std::int64_t i = 0; i < p.terms; ++i) {
        const cplx u = t.rule.gate_value(gate, p.l, t.terms[p.first_term + i].mid, centre, p.r);
        if (u == cplx{}) continue;
        sum += u * products[i * mn + e];
      }
      tile[(e / p.n) * ld + e % p.n] += sum;
    }
  }
}

// Pairs write disjoint tiles: any thread count gives the same bits.
void tiles_on_host(const cplx* sites, const cplx* gate, const TileTables& tables, cplx* c) {
  single_threaded_blas();
#pragma omp parallel
  {
    std::vector<cplx> products;
#pragma omp for schedule(dynamic, 256)
    for (std::int64_t i = 0; i < tables.pair_count; ++i) pair_tiles(sites, gate, tables, tables.pairs[i], products, c);
  }
}

}  // namespace

void charge_tiles(Stream& stream, const cplx* sites, const cplx* gate, const TileTables& tables, cplx* c) {
  QSTAGE_DISPATCH(stream, tiles_on_host(sites, gate, tables, c), detail::charge_tiles_cuda(stream, sites, gate, tables, c));
}

}  // namespace qstage::kernels
