#include <cuda_bf16.h>

#include "backend/cuda_check.hpp"
#include "kernels/linalg/reduced_gemm.hpp"

namespace qstage::kernels::detail {
namespace {

// One thread per staged value (the same staged_value and rounding as the CPU twin): real operands.
__global__ void stage_kernel(StageOperand s, std::int64_t rows, std::int64_t cols) {
  using Format = StageOperand::Format;
  const std::int64_t per_entry = rows * cols, total = s.batch * per_entry;
  const std::int64_t src_stride = s.stride * (s.complex ? 2 : 1);
  const std::int64_t step = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const std::int64_t entry = i / per_entry, r = i % per_entry / cols, c = i % cols;
    const float x = staged_value(static_cast<const float*>(s.src) + entry * src_stride, s, r, c);
    const std::int64_t at = s.out_at(entry, r, c);
    if (s.format == Format::bf16) {
      static_cast<std::uint16_t*>(s.big)[at] = bf16_bits(round_bf16(x));
    } else {
      const float big = round_tf32(x);
      static_cast<float*>(s.big)[at] = big;
      if (s.format == Format::split) static_cast<float*>(s.small)[at] = round_tf32(x - big);
    }
  }
}

// A complex operand: one thread per complex value read, writing the two staged values it gives
// in one 8-byte store (4 for BF16), the staged rows over blockIdx.y (one division a row, not
// one per value). The values are staged_value's, rounded as above:
//   plain     (re, im)
//   expand    even rows (re, im), odd rows (-im, re)
//   expand_t  even rows (re, -im), odd rows (im, re)
__global__ void stage_complex_kernel(StageOperand s, std::int64_t rows, std::int64_t pairs) {
  using Format = StageOperand::Format;
  using Layout = StageOperand::Layout;
  const std::int64_t staged_rows = s.batch * rows;
  for (std::int64_t row = blockIdx.y; row < staged_rows; row += gridDim.y) {
    const std::int64_t entry = row / rows, r = row - entry * rows;
    const float2* src = reinterpret_cast<const float2*>(s.src) + entry * s.stride +
                        (s.layout == Layout::plain ? r : r >> 1) * s.ld;
    const bool odd = r & 1;
    for (std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < pairs;
         j += std::int64_t(gridDim.x) * blockDim.x) {
      const float2 b = src[j];
      float2 x = b;
      if (s.layout == Layout::expand) x = odd ? make_float2(-b.y, b.x) : b;
      else if (s.layout == Layout::expand_t) x = odd ? make_float2(b.y, b.x) : make_float2(b.x, -b.y);
      const std::int64_t at = s.out_at(entry, r, 2 * j) / 2;  // (in pairs of staged values; out_ld, out_stride even)
      if (s.format == Format::bf16) {
        static_cast<std::uint32_t*>(s.big)[at] =
            std::uint32_t(bf16_bits(round_bf16(x.x))) | (std::uint32_t(bf16_bits(round_bf16(x.y))) << 16);
      } else {
        const float2 big = make_float2(round_tf32(x.x), round_tf32(x.y));
        static_cast<float2*>(s.big)[at] = big;
        if (s.format == Format::split)
          static_cast<float2*>(s.small)[at] = make_float2(round_tf32(x.x - big.x), round_tf32(x.y - big.y));
      }
    }
  }
}

// The planes layout (the 3M form, 3xTF32 only): one thread per complex value read, writing its
// three planes' values (split, rounded as above), the rows over blockIdx.y.
__global__ void stage_planes_kernel(StageOperand s, std::int64_t rows) {
  const std::int64_t staged_rows = s.batch * rows;
  for (std::int64_t row = blockIdx.y; row < staged_rows; row += gridDim.y) {
    const std::int64_t entry = row / rows, r = row - entry * rows;
    const float2* src = reinterpret_cast<const float2*>(s.src) + entry * s.stride + r * s.ld;
    for (std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < s.cols;
         j += std::int64_t(gridDim.x) * blockDim.x) {
      const float2 v = src[j];
      const std::int64_t at = s.out_at(entry, r, j);
      for (int p = 0; p < 3; ++p) {
        const float x = plane_value(v.x, v.y, p), big = round_tf32(x);
        static_cast<float*>(s.big)[at + p * s.plane_stride] = big;
        static_cast<float*>(s.small)[at + p * s.plane_stride] = round_tf32(x - big);
      }
    }
  }
}

__global__ void combine_kernel(ThreeProducts t) {
  const std::int64_t rows = t.batch * t.rows;
  for (std::int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const std::int64_t entry = row / t.rows, r = row - entry * t.rows;
    float2* c = static_cast<float2*>(t.c) + entry * t.stride_c + r * t.ldc;
    for (std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < t.cols;
         j += std::int64_t(gridDim.x) * blockDim.x) {
      float2 value = c[j];
      combine_value(t, row * t.cols + j, &value.x);
      c[j] = value;
    }
  }
}

constexpr int kThreads = 256;

// Blocks for `rows` rows of `cols` values: columns over x, rows over y.
dim3 row_blocks(std::int64_t rows, std::int64_t cols) {
  return dim3(static_cast<unsigned>(std::min<std::int64_t>((cols + kThreads - 1) / kThreads, 1024)),
              static_cast<unsigned>(std::min<std::int64_t>(rows, 65535)));
}

}  // namespace

void combine_three_products_cuda(void* cuda_stream, const ThreeProducts& t) {
  if (t.batch * t.rows * t.cols == 0) return;
  combine_kernel<<<row_blocks(t.batch * t.rows, t.cols), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(t);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void stage_operand_cuda(void* cuda_stream, const StageOperand& s) {
  const std::int64_t rows = s.out_rows(), cols = s.out_cols(), total = s.batch * rows * cols;
  if (total == 0) return;
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (s.layout == StageOperand::Layout::planes) {
    stage_planes_kernel<<<row_blocks(s.batch * rows, s.cols), kThreads, 0, stream>>>(s, rows);
  } else if (s.complex) {  // (cols is even: two staged values for each complex value read)
    const std::int64_t pairs = cols / 2;
    stage_complex_kernel<<<row_blocks(s.batch * rows, pairs), kThreads, 0, stream>>>(s, rows, pairs);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((total + kThreads - 1) / kThreads, 65536));
    stage_kernel<<<blocks, kThreads, 0, stream>>>(s, rows, cols);
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
