#pragma once
// Dense complex128 building blocks of the MPS update on the host: a row-major matrix product
// through kernels::gemm_cpu (deterministic for any thread count) and an SVD through LAPACK.
#include <cstdint>
#include <vector>

#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

// C = A B (accumulate: C += A B), A m x k, B k x n, C m x n, all row-major and contiguous.
void matmul(const cplx* a, const cplx* b, cplx* c, std::int64_t m, std::int64_t k, std::int64_t n,
            bool accumulate = false);

// A = U diag(S) Vh with A m x n row-major, U m x r, Vh r x n (row-major), r = min(m, n), S descending.
struct Svd {
  std::int64_t rank = 0;
  std::vector<cplx> u, vh;
  std::vector<double> s;
};
// LAPACK's zgesdd (divide and conquer), and zgesvd when zgesdd does not converge. Runs one
// single-threaded LAPACK call, so callers may run several at once on OpenMP threads. Throws
// RuntimeFailure if both fail.
Svd svd(const cplx* a, std::int64_t m, std::int64_t n);

// Makes OpenBLAS single-threaded (once), as kernels::gemm_cpu does: its threaded kernels round
// differently with the thread count.
void single_threaded_blas();

}  // namespace qstage::stages::mps
