#pragma once
// Dense complex building blocks on the host: a row-major matrix product through
// kernels::gemm_cpu on one thread (the same bits for any thread count) and an SVD through LAPACK.
// The CPU twins of kernels/mps/charge_blocks.hpp and the host side of stages/mps use them. Templates
// on the element type T, instantiated for std::complex<double> (zgemm, zgesdd, zgesvd) and
// std::complex<float> (cgemm, cgesdd, cgesvd: mps.tebd's precision complex64).
#include <complex>
#include <cstdint>
#include <vector>

#include "kernels/linalg/gemm.hpp"  // OneBlasThread, single_threaded_blas

namespace qstage::kernels {

// C = A B (accumulate: C += A B), A m x k, B k x n, C m x n, all row-major and contiguous.
template <typename T>
void matmul(const T* a, const T* b, T* c, std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate = false);

// A = U diag(S) Vh with A m x n row-major, U m x r, Vh r x n (row-major), r = min(m, n), S descending
// (in T's real type).
template <typename T>
struct BasicSvd {
  std::int64_t rank = 0;
  std::vector<T> u, vh;
  std::vector<typename T::value_type> s;
};
using Svd = BasicSvd<std::complex<double>>;
// LAPACK's ?gesdd (divide and conquer), and ?gesvd when ?gesdd does not converge. Runs one
// single-threaded LAPACK call, so callers may run several at once on OpenMP threads. Throws
// RuntimeFailure if both fail.
template <typename T>
BasicSvd<T> svd(const T* a, std::int64_t m, std::int64_t n);

}  // namespace qstage::kernels
