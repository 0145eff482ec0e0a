#include "kernels/mps/charge_blocks.hpp"

#include <omp.h>

#include <algorithm>

#include "core/parallel.hpp"
#include "kernels/linalg/dense_linalg.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

template <typename T>
void charge_products(Stream& stream, const T* sites, const std::vector<ChargeProduct>& products,
                     const std::vector<ChargeScatter>& scatters, T* c, std::int64_t c_size, T* scratch) {
  QSTAGE_DISPATCH(
      stream,
      std::fill(c, c + c_size, T{});
      for (const ChargeProduct& p : products) {
        matmul(sites + p.x, sites + p.y, scratch, p.m, p.k, p.n);
        for (std::int64_t s = p.first; s < p.first + p.count; ++s) {
          const ChargeScatter& d = scatters[s];
          const T u = static_cast<T>(d.u);
          for (std::int64_t r = 0; r < p.m; ++r)
            for (std::int64_t col = 0; col < p.n; ++col) c[d.offset + r * d.ld + col] += u * scratch[r * p.n + col];
        }
      },
      detail::charge_products_cuda(stream, sites, products, scatters, c, c_size, scratch));
}

template <typename T>
void scale_rows(Stream& stream, const T* a, const double* scale, const std::vector<ScaledRows>& matrices, T* out) {
  QSTAGE_DISPATCH(
      stream,
      for (const ScaledRows& x : matrices) {
        for (std::int64_t r = 0; r < x.rows; ++r)
          for (std::int64_t col = 0; col < x.cols; ++col) {
            const std::int64_t e = x.offset + r * x.cols + col;
            out[e] = a[e] * static_cast<Real<T>>(scale[x.scale_offset + r]);
          }
      },
      detail::scale_rows_cuda(stream, a, scale, matrices, out));
}

namespace detail {

// Each problem on one single-threaded LAPACK call, problems spread over OpenMP threads when
// the work is worth waking them (on a busy machine small SVDs cost far less than that).
template <typename T>
void svd_on_host(T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh) {
  single_threaded_blas();
  double work = 0;
  for (const auto& p : problems) work += static_cast<double>(p.m) * p.n * std::min(p.m, p.n);
  const auto count = static_cast<std::int64_t>(problems.size());
  FirstFailure failure;  // (LAPACK fails on a matrix with NaN or inf entries)
#pragma omp parallel for schedule(dynamic) if (count > 1 && work > 2e5)
  for (std::int64_t i = 0; i < count; ++i)
    failure.run([&] {
      const SvdProblem& p = problems[i];
      const BasicSvd<T> f = svd(a + p.offset, p.m, p.n);
      std::copy(f.s.begin(), f.s.end(), s + p.s_offset);
      std::copy(f.vh.begin(), f.vh.end(), vh + p.vh_offset);
    });
  failure.rethrow();
}

std::future<void> run_beside(std::function<void()> work) {
  const int threads = std::max(1, omp_get_max_threads() - 1);
  return std::async(std::launch::async, [threads, work = std::move(work)] {
    omp_set_num_threads(threads);
    work();
  });
}

}  // namespace detail

template <typename T>
std::size_t svd_workspace_bytes(Stream& stream, const std::vector<SvdProblem>& problems, SvdRouting routing) {
  std::size_t bytes = 0;
  QSTAGE_DISPATCH(stream, bytes = 0, bytes = detail::svd_workspace_bytes_cuda<T>(stream, problems, routing));
  return bytes;
}

template <typename T>
SvdReport batched_svd(Stream& stream, T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh,
                      void* workspace, std::size_t workspace_bytes, SvdRouting routing) {
  SvdReport report;
  QSTAGE_DISPATCH(
      stream,
      {
        detail::svd_on_host(a, problems, s, vh);
        report.host = static_cast<std::int64_t>(problems.size());
      },
      report = detail::batched_svd_cuda(stream, a, problems, s, vh, workspace, workspace_bytes, routing));
  return report;
}

template <typename T>
void times_adjoint(Stream& stream, const T* a, const T* vh, const std::vector<AdjointProduct>& products, T* out) {
  QSTAGE_DISPATCH(
      stream,
      for (const AdjointProduct& p : products) {
        // (conj(Vh[q, c]) / divisor laid out n x k, then one product: the bits of the code this replaced)
        std::vector<T> yd(static_cast<std::size_t>(p.n * p.k));
        const auto divisor = static_cast<Real<T>>(p.divisor);
        for (std::int64_t q = 0; q < p.k; ++q)
          for (std::int64_t col = 0; col < p.n; ++col)
            yd[col * p.k + q] = std::conj(vh[p.vh_offset + q * p.n + col]) / divisor;
        matmul(a + p.a_offset, yd.data(), out + p.out_offset, p.m, p.n, p.k);
      },
      detail::times_adjoint_cuda(stream, a, vh, products, out));
}

// The two precisions (mps.tebd's precision parameter).
#define QSTAGE_CHARGE_BLOCKS(T)                                                                                       \
  template void charge_products(Stream&, const T*, const std::vector<ChargeProduct>&,                                 \
                                const std::vector<ChargeScatter>&, T*, std::int64_t, T*);                             \
  template void scale_rows(Stream&, const T*, const double*, const std::vector<ScaledRows>&, T*);                     \
  template void detail::svd_on_host(T*, const std::vector<SvdProblem>&, Real<T>*, T*);                                \
  template std::size_t svd_workspace_bytes<T>(Stream&, const std::vector<SvdProblem>&, SvdRouting);                   \
  template SvdReport batched_svd(Stream&, T*, const std::vector<SvdProblem>&, Real<T>*, T*, void*, std::size_t,       \
                                 SvdRouting);                                                                         \
  template void times_adjoint(Stream&, const T*, const T*, const std::vector<AdjointProduct>&, T*);
QSTAGE_CHARGE_BLOCKS(cplx128)
QSTAGE_CHARGE_BLOCKS(cplx64)
#undef QSTAGE_CHARGE_BLOCKS

}  // namespace qstage::kernels
