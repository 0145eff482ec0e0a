#pragma once
// The charge-block operations of a U(1)-symmetric two-site update (stages/mps/tebd.cpp; seed 001
// eq. 16), declared once: charge_blocks.cpp is the CPU twin (OpenBLAS and LAPACK, one thread a
// call, so the bits do not depend on the thread count), charge_blocks.cu the CUDA version
// (cuBLAS and cuSOLVER). Matrices are row-major and sit at element offsets into flat buffers the
// caller owns: device memory on cuda, host memory on cpu. Each operation is a template on the
// element type T, instantiated (in both files) for complex128 (std::complex<double>: zgemm,
// zgesdd, cublasZgemm, cusolverDnZgesvdj) and complex64 (std::complex<float>: cgemm, cgesdd,
// cublasCgemm, cusolverDnCgesvdj), mps.tebd's precision parameter; Real<T> is T's real type.
#include <algorithm>
#include <complex>
#include <cstdint>
#include <functional>
#include <future>
#include <vector>

#include "backend/backend.hpp"

namespace qstage::kernels {

using cplx128 = std::complex<double>;
using cplx64 = std::complex<float>;
template <typename T>
using Real = typename T::value_type;

// P = X Y for sector blocks X (m x k, at x) and Y (k x n, at y) of `sites`, added into the
// destinations first .. first + count - 1: C[offset + r ld + c] += u P[r, c].
struct ChargeProduct {
  std::int64_t x = 0, y = 0, m = 0, k = 0, n = 0;
  std::int64_t first = 0, count = 0;
};
struct ChargeScatter {
  std::int64_t offset = 0, ld = 0;
  cplx128 u{};  // (complex64: rounded to it)
};

// C (c_size elements) = the sum of every product's scatters, products in order. `scratch` holds
// the largest product (m n elements).
template <typename T>
void charge_products(Stream& stream, const T* sites, const std::vector<ChargeProduct>& products,
                     const std::vector<ChargeScatter>& scatters, T* c, std::int64_t c_size, T* scratch);

// out = diag(scale) A for the matrices A (rows x cols at offset of `a` and of `out`) whose row r
// is scaled by scale[scale_offset + r] (complex64: the scale rounded to float).
struct ScaledRows {
  std::int64_t offset = 0, rows = 0, cols = 0, scale_offset = 0;
};
template <typename T>
void scale_rows(Stream& stream, const T* a, const double* scale, const std::vector<ScaledRows>& matrices, T* out);

// A = U diag(S) Vh per problem: A (m x n at a + offset, overwritten), S (r = min(m, n) values,
// descending, at s + s_offset) and Vh (r x n at vh + vh_offset); U is not formed.
struct SvdProblem {
  std::int64_t m = 0, n = 0, offset = 0, s_offset = 0, vh_offset = 0;
  bool host = false;  // on the host whatever the routing (a caller whose device budget cannot hold its GPU workspace)
};
// How the problems were solved: on the host (LAPACK; on cuda the small problems, where a GPU
// solver's fixed cost is larger), by cuSOLVER's one-sided Jacobi (gesvdj), by its polar-
// decomposition SVD (gesvdp: the largest problems), and how many of the GPU's the host then
// solved (Jacobi did not converge, or gesvdp failed). polar_shift: the largest perturbation
// gesvdp added to a rank-deficient problem (its h_err_sigma, absolute), which shifts its singular
// values by about that much.
struct SvdReport {
  std::int64_t host = 0, jacobi = 0, polar = 0, host_fallbacks = 0;
  double polar_shift = 0;
  SvdReport& operator+=(const SvdReport& o) {
    host += o.host, jacobi += o.jacobi, polar += o.polar, host_fallbacks += o.host_fallbacks;
    polar_shift = std::max(polar_shift, o.polar_shift);
    return *this;
  }
};
// On cuda, problems whose m n min(m, n) is below gpu_from^3 are solved on the host (LAPACK, while
// the GPU works on the rest): a GPU SVD's fixed cost is larger than small problems' (measured:
// docs/benchmarks.md, qstage_bench svd, and mps.tebd at chi 1024 and 2048, where 320 did best
// with one host thread per bond). Callers pass their setting; this is the default.
inline constexpr std::int64_t kGpuSvdFrom = 320;
// Of the GPU's problems, those with min(m, n) >= polar_from go to gesvdp, the rest to Jacobi.
// Measured on an H200 (qstage_bench svd, docs/benchmarks.md): gesvdp is 3-7x faster than Jacobi
// from 256 x 256 to 4096 x 4096 and exact to 1e-15 of the largest value on full-rank blocks, but
// on rank-deficient ones its perturbation shifts the values by up to ~2e-10 of the largest
// (Jacobi: 6e-13); from 512 its speed is worth that, below it Jacobi's fixed cost is small.
// complex64 uses Jacobi at every size (that shift grows as the precision's square root).
inline constexpr std::int64_t kGpuPolarFrom = 512;
// Which path solves which problem on cuda (the CPU backend solves all on the host).
struct SvdRouting {
  std::int64_t gpu_from = kGpuSvdFrom;      // 0: every problem on the GPU
  std::int64_t polar_from = kGpuPolarFrom;  // a value above every size: Jacobi only
};
// Device workspace (bytes) batched_svd<T> needs for `problems` on `stream` (0 on cpu).
template <typename T = cplx128>
std::size_t svd_workspace_bytes(Stream& stream, const std::vector<SvdProblem>& problems, SvdRouting routing = {});
// Throws RuntimeFailure if a problem fails on every path (LAPACK's ?gesdd, then ?gesvd, last).
// S is in T's real type.
template <typename T>
SvdReport batched_svd(Stream& stream, T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh,
                      void* workspace, std::size_t workspace_bytes, SvdRouting routing = {});

// out = A Vh[:k]^dagger / divisor: A (m x n at a_offset), the first k rows of Vh (at vh_offset,
// rows of n), out (m x k at out_offset).
struct AdjointProduct {
  std::int64_t a_offset = 0, m = 0, n = 0, vh_offset = 0, k = 0, out_offset = 0;
  double divisor = 1;
};
template <typename T>
void times_adjoint(Stream& stream, const T* a, const T* vh, const std::vector<AdjointProduct>& products, T* out);

namespace detail {
// LAPACK on host copies: the CPU twin's path, which the cuda version uses for small problems and
// as its last fallback.
template <typename T>
void svd_on_host(T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh);
// Runs `work` on a thread of its own with one OpenMP thread fewer than the caller has (at least
// one; the caller keeps driving the GPU), so that the host's share of the SVDs runs beside the
// GPU's; the future rethrows what `work` threw.
std::future<void> run_beside(std::function<void()> work);
template <typename T>
void charge_products_cuda(Stream& stream, const T* sites, const std::vector<ChargeProduct>& products,
                          const std::vector<ChargeScatter>& scatters, T* c, std::int64_t c_size, T* scratch);
template <typename T>
void scale_rows_cuda(Stream& stream, const T* a, const double* scale, const std::vector<ScaledRows>& matrices, T* out);
template <typename T>
std::size_t svd_workspace_bytes_cuda(Stream& stream, const std::vector<SvdProblem>& problems, SvdRouting routing);
template <typename T>
SvdReport batched_svd_cuda(Stream& stream, T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh,
                           void* workspace, std::size_t workspace_bytes, SvdRouting routing);
template <typename T>
void times_adjoint_cuda(Stream& stream, const T* a, const T* vh, const std::vector<AdjointProduct>& products, T* out);
}  // namespace detail

}  // namespace qstage::kernels
