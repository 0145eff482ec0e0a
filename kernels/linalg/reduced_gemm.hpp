#pragma once
// Single-precision products in the reduced modes of kernels::Compute (tf32, 3xtf32, bf16).
//
// A complex product runs as one real product (the "4M" form, all four real products in one
// call): C = A · B with A, C complex m × k, m × n read as real m × 2k, m × 2n (interleaved, as
// stored), and B expanded to a real 2k × 2n matrix whose 2 × 2 block for b is [[re, im], [-im, re]]:
//   C[i, 2j]   = sum_p re(a) re(b) - im(a) im(b),   C[i, 2j+1] = sum_p re(a) im(b) + im(a) re(b).
// The result lands interleaved in C; only B doubles. Tensor cores then run real GEMMs, which
// cuBLAS runs at about twice its complex TF32 rate (measured, docs/benchmarks.md).
//
// A complex 3xTF32 product runs in the "3M" form instead (Gauss's three products): each operand
// staged as three real planes (re, im, re + im), then P0 = Ar·Br, P1 = Ai·Bi, P2 = As·Bs, and
//   re(C) = P0 - P1,   im(C) = P2 - (P0 + P1)   (combine_three_products).
// Three real products of m·n·k where 4M runs one of 4·m·n·k: 3xTF32 multiplies three times, so
// the quarter saved is what takes it past twice FP32's rate. The imaginary part's error grows
// (P2 carries |re| + |im| of both operands): about 1.4x the 4M form's, FP32's level still.
//
// Operands are staged, rounded, into the Gemm's workspace; the product is tiled (batch entries,
// columns, then the inner dimension, then rows) to fit it. On cpu the same staging runs and
// OpenBLAS multiplies the rounded values in FP32.
#include <cstdint>
#include <cstring>

#include "backend/backend.hpp"
#include "core/hd.hpp"
#include "kernels/linalg/gemm.hpp"

namespace qstage::kernels {

// Operand rounding, round-to-nearest-even (the values both backends stage).
QSTAGE_HD std::uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
QSTAGE_HD float bits_float(std::uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
// Rounded to nearest even, dropping the low `dropped_bits` mantissa bits (TF32 keeps 10 of 23,
// BF16 7); infinities and NaNs unchanged.
QSTAGE_HD float round_mantissa(float x, int dropped_bits) {
  std::uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += ((1u << (dropped_bits - 1)) - 1u) + ((u >> dropped_bits) & 1u);
  return bits_float(u & ~((1u << dropped_bits) - 1u));
}
QSTAGE_HD float round_tf32(float x) { return round_mantissa(x, 13); }
QSTAGE_HD float round_bf16(float x) { return round_mantissa(x, 16); }
QSTAGE_HD std::uint16_t bf16_bits(float rounded) { return static_cast<std::uint16_t>(float_bits(rounded) >> 16); }

// Copies rows × cols elements of a float32 or complex64 operand (leading dimension ld, batch
// entries `stride` apart, all in elements) into dense real matrices, rounded:
//   plain      rows × e·cols (e = 2 for complex: re, im interleaved as stored)
//   expand     complex B (k × n) as 2k × 2n, b → [[re, im], [-im, re]]
//   expand_t   complex Bᵀ (n × k) as 2n × 2k, b → [[re, -im], [im, re]] (the transpose of expand)
//   planes     complex rows × cols as three real rows × cols planes: re, im, re + im (the 3M
//              form), plane p at big + p · plane_stride values (and small + p · plane_stride)
// Formats: tf32 (big only), split (big = TF32(x), small = TF32(x - big)), bf16 (big only; stored
// as BF16 on cuda, as floats holding BF16 values on cpu).
// The staged matrices are dense unless out_ld (values from one staged row to the next) and
// out_stride (from one batch entry to the next) say otherwise: 3xTF32 places big and small side
// by side in one matrix that way (reduced_gemm.cpp).
struct StageOperand {
  enum class Layout : std::uint8_t { plain, expand, expand_t, planes };
  enum class Format : std::uint8_t { tf32, split, bf16 };
  const void* src = nullptr;
  bool complex = true;
  std::int64_t rows = 0, cols = 0, ld = 0, batch = 1, stride = 0;
  Layout layout = Layout::plain;
  Format format = Format::tf32;
  void* big = nullptr;
  void* small = nullptr;  // split only
  std::int64_t out_ld = 0, out_stride = 0;  // 0: dense (out_cols; out_rows · out_pitch())
  std::int64_t plane_stride = 0;            // planes only
  QSTAGE_HD std::int64_t out_rows() const {
    return layout == Layout::plain || layout == Layout::planes ? rows : 2 * rows;
  }
  QSTAGE_HD std::int64_t out_cols() const {
    return layout == Layout::planes ? cols : layout == Layout::plain ? (complex ? 2 : 1) * cols : 2 * cols;
  }
  QSTAGE_HD std::int64_t out_pitch() const { return out_ld > 0 ? out_ld : out_cols(); }
  QSTAGE_HD std::int64_t out_entry() const { return out_stride > 0 ? out_stride : out_rows() * out_pitch(); }
  // Where staged value (r, c) of batch entry `entry` goes in big (and small).
  QSTAGE_HD std::int64_t out_at(std::int64_t entry, std::int64_t r, std::int64_t c) const {
    return entry * out_entry() + r * out_pitch() + c;
  }
};

// Plane p's value of a complex number in the planes layout (before rounding).
QSTAGE_HD float plane_value(float re, float im, int p) { return p == 0 ? re : p == 1 ? im : re + im; }

// The staged value of output element (r, c) of one batch entry, before rounding (planes: of
// plane `plane`).
QSTAGE_HD float staged_value(const float* src, const StageOperand& s, std::int64_t r, std::int64_t c, int plane = 0) {
  using Layout = StageOperand::Layout;
  const std::int64_t e = s.complex ? 2 : 1;
  if (s.layout == Layout::plain) return src[r * e * s.ld + c];
  if (s.layout == Layout::planes) return plane_value(src[(r * s.ld + c) * 2], src[(r * s.ld + c) * 2 + 1], plane);
  const bool expand_t = s.layout == Layout::expand_t;
  const std::int64_t at = ((r >> 1) * s.ld + (c >> 1)) * 2;  // (expand: (p, j); expand_t: (j, p))
  const float re = src[at], im = src[at + 1];
  const bool r_odd = r & 1, c_odd = c & 1;
  if (r_odd == c_odd) return re;
  // expand: (even r, odd c) im, (odd r, even c) -im; expand_t the transpose.
  return (c_odd != expand_t) ? im : -im;
}

void stage_operand(Stream& stream, const StageOperand& s);
void stage_operand_cpu(const StageOperand& s);
namespace detail {
void stage_operand_cuda(void* cuda_stream, const StageOperand& s);
}

// The 3M form's last step: C (complex64, interleaved, ldc and stride_c in complex elements) is set
// to, or with `accumulate` increased by, (P0 - P1, P2 - (P0 + P1)), from three real planes of
// `batch` dense rows × cols entries, plane_stride values apart.
struct ThreeProducts {
  const float* planes = nullptr;
  std::int64_t plane_stride = 0, batch = 1, rows = 0, cols = 0;
  void* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  bool accumulate = false;
};
QSTAGE_HD void combine_value(const ThreeProducts& t, std::int64_t at, float* c) {
  const float p0 = t.planes[at], p1 = t.planes[at + t.plane_stride], p2 = t.planes[at + 2 * t.plane_stride];
  const float re = p0 - p1, im = p2 - (p0 + p1);
  c[0] = t.accumulate ? c[0] + re : re;
  c[1] = t.accumulate ? c[1] + im : im;
}
void combine_three_products(Stream& stream, const ThreeProducts& t);
void combine_three_products_cpu(const ThreeProducts& t);
namespace detail {
void combine_three_products_cuda(void* cuda_stream, const ThreeProducts& t);
}

// The smallest workspace a reduced-mode Gemm accepts, and the workspace that runs `g` (its
// compute, shape and batch) in one tile of C on either backend (3xTF32's inner dimension is
// still staged in pieces of 2048 real terms: reduced_gemm.cpp says why).
constexpr std::int64_t kReducedGemmMinWorkspace = 4096;
std::int64_t reduced_gemm_workspace(const Gemm& g);

}  // namespace qstage::kernels
