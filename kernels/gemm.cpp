#include "kernels/gemm.hpp"

#include <cblas.h>

#include <complex>
#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

double gemm_flops(const Gemm& g) {
  const double mnk = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  return h5::dtype_is_complex(g.dtype) ? 8 * mnk : 2 * mnk;
}

void gemm_cpu(const Gemm& g) {
  if (g.m == 0 || g.n == 0) return;
  const auto m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n), k = static_cast<blasint>(g.k);
  const auto lda = static_cast<blasint>(g.lda), ldb = static_cast<blasint>(g.ldb), ldc = static_cast<blasint>(g.ldc);
  switch (g.dtype) {
    case h5::DType::float32:
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, static_cast<const float*>(g.a), lda,
                  static_cast<const float*>(g.b), ldb, 0.0f, static_cast<float*>(g.c), ldc);
      return;
    case h5::DType::float64:
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, static_cast<const double*>(g.a), lda,
                  static_cast<const double*>(g.b), ldb, 0.0, static_cast<double*>(g.c), ldc);
      return;
    case h5::DType::complex64: {
      const std::complex<float> one(1, 0), zero(0, 0);
      cblas_cgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, &one, g.a, lda, g.b, ldb, &zero, g.c, ldc);
      return;
    }
    case h5::DType::complex128: {
      const std::complex<double> one(1, 0), zero(0, 0);
      cblas_zgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, &one, g.a, lda, g.b, ldb, &zero, g.c, ldc);
      return;
    }
    default: throw std::invalid_argument("gemm: unsupported dtype");
  }
}

void gemm(Stream& stream, const Gemm& args) {
  QSTAGE_DISPATCH(stream, gemm_cpu(args), detail::gemm_cuda(stream.native(), stream.blas_handle(), args));
}

}  // namespace qstage::kernels
