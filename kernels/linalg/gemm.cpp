#include "kernels/linalg/gemm.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <mutex>
#include <stdexcept>

#include "core/parallel.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

OneBlasThread::OneBlasThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
OneBlasThread::~OneBlasThread() { omp_set_num_threads(saved_); }

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int threads = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(threads);  // the OpenMP build's call also sets OpenMP's count: put ours back
  });
}

double gemm_flops(const Gemm& g) {
  const double mnk = static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  return dtype_is_complex(g.dtype) ? 8 * mnk : 2 * mnk;
}

std::int64_t deterministic_row_block(std::int64_t tile_rows, std::int64_t target) {
  for (std::int64_t b = std::min(target, tile_rows); b >= std::max<std::int64_t>(1, target / 8); --b)
    if (tile_rows % b == 0) return b;
  return tile_rows;
}

namespace {

// Tiny products (tensor-network steps with 2 x 2 x 4 matrices in batches of millions) cost less
// as a plain loop than as a BLAS call.
constexpr std::int64_t kTinyGemm = 512;  // m * n * k

template <typename T>
void gemm_tiny(const Gemm& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t j = 0; j < g.n; ++j) {
      T sum{};
      for (std::int64_t p = 0; p < g.k; ++p) sum += a[i * g.lda + p] * (g.b_transposed ? b[j * g.ldb + p] : b[p * g.ldb + j]);
      c[i * g.ldc + j] = g.accumulate ? c[i * g.ldc + j] + sum : sum;
    }
}

void gemm_cpu_call(const Gemm& g) {
  if (g.m * g.n * g.k <= kTinyGemm) {
    switch (g.dtype) {
      case DType::float32: return gemm_tiny<float>(g);
      case DType::float64: return gemm_tiny<double>(g);
      case DType::complex64: return gemm_tiny<std::complex<float>>(g);
      case DType::complex128: return gemm_tiny<std::complex<double>>(g);
      default: throw std::invalid_argument("gemm: unsupported dtype");
    }
  }
  const OneBlasThread one_thread;  // (outside a parallel region OpenBLAS would thread the call)
  const auto m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n), k = static_cast<blasint>(g.k);
  const auto tb = g.b_transposed ? CblasTrans : CblasNoTrans;
  const auto lda = static_cast<blasint>(g.lda), ldb = static_cast<blasint>(g.ldb), ldc = static_cast<blasint>(g.ldc);
  const float beta_f = g.accumulate ? 1.0f : 0.0f;
  const double beta_d = g.accumulate ? 1.0 : 0.0;
  switch (g.dtype) {
    case DType::float32:
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0f, static_cast<const float*>(g.a), lda,
                  static_cast<const float*>(g.b), ldb, beta_f, static_cast<float*>(g.c), ldc);
      return;
    case DType::float64:
      cblas_dgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, 1.0, static_cast<const double*>(g.a), lda,
                  static_cast<const double*>(g.b), ldb, beta_d, static_cast<double*>(g.c), ldc);
      return;
    case DType::complex64: {
      const std::complex<float> one(1, 0), beta(beta_f, 0);
      cblas_cgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, &one, g.a, lda, g.b, ldb, &beta, g.c, ldc);
      return;
    }
    case DType::complex128: {
      const std::complex<double> one(1, 0), beta(beta_d, 0);
      cblas_zgemm(CblasRowMajor, CblasNoTrans, tb, m, n, k, &one, g.a, lda, g.b, ldb, &beta, g.c, ldc);
      return;
    }
    default: throw std::invalid_argument("gemm: unsupported dtype");
  }
}

}  // namespace

void gemm_cpu(const Gemm& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  // OpenBLAS runs single-threaded: its threaded kernels round differently with the thread count.
  // qstage spreads fixed blocks over OpenMP threads instead, so the bits never depend on it.
  single_threaded_blas();
  constexpr std::int64_t kDefaultRows = 256, kCols = 1024;
  const std::size_t element = dtype_size(g.dtype);
  // Below about 2^20 multiply-adds a parallel region costs more (thread wake-ups) than it saves.
  constexpr std::int64_t kParallelWork = std::int64_t{1} << 20;
  if (g.batch > 1) {
    // One single-threaded call per batch entry, spread over the threads.
    FirstFailure failure;  // (gemm_cpu_call refuses a dtype it does not know)
#pragma omp parallel for schedule(dynamic) if (g.batch * g.m * g.n * g.k > kParallelWork)
    for (std::int64_t i = 0; i < g.batch; ++i)
      failure.run([&] {
        Gemm one = g;
        one.batch = 1;
        one.a = static_cast<const char*>(g.a) + static_cast<std::size_t>(i * g.stride_a) * element;
        one.b = static_cast<const char*>(g.b) + static_cast<std::size_t>(i * g.stride_b) * element;
        one.c = static_cast<char*>(g.c) + static_cast<std::size_t>(i * g.stride_c) * element;
        gemm_cpu_call(one);
      });
    failure.rethrow();
    return;
  }
  const std::int64_t rb = g.row_block > 0 ? g.row_block : kDefaultRows;
  const std::int64_t row_blocks = (g.m + rb - 1) / rb, col_blocks = (g.n + kCols - 1) / kCols;
  auto block = [&](std::int64_t r, std::int64_t c) {
    Gemm part = g;
    part.m = std::min(rb, g.m - r * rb);
    part.n = std::min(kCols, g.n - c * kCols);
    part.a = static_cast<const char*>(g.a) + static_cast<std::size_t>(r * rb * g.lda) * element;
    // A column block of C is a row block of a transposed B.
    part.b = static_cast<const char*>(g.b) + static_cast<std::size_t>(g.b_transposed ? c * kCols * g.ldb : c * kCols) * element;
    part.c = static_cast<char*>(g.c) + static_cast<std::size_t>(r * rb * g.ldc + c * kCols) * element;
    gemm_cpu_call(part);
  };
  // The same blocks in the same calls either way (the bits do not change); without threads to
  // spread them over (one, or a nested region that would run on one) no OpenMP region is opened:
  // the sweeps' and the tiles' many small products made those regions' setup a large share of
  // their time.
  const bool spread = row_blocks * col_blocks > 1 && g.m * g.n * g.k > kParallelWork && omp_get_max_threads() > 1 &&
                      omp_get_active_level() < omp_get_max_active_levels();
  if (!spread) {
    for (std::int64_t r = 0; r < row_blocks; ++r)
      for (std::int64_t c = 0; c < col_blocks; ++c) block(r, c);
    return;
  }
  FirstFailure failure;
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (std::int64_t r = 0; r < row_blocks; ++r)
    for (std::int64_t c = 0; c < col_blocks; ++c) failure.run([&] { block(r, c); });
  failure.rethrow();
}

std::string_view compute_name(Compute c) {
  switch (c) {
    case Compute::full: return "full";
    case Compute::tf32: return "tf32";
    case Compute::tf32x3: return "3xtf32";
    case Compute::bf16: return "bf16";
  }
  return "?";
}

std::optional<Compute> parse_compute(std::string_view name) {
  for (Compute c : {Compute::full, Compute::tf32, Compute::tf32x3, Compute::bf16})
    if (compute_name(c) == name) return c;
  return std::nullopt;
}

double compute_unit_roundoff(Compute c) {
  switch (c) {
    case Compute::full: return 0x1p-24;
    case Compute::tf32: return 0x1p-11;
    // The split itself leaves 2^-22, but the tensor cores' accumulation sets the error: one call
    // over 8192 real terms gave 1.9e-5 on an H100; big · big in pieces of 1024 real terms gives
    // 2.4e-6 on an H200 for k = 512 ... 4096 (FP32: 0.6-1.6e-6; reduced_gemm.cpp).
    // 2^-17 keeps the model within 2x above what was measured.
    case Compute::tf32x3: return 0x1p-17;
    case Compute::bf16: return 0x1p-8;
  }
  return 1;
}

double predicted_relative_error(Compute c, int steps) {
  return 0.6 * compute_unit_roundoff(c) * std::sqrt(static_cast<double>(std::max(steps, 1)));
}

void gemm(Stream& stream, const Gemm& args) {
  if (stream.kind() == BackendKind::cuda && !stream.blas_handle())
    throw std::logic_error("gemm on a stream made without BLAS: the pass must set PassSpec::uses_blas");
  const bool single = args.dtype == DType::float32 || args.dtype == DType::complex64;
  if (single && args.compute != Compute::full) return detail::gemm_reduced(stream, args);
  detail::gemm_direct(stream, args, detail::Operands::full);
}

namespace detail {
void gemm_direct(Stream& stream, const Gemm& args, Operands operands) {
  // (On cpu the staged operands already hold the rounded values: OpenBLAS multiplies them.)
  QSTAGE_DISPATCH(stream, gemm_cpu(args), gemm_cuda(stream.native(), stream.blas_handle(), args, operands));
}
}  // namespace detail

}  // namespace qstage::kernels
