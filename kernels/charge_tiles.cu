#include <cuComplex.h>

#include <algorithm>

#include "backend/cuda_check.hpp"
#include "kernels/charge_tiles.hpp"

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
    for (std::int64_t e = threadIdx.x; e < p.terms * mn; e += blockDim.x) {
      const std::int64_t i = e / mn, el = e - i * mn, row = el / p.n, col = el - row * p.n;
      const TileTerm x = t.terms[p.first_term + i];
      Z<R> s;
      for (std::int64_t q = 0; q < x.k; ++q) s += sites[x.x + row * x.k + q] * sites[x.y + q * p.n + col];
      products[e] = s;
    }
    __syncthreads();
    for (std::int64_t e = threadIdx.x; e < D * mn; e += blockDim.x) {
      const int local = static_cast<int>(e / mn);
      const std::int64_t el = e - local * mn;
      int centre = 0;
      std::int64_t ld = 0;
      const std::int64_t at = t.tile_at(p.l, p.r, local, centre, ld);
      if (at < 0) continue;
      Z<R> sum;
      for (std::int64_t i = 0; i < p.terms; ++i) {
        const Z<R> u = t.rule.gate_value(gate, p.l, t.terms[p.first_term + i].mid, centre, p.r);
        if (!u.zero()) sum += u * products[i * mn + el];
      }
      const std::int64_t row = el / p.n, col = el - row * p.n;
      c[at + row * ld + col] += sum;
    }
    __syncthreads();
  }
}

}  // namespace

template <typename T>
void charge_tiles_cuda(Stream& stream, const T* sites, const T* gate, const TileTables& tables, T* c) {
  using R = typename T::value_type;
  if (tables.pair_count == 0) return;
  const auto shared = static_cast<std::size_t>(std::max<std::int64_t>(tables.max_terms_mn, 1)) * sizeof(Z<R>);
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(tables.pair_count, 1 << 20));
  tiles_kernel<R><<<blocks, kThreads, shared, static_cast<cudaStream_t>(stream.native())>>>(
      reinterpret_cast<const Z<R>*>(sites), reinterpret_cast<const Z<R>*>(gate), tables, reinterpret_cast<Z<R>*>(c));
  QSTAGE_CUDA_CHECK_LAUNCH();
}
template void charge_tiles_cuda(Stream&, const std::complex<double>*, const std::complex<double>*, const TileTables&,
                                std::complex<double>*);
template void charge_tiles_cuda(Stream&, const std::complex<float>*, const std::complex<float>*, const TileTables&,
                                std::complex<float>*);

}  // namespace qstage::kernels::detail
