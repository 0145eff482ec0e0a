#include "kernels/dense_linalg.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/error.hpp"
#include "kernels/gemm.hpp"

// LAPACK from the linked OpenBLAS (there is no lapacke.h to include). The trailing size_t are
// gfortran's hidden lengths of the character arguments.
extern "C" {
void zgesdd_(const char* jobz, const int* m, const int* n, std::complex<double>* a, const int* lda, double* s,
             std::complex<double>* u, const int* ldu, std::complex<double>* vt, const int* ldvt,
             std::complex<double>* work, const int* lwork, double* rwork, int* iwork, int* info, std::size_t);
void zgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, std::complex<double>* a,
             const int* lda, double* s, std::complex<double>* u, const int* ldu, std::complex<double>* vt,
             const int* ldvt, std::complex<double>* work, const int* lwork, double* rwork, int* info, std::size_t,
             std::size_t);
}

namespace qstage::kernels {

using cplx = std::complex<double>;

namespace {

// OpenMP builds of OpenBLAS follow omp_get_max_threads() on every call (openblas_set_num_threads
// does not stick), and their threaded routines round differently with the count: while one of
// these lives, this thread's BLAS and LAPACK calls run on one thread. The setting is per task, so
// SVDs running at the same time on other OpenMP threads are unaffected.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
};

}  // namespace

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int threads = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(threads);  // the OpenMP build's call also sets OpenMP's count: put ours back
  });
}

void matmul(const cplx* a, const cplx* b, cplx* c, std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n, cplx{});
    return;
  }
  if (!accumulate) {
    const OneThread one_thread;
    Gemm g;
    g.dtype = DType::complex128;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.lda = k, g.b = b, g.ldb = n, g.c = c, g.ldc = n;
    gemm_cpu(g);
    return;
  }
  std::vector<cplx> t(static_cast<std::size_t>(m * n));
  matmul(a, b, t.data(), m, k, n, false);
  for (std::size_t i = 0; i < t.size(); ++i) c[i] += t[i];
}

namespace {

// LAPACK is column-major: the row-major m x n A is the column-major n x m M = A^T. With
// M = U1 S VT1, A = VT1^T S U1^T, and the memory of VT1 (r x m, column-major) is U (m x r,
// row-major) while that of U1 (n x r, column-major) is Vh (r x n, row-major): no copies.
int gesdd(std::vector<cplx>& m_copy, std::int64_t m, std::int64_t n, Svd& out) {
  const int rows = static_cast<int>(n), cols = static_cast<int>(m), r = static_cast<int>(std::min(m, n));
  const int lda = std::max(1, rows), ldu = std::max(1, rows), ldvt = std::max(1, r);
  int info = 0, lwork = -1;
  cplx query;
  const std::int64_t mn = r, mx = std::max(m, n);
  std::vector<double> rwork(static_cast<std::size_t>(std::max<std::int64_t>(1, mn * std::max(5 * mn + 7, 2 * mx + 2 * mn + 1))));
  std::vector<int> iwork(static_cast<std::size_t>(8 * mn));
  zgesdd_("S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt, &query,
          &lwork, rwork.data(), iwork.data(), &info, 1);
  if (info != 0) return info;
  lwork = static_cast<int>(query.real());
  std::vector<cplx> work(static_cast<std::size_t>(std::max(1, lwork)));
  zgesdd_("S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          work.data(), &lwork, rwork.data(), iwork.data(), &info, 1);
  return info;
}

int gesvd(std::vector<cplx>& m_copy, std::int64_t m, std::int64_t n, Svd& out) {
  const int rows = static_cast<int>(n), cols = static_cast<int>(m), r = static_cast<int>(std::min(m, n));
  const int lda = std::max(1, rows), ldu = std::max(1, rows), ldvt = std::max(1, r);
  int info = 0, lwork = -1;
  cplx query;
  std::vector<double> rwork(static_cast<std::size_t>(std::max(1, 5 * r)));
  zgesvd_("S", "S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          &query, &lwork, rwork.data(), &info, 1, 1);
  if (info != 0) return info;
  lwork = static_cast<int>(query.real());
  std::vector<cplx> work(static_cast<std::size_t>(std::max(1, lwork)));
  zgesvd_("S", "S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          work.data(), &lwork, rwork.data(), &info, 1, 1);
  return info;
}

}  // namespace

Svd svd(const cplx* a, std::int64_t m, std::int64_t n) {
  single_threaded_blas();
  Svd out;
  out.rank = std::min(m, n);
  if (out.rank == 0) return out;
  if (m > (1ll << 30) / std::max<std::int64_t>(n, 1))
    throw RuntimeFailure(fmt::format("svd: an SVD of {} x {} is beyond LAPACK's 32-bit sizes", m, n));
  auto reset = [&] {
    out.u.assign(static_cast<std::size_t>(m * out.rank), cplx{});
    out.vh.assign(static_cast<std::size_t>(out.rank * n), cplx{});
    out.s.assign(static_cast<std::size_t>(out.rank), 0.0);
  };
  reset();
  const OneThread one_thread;
  std::vector<cplx> copy(a, a + m * n);
  int info = gesdd(copy, m, n, out);
  if (info == 0) return out;
  // zgesdd failed to converge (info > 0): the slower QR-iteration SVD is more robust.
  reset();
  copy.assign(a, a + m * n);
  const int info2 = gesvd(copy, m, n, out);
  if (info2 != 0)
    throw RuntimeFailure(
        fmt::format("svd: the SVD of a {} x {} matrix failed (zgesdd info {}, zgesvd info {})", m, n, info, info2));
  return out;
}

}  // namespace qstage::kernels
