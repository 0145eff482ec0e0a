#pragma once
// One CHECK macro for CUDA runtime and cuBLAS calls: a failure becomes a RuntimeFailure that
// names the call, the file and line, and the library's own error text.
#ifdef QSTAGE_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace qstage::detail {
[[noreturn]] void throw_cuda_error(const char* call, const char* file, int line, const char* text);

inline void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc != cudaSuccess) throw_cuda_error(call, file, line, cudaGetErrorString(rc));
}
inline void cuda_check(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc != CUBLAS_STATUS_SUCCESS) throw_cuda_error(call, file, line, cublasGetStatusString(rc));
}
}  // namespace qstage::detail

#define QSTAGE_CUDA_CHECK(call) ::qstage::detail::cuda_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define QSTAGE_CUDA_CHECK_LAUNCH() QSTAGE_CUDA_CHECK(cudaGetLastError())
#endif
