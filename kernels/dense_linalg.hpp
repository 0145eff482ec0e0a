#pragma once
// Dense complex128 building blocks on the host: a row-major matrix product through
// kernels::gemm_cpu on one thread (the same bits for any thread count) and an SVD through LAPACK.
// The CPU twins of kernels/charge_blocks.hpp and the host side of stages/mps use them.
#include <complex>
#include <cstdint>
#include <vector>

namespace qstage::kernels {

// C = A B (accumulate: C += A B), A m x k, B k x n, C m x n, all row-major and contiguous.
void matmul(const std::complex<double>* a, const std::complex<double>* b, std::complex<double>* c, std::int64_t m,
            std::int64_t k, std::int64_t n, bool accumulate = false);

// A = U diag(S) Vh with A m x n row-major, U m x r, Vh r x n (row-major), r = min(m, n), S descending.
struct Svd {
  std::int64_t rank = 0;
  std::vector<std::complex<double>> u, vh;
  std::vector<double> s;
};
// LAPACK's zgesdd (divide and conquer), and zgesvd when zgesdd does not converge. Runs one
// single-threaded LAPACK call, so callers may run several at once on OpenMP threads. Throws
// RuntimeFailure if both fail.
Svd svd(const std::complex<double>* a, std::int64_t m, std::int64_t n);

// Makes OpenBLAS single-threaded (once), as kernels::gemm_cpu does: its threaded kernels round
// differently with the thread count.
void single_threaded_blas();

}  // namespace qstage::kernels
