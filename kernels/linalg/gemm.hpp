#pragma once
// Dense matrix products on either backend: C = A · B with row-major operands (the layout HDF5
// rows stream in), through cuBLAS (cublasGemmEx) or OpenBLAS (cblas_?gemm).
// Flop convention (used in every rate qstage reports): 2 m n k real flops for real types and
// 8 m n k for complex types (a complex multiply-add is 8 real flops).
#include <cstdint>
#include <optional>
#include <string_view>

#include "backend/backend.hpp"
#include "core/dtype.hpp"

namespace qstage::kernels {

// The arithmetic of a single-precision product (float32, complex64; double types always run in
// full precision). The reduced modes use tensor cores with FP32 accumulation:
//   full    the dtype's own arithmetic (cuBLAS sgemm/cgemm, OpenBLAS)
//   tf32    operands rounded to TF32 (10-bit mantissa): relative error about 2^-11 per product
//   tf32x3  each operand split into a TF32 part and a TF32 remainder, three TF32 products
//           (big·small + small·big + big·big): FP32-level on the CPU twin; on a GPU the tensor
//           cores' accumulation sets the error, so big·big runs in pieces of 1024 real terms
//           (reduced_gemm.cpp): 2.4e-6 relative on an H200, FP32's level
//   bf16    operands rounded to BF16 (7-bit mantissa, FP32's exponent range): about 2^-8
// A complex product in tf32 or bf16 runs as one real product (the "4M" form), in 3xtf32 as three
// (the "3M" form, a quarter fewer multiplications; see reduced_gemm.hpp). The CPU has no tensor cores: it rounds the
// operands the same way and multiplies in FP32, so its results carry the same input rounding (its accumulation order
// differs). FP16 is not offered: tensor-network intermediates fall below its range (2^-24).
enum class Compute : std::uint8_t { full, tf32, tf32x3, bf16 };
std::string_view compute_name(Compute c);  // "full", "tf32", "3xtf32", "bf16"
std::optional<Compute> parse_compute(std::string_view name);
// Unit roundoff of a mode's operand rounding (full: FP32's 2^-24).
double compute_unit_roundoff(Compute c);
// The error model of the reduced modes: a contraction whose `steps` compute-bound products ran
// in mode c has a relative 2-norm error of about 0.6 u sqrt(steps) from the operands' rounding
// (u = compute_unit_roundoff; 0.53-0.56 u per product measured on random complex operands,
// tests/python/test_compute_modes.py, and on an H100 for tf32 and bf16), on top of FP32's own.
// For tf32x3, u is what an H200 gave (docs/benchmarks.md), above its CPU twin's FP32 level.
double predicted_relative_error(Compute c, int steps);

struct Gemm {
  DType dtype = DType::complex64;  // float32, float64, complex64, complex128
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // m × k, row-major, leading dimension lda (>= k)
  std::int64_t lda = 0;
  const void* b = nullptr;  // k × n, row-major, leading dimension ldb (>= n); b_transposed: n × k (ldb >= k)
  std::int64_t ldb = 0;
  void* c = nullptr;        // m × n, row-major, leading dimension ldc (>= n)
  std::int64_t ldc = 0;
  Compute compute = Compute::full;  // single precision only (see Compute)
  // cpu: C is computed in blocks of row_block rows (counted from row 0; 0: 256) by 1024 columns,
  // one single-threaded OpenBLAS call per block, blocks spread over OpenMP threads. Each row's
  // arithmetic then depends neither on the thread count (OpenBLAS's own threading changes the
  // rounding) nor, when batches start on block boundaries, on the batch size or rank count.
  std::int64_t row_block = 0;
  bool b_transposed = false;  // B is stored n × k and used transposed: C = A · Bᵀ
  // Strided batch: `batch` products, the i-th at a + i*stride_a, b + i*stride_b, c + i*stride_c
  // (elements).
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  bool accumulate = false;  // C += A · B instead of C = A · B
  // Reduced modes stage rounded operands here (device memory on cuda), tiling the product to
  // fit; at least reduced_gemm_min_workspace() bytes. Unused in full precision.
  void* workspace = nullptr;
  std::int64_t workspace_bytes = 0;
};

// A row block near `target` rows that divides `tile_rows` (so blocks never straddle tiles), or
// tile_rows itself when it has no divisor between target/8 and target.
std::int64_t deterministic_row_block(std::int64_t tile_rows, std::int64_t target = 512);

void gemm(Stream& stream, const Gemm& args);
void gemm_cpu(const Gemm& args);

// OpenMP builds of OpenBLAS follow omp_get_max_threads() on every call (openblas_set_num_threads
// does not stick), and their threaded routines round differently with the count. While one of
// these lives, this thread's BLAS and LAPACK calls run on one thread. The setting is per task, so
// calls running at the same time on other OpenMP threads are unaffected.
class OneBlasThread {
 public:
  OneBlasThread();
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int saved_;
};

// Makes pthread builds of OpenBLAS single-threaded (once); OpenMP builds need OneBlasThread around
// any call made outside a parallel region.
void single_threaded_blas();
double gemm_flops(const Gemm& args);

namespace detail {
// How the backend's own product treats a single-precision Gemm: as given (full), on TF32 tensor
// cores, or with A and B stored as BF16 (on cpu: as floats holding BF16 values). The reduced
// modes (reduced_gemm.cpp) call it with operands they staged.
enum class Operands : std::uint8_t { full, tf32_cores, bf16 };
void gemm_direct(Stream& stream, const Gemm& args, Operands operands);
void gemm_cuda(void* cuda_stream, void* cublas_handle, const Gemm& args, Operands operands);
void gemm_reduced(Stream& stream, const Gemm& args);
}

}  // namespace qstage::kernels
