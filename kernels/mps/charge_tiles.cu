#include <cuComplex.h>

#include <algorithm>

#include "backend/cuda_check.hpp"
#include "kernels/mps/charge_tiles.hpp"
#include "kernels/warp.cuh"

namespace qstage::kernels::detail {
namespace {

// (ChargeRule::gate_value's Complex: conj() found by argument-dependent lookup)
template <typename R>
struct Z {
  R re = 0, im = 0;
  __device__ Z() = default;
  __device__ Z(R r, R i) : re(r), im(i) {}
  __device__ Z operator*(Z o) const { return {re * o.re - im * o.im, re * o.im + im * o.re}; }
  __device__ Z& operator+=(Z o) {
    re += o.re, im += o.im;
    return *this;
  }
  __device__ bool zero() const { return re == 0 && im == 0; }
};
template <typename R>
__device__ Z<R> conj(Z<R> z) { return {z.re, -z.im}; }

constexpr int kThreads = 128;

// Item e of pair p's products (term e / mn, element e % mn): the plain loop both kinds of pair
// share, so a pair's bits do not depend on its kind.
template <typename R>
__device__ Z<R> product_item(const Z<R>* sites, const TileTables& t, const TilePair& p, std::int64_t e) {
  const std::int64_t mn = p.m * p.n, i = e / mn, el = e - i * mn, row = el / p.n, col = el - row * p.n;
  const TileTerm x = t.terms[p.first_term + i];
  Z<R> s;
  for (std::int64_t q = 0; q < x.k; ++q) s += sites[x.x + row * x.k + q] * sites[x.y + q * p.n + col];
  return s;
}

// Mixing item e of pair p (destination local e / mn, element e % mn): the sum over the terms, in
// order, of the gate entry times the product element (`products`: the pair's, terms m n), added to
// its place in c; nothing where that centre has no tile.
template <typename R>
__device__ void mix_item(const Z<R>* gate, const TileTables& t, const TilePair& p, std::int64_t e, const Z<R>* products, Z<R>* c) {
  const std::int64_t mn = p.m * p.n;
  const int local = static_cast<int>(e / mn);
  const std::int64_t el = e - local * mn;
  int centre = 0;
  std::int64_t ld = 0;
  const std::int64_t at = t.tile_at(p.l, p.r, local, centre, ld);
  if (at < 0) return;
  Z<R> sum;
  for (std::int64_t i = 0; i < p.terms; ++i) {
    const Z<R> u = t.rule.gate_value(gate, p.l, t.terms[p.first_term + i].mid, centre, p.r);
    if (!u.zero()) sum += u * products[i * mn + el];
  }
  const std::int64_t row = el / p.n, col = el - row * p.n;
  c[at + row * ld + col] += sum;
}

// One thread block per pair (grid-stride): its products into shared memory, then every element
// of its destination tiles, each summed over the terms in order.
template <typename R>
__global__ void tiles_kernel(const Z<R>* sites, const Z<R>* gate, TileTables t, Z<R>* c) {
  extern __shared__ unsigned char shared[];
  auto* products = reinterpret_cast<Z<R>*>(shared);
  const int D = t.rule.local_dim();
  for (std::int64_t pi = blockIdx.x; pi < t.pair_count; pi += gridDim.x) {
    const TilePair p = t.pairs[pi];
    const std::int64_t mn = p.m * p.n;
    for (std::int64_t e = threadIdx.x; e < p.terms * mn; e += blockDim.x) products[e] = product_item(sites, t, p, e);
    __syncthreads();
    for (std::int64_t e = threadIdx.x; e < D * mn; e += blockDim.x) mix_item(gate, t, p, e, products, c);
    __syncthreads();
  }
}

// The pair of a round's `pairs` (count of them) that item e belongs to: the last whose first item
// (`work`, or `mix` when `mixing`) is at most e.
template <bool mixing>
__device__ const TilePair& pair_of(const TilePair* pairs, std::int64_t count, std::int64_t e) {
  std::int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if ((mixing ? pairs[mid].mix : pairs[mid].work) <= e) lo = mid; else hi = mid - 1;
  }
  return pairs[lo];
}

// A round of wide pairs, first pass: every element of every product into the workspace, by the
// loop of tiles_kernel (the same bits).
template <typename R>
__global__ void wide_products_kernel(const Z<R>* sites, TileTables t, TileRound round, Z<R>* work) {
  const TilePair* pairs = t.wide + round.first;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < round.products; e += stride) {
    const TilePair& p = pair_of<false>(pairs, round.count, e);
    work[e] = product_item(sites, t, p, e - p.work);
  }
}

// Second pass: each destination element sums its pair's products in term order (tiles_kernel's sums).
template <typename R>
__global__ void wide_mix_kernel(const Z<R>* gate, TileTables t, TileRound round, const Z<R>* work, Z<R>* c) {
  const TilePair* pairs = t.wide + round.first;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < round.mixes; e += stride) {
    const TilePair& p = pair_of<true>(pairs, round.count, e);
    mix_item(gate, t, p, e - p.mix, work + p.work, c);
  }
}

// A round's grid: a thread an item, at most 2^22 CTAs (the kernels stride over the rest).
unsigned round_grid(std::int64_t items) { return std::min(grid_for(static_cast<std::uint64_t>(items), kThreads), 1u << 22); }

}  // namespace

template <typename T>
void charge_tiles_cuda(Stream& stream, const T* sites, const T* gate, const TileTables& tables,
                       const std::vector<TileRound>& rounds, T* c, T* workspace) {
  using R = typename T::value_type;
  auto st = static_cast<cudaStream_t>(stream.native());
  const auto* zs = reinterpret_cast<const Z<R>*>(sites);
  const auto* zg = reinterpret_cast<const Z<R>*>(gate);
  auto* zc = reinterpret_cast<Z<R>*>(c);
  if (tables.pair_count > 0) {
    const auto shared = static_cast<std::size_t>(std::max<std::int64_t>(tables.max_terms_mn, 1)) * sizeof(Z<R>);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(tables.pair_count, 1 << 20));
    tiles_kernel<R><<<blocks, kThreads, shared, st>>>(zs, zg, tables, zc);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
  auto* work = reinterpret_cast<Z<R>*>(workspace);
  for (const TileRound& round : rounds) {
    wide_products_kernel<R><<<round_grid(round.products), kThreads, 0, st>>>(zs, tables, round, work);
    QSTAGE_CUDA_CHECK_LAUNCH();
    wide_mix_kernel<R><<<round_grid(round.mixes), kThreads, 0, st>>>(zg, tables, round, work, zc);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}
template void charge_tiles_cuda(Stream&, const std::complex<double>*, const std::complex<double>*, const TileTables&,
                                const std::vector<TileRound>&, std::complex<double>*, std::complex<double>*);
template void charge_tiles_cuda(Stream&, const std::complex<float>*, const std::complex<float>*, const TileTables&,
                                const std::vector<TileRound>&, std::complex<float>*, std::complex<float>*);

}  // namespace qstage::kernels::detail
