#include <cuda_bf16.h>

#include "backend/cuda_check.hpp"
#include "kernels/linalg/reduced_gemm.hpp"

namespace qstage::kernels::detail {
namespace {

// One thread per staged value (the same staged_value and rounding as the CPU twin).
__global__ void stage_kernel(StageOperand s, std::int64_t rows, std::int64_t cols) {
  using Format = StageOperand::Format;
  const std::int64_t per_entry = rows * cols, total = s.batch * per_entry;
  const std::int64_t src_stride = s.stride * (s.complex ? 2 : 1);
  const std::int64_t step = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const std::int64_t entry = i / per_entry, r = i % per_entry / cols, c = i % cols;
    const float x = staged_value(static_cast<const float*>(s.src) + entry * src_stride, s, r, c);
    if (s.format == Format::bf16) {
      static_cast<std::uint16_t*>(s.big)[i] = bf16_bits(round_bf16(x));
    } else {
      const float big = round_tf32(x);
      static_cast<float*>(s.big)[i] = big;
      if (s.format == Format::split) static_cast<float*>(s.small)[i] = round_tf32(x - big);
    }
  }
}

}  // namespace

void stage_operand_cuda(void* cuda_stream, const StageOperand& s) {
  const std::int64_t rows = s.out_rows(), cols = s.out_cols(), total = s.batch * rows * cols;
  if (total == 0) return;
  constexpr int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((total + threads - 1) / threads, 65536));
  stage_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(s, rows, cols);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
