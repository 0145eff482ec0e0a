#pragma once
// Dense matrix products on either backend: C = A · B with row-major operands (the layout HDF5
// rows stream in), through cuBLAS (cublasGemmEx) or OpenBLAS (cblas_?gemm).
// Flop convention (used in every rate qstage reports): 2 m n k real flops for real types and
// 8 m n k for complex types (a complex multiply-add is 8 real flops).
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"

namespace qstage::kernels {

struct Gemm {
  DType dtype = DType::complex64;  // float32, float64, complex64, complex128
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // m × k, row-major, leading dimension lda (>= k)
  std::int64_t lda = 0;
  const void* b = nullptr;  // k × n, row-major, leading dimension ldb (>= n); b_transposed: n × k (ldb >= k)
  std::int64_t ldb = 0;
  void* c = nullptr;        // m × n, row-major, leading dimension ldc (>= n)
  std::int64_t ldc = 0;
  bool tf32 = false;        // cuda, single precision: use TF32 tensor cores
  // cpu: C is computed in blocks of row_block rows (counted from row 0; 0: 256) by 1024 columns,
  // one single-threaded OpenBLAS call per block, blocks spread over OpenMP threads. Each row's
  // arithmetic then depends neither on the thread count (OpenBLAS's own threading changes the
  // rounding) nor, when batches start on block boundaries, on the batch size or rank count.
  std::int64_t row_block = 0;
  bool b_transposed = false;  // B is stored n × k and used transposed: C = A · Bᵀ
  // Strided batch: `batch` products, the i-th at a + i*stride_a, b + i*stride_b, c + i*stride_c
  // (elements).
  std::int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
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
void gemm_cuda(void* cuda_stream, void* cublas_handle, const Gemm& args);
}

}  // namespace qstage::kernels
