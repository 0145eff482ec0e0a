#include <cuComplex.h>

#include "backend/cuda_check.hpp"
#include "kernels/linalg/gemm.hpp"

namespace qstage::kernels::detail {

// cuBLAS is column-major. A row-major m×k matrix is a column-major k×m matrix, so the row-major
// product C = A·B is the column-major product Cᵀ = Bᵀ·Aᵀ: swap the operands and m with n.
void gemm_cuda(void* cuda_stream, void* cublas_handle, const Gemm& g, Operands operands) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  auto handle = static_cast<cublasHandle_t>(cublas_handle);
  cudaDataType_t type, c_type;
  cublasComputeType_t compute;
  const float one_f[2] = {1, 0}, zero_f[2] = {0, 0};
  const double one_d[2] = {1, 0}, zero_d[2] = {0, 0};
  const void *one = one_f, *beta = g.accumulate ? one_f : zero_f;
  const bool single = g.dtype == DType::float32 || g.dtype == DType::complex64;
  if (!single && operands != Operands::full) throw std::invalid_argument("gemm: reduced operands need single precision");
  switch (g.dtype) {
    case DType::float32: type = CUDA_R_32F; break;
    case DType::complex64: type = CUDA_C_32F; break;
    case DType::float64: type = CUDA_R_64F; break;
    case DType::complex128: type = CUDA_C_64F; break;
    default: throw std::invalid_argument("gemm: unsupported dtype");
  }
  c_type = type;
  if (single) {
    compute = operands == Operands::tf32_cores ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (operands == Operands::bf16) type = g.dtype == DType::float32 ? CUDA_R_16BF : CUDA_C_16BF;
  } else {
    compute = CUBLAS_COMPUTE_64F;
    one = one_d;
    beta = g.accumulate ? one_d : zero_d;
  }
  QSTAGE_CUDA_CHECK(cublasSetStream(handle, static_cast<cudaStream_t>(cuda_stream)));
  // Row-major C = A·op(B) is column-major Cᵀ = op(B)ᵀ·Aᵀ; a transposed B (n × k row-major) is a
  // column-major k × n matrix used transposed.
  const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (g.batch > 1) {
    QSTAGE_CUDA_CHECK(cublasGemmStridedBatchedEx(
        handle, op_b, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), one, g.b, type,
        static_cast<int>(g.ldb), g.stride_b, g.a, type, static_cast<int>(g.lda), g.stride_a, beta, g.c, c_type,
        static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch), compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  QSTAGE_CUDA_CHECK(cublasGemmEx(handle, op_b, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
                                 static_cast<int>(g.k), one, g.b, type, static_cast<int>(g.ldb), g.a, type,
                                 static_cast<int>(g.lda), beta, g.c, c_type, static_cast<int>(g.ldc), compute,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace qstage::kernels::detail
