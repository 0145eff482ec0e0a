#include "kernels/linalg/dense_linalg.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/linalg/gemm.hpp"

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
void cgesdd_(const char* jobz, const int* m, const int* n, std::complex<float>* a, const int* lda, float* s,
             std::complex<float>* u, const int* ldu, std::complex<float>* vt, const int* ldvt,
             std::complex<float>* work, const int* lwork, float* rwork, int* iwork, int* info, std::size_t);
void cgesvd_(const char* jobu, const char* jobvt, const int* m, const int* n, std::complex<float>* a,
             const int* lda, float* s, std::complex<float>* u, const int* ldu, std::complex<float>* vt,
             const int* ldvt, std::complex<float>* work, const int* lwork, float* rwork, int* info, std::size_t,
             std::size_t);
}

namespace qstage::kernels {

template <typename T>
void matmul(const T* a, const T* b, T* c, std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n, T{});
    return;
  }
  if (!accumulate) {
    const OneBlasThread one_thread;
    Gemm g;
    g.dtype = std::is_same_v<T, std::complex<float>> ? DType::complex64 : DType::complex128;
    g.m = m, g.n = n, g.k = k;
    g.a = a, g.lda = k, g.b = b, g.ldb = n, g.c = c, g.ldc = n;
    gemm_cpu(g);
    return;
  }
  std::vector<T> t(static_cast<std::size_t>(m * n));
  matmul(a, b, t.data(), m, k, n, false);
  for (std::size_t i = 0; i < t.size(); ++i) c[i] += t[i];
}
template void matmul(const std::complex<double>*, const std::complex<double>*, std::complex<double>*, std::int64_t,
                     std::int64_t, std::int64_t, bool);
template void matmul(const std::complex<float>*, const std::complex<float>*, std::complex<float>*, std::int64_t,
                     std::int64_t, std::int64_t, bool);

namespace {

// The LAPACK routines of each precision.
template <typename T>
struct Lapack;
template <>
struct Lapack<std::complex<double>> {
  static constexpr auto gesdd = zgesdd_;
  static constexpr auto gesvd = zgesvd_;
  static constexpr const char* prefix = "z";
};
template <>
struct Lapack<std::complex<float>> {
  static constexpr auto gesdd = cgesdd_;
  static constexpr auto gesvd = cgesvd_;
  static constexpr const char* prefix = "c";
};

// Slack after the arrays LAPACK reads (the copy of A and the work array): Debian 12's OpenBLAS
// (0.3.21) x86-64 ?gemv_n kernels, called by ?labrd inside ?gesdd, read past the end of their
// operands for some shapes (OpenMathLib/OpenBLAS#5000). Where the array ends at the end of a
// mapping (large blocks in a thread's malloc arena: the SVDs on OpenMP threads) that read is a
// segfault; elsewhere it reads a neighbour's bytes that do not enter the result.
std::size_t lapack_slack(std::int64_t m, std::int64_t n) { return static_cast<std::size_t>(4 * (m + n) + 64); }

// A workspace query's answer: single precision rounds sizes above 2^24, so round those up.
template <typename T>
int work_size(const T& query) {
  if constexpr (std::is_same_v<T, std::complex<float>>)
    return static_cast<int>(static_cast<double>(query.real()) * (1 + 1e-6)) + 1;
  else
    return static_cast<int>(query.real());
}

// LAPACK is column-major: the row-major m x n A is the column-major n x m M = A^T. With
// M = U1 S VT1, A = VT1^T S U1^T, and the memory of VT1 (r x m, column-major) is U (m x r,
// row-major) while that of U1 (n x r, column-major) is Vh (r x n, row-major): no copies.
template <typename T>
int gesdd(std::vector<T>& m_copy, std::int64_t m, std::int64_t n, BasicSvd<T>& out) {
  using R = typename T::value_type;
  const int rows = static_cast<int>(n), cols = static_cast<int>(m), r = static_cast<int>(std::min(m, n));
  const int lda = std::max(1, rows), ldu = std::max(1, rows), ldvt = std::max(1, r);
  int info = 0, lwork = -1;
  T query;
  const std::int64_t mn = r, mx = std::max(m, n);
  std::vector<R> rwork(static_cast<std::size_t>(std::max<std::int64_t>(1, mn * std::max(5 * mn + 7, 2 * mx + 2 * mn + 1))));
  std::vector<int> iwork(static_cast<std::size_t>(8 * mn));
  Lapack<T>::gesdd("S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt, &query,
          &lwork, rwork.data(), iwork.data(), &info, 1);
  if (info != 0) return info;
  lwork = work_size(query);
  std::vector<T> work(static_cast<std::size_t>(std::max(1, lwork)) + lapack_slack(m, n));
  Lapack<T>::gesdd("S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          work.data(), &lwork, rwork.data(), iwork.data(), &info, 1);
  return info;
}

template <typename T>
int gesvd(std::vector<T>& m_copy, std::int64_t m, std::int64_t n, BasicSvd<T>& out) {
  using R = typename T::value_type;
  const int rows = static_cast<int>(n), cols = static_cast<int>(m), r = static_cast<int>(std::min(m, n));
  const int lda = std::max(1, rows), ldu = std::max(1, rows), ldvt = std::max(1, r);
  int info = 0, lwork = -1;
  T query;
  std::vector<R> rwork(static_cast<std::size_t>(std::max(1, 5 * r)));
  Lapack<T>::gesvd("S", "S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          &query, &lwork, rwork.data(), &info, 1, 1);
  if (info != 0) return info;
  lwork = work_size(query);
  std::vector<T> work(static_cast<std::size_t>(std::max(1, lwork)) + lapack_slack(m, n));
  Lapack<T>::gesvd("S", "S", &rows, &cols, m_copy.data(), &lda, out.s.data(), out.vh.data(), &ldu, out.u.data(), &ldvt,
          work.data(), &lwork, rwork.data(), &info, 1, 1);
  return info;
}

}  // namespace

template <typename T>
BasicSvd<T> svd(const T* a, std::int64_t m, std::int64_t n) {
  single_threaded_blas();
  BasicSvd<T> out;
  out.rank = std::min(m, n);
  if (out.rank == 0) return out;
  if (m > (1ll << 30) / std::max<std::int64_t>(n, 1))
    throw RuntimeFailure(fmt::format("svd: an SVD of {} x {} is beyond LAPACK's 32-bit sizes", m, n));
  // (capacity with the slack: LAPACK works in U and Vh too)
  out.u.reserve(static_cast<std::size_t>(m * out.rank) + lapack_slack(m, n));
  out.vh.reserve(static_cast<std::size_t>(out.rank * n) + lapack_slack(m, n));
  auto reset = [&] {
    out.u.assign(static_cast<std::size_t>(m * out.rank), T{});
    out.vh.assign(static_cast<std::size_t>(out.rank * n), T{});
    out.s.assign(static_cast<std::size_t>(out.rank), 0);
  };
  reset();
  const OneBlasThread one_thread;
  std::vector<T> copy(static_cast<std::size_t>(m * n) + lapack_slack(m, n));
  std::copy(a, a + m * n, copy.begin());
  int info = gesdd(copy, m, n, out);
  if (info == 0) return out;
  // ?gesdd failed to converge (info > 0): the slower QR-iteration SVD is more robust.
  reset();
  std::copy(a, a + m * n, copy.begin());
  const int info2 = gesvd(copy, m, n, out);
  if (info2 != 0)
    throw RuntimeFailure(
        fmt::format("svd: the SVD of a {} x {} matrix failed ({}gesdd info {}, {}gesvd info {})", m, n, Lapack<T>::prefix, info,
                    Lapack<T>::prefix, info2));
  return out;
}
template BasicSvd<std::complex<double>> svd(const std::complex<double>*, std::int64_t, std::int64_t);
template BasicSvd<std::complex<float>> svd(const std::complex<float>*, std::int64_t, std::int64_t);

}  // namespace qstage::kernels
