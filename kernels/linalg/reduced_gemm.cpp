#include "kernels/linalg/reduced_gemm.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

void stage_operand_cpu(const StageOperand& s) {
  using Format = StageOperand::Format;
  const std::int64_t rows = s.out_rows(), cols = s.out_cols(), per_entry = rows * cols;
  const std::int64_t src_stride = s.stride * (s.complex ? 2 : 1);
  const std::int64_t total = s.batch * per_entry;
  float* big = static_cast<float*>(s.big);
  float* small = static_cast<float*>(s.small);
#pragma omp parallel for schedule(static) if (total > 65536)
  for (std::int64_t i = 0; i < total; ++i) {
    const std::int64_t entry = i / per_entry, r = i % per_entry / cols, c = i % cols;
    const int planes = s.layout == StageOperand::Layout::planes ? 3 : 1;
    for (int p = 0; p < planes; ++p) {
      const float x = staged_value(static_cast<const float*>(s.src) + entry * src_stride, s, r, c, p);
      const std::int64_t at = s.out_at(entry, r, c) + p * s.plane_stride;
      switch (s.format) {
        case Format::tf32:
          big[at] = round_tf32(x);
          break;
        case Format::bf16:
          big[at] = round_bf16(x);
          break;
        case Format::split: {
          const float b = round_tf32(x);
          big[at] = b;
          small[at] = round_tf32(x - b);
          break;
        }
      }
    }
  }
}

void combine_three_products_cpu(const ThreeProducts& t) {
  const std::int64_t per_entry = t.rows * t.cols, total = t.batch * per_entry;
#pragma omp parallel for schedule(static) if (total > 65536)
  for (std::int64_t i = 0; i < total; ++i) {
    const std::int64_t entry = i / per_entry, r = i % per_entry / t.cols, c = i % t.cols;
    combine_value(t, i, static_cast<float*>(t.c) + 2 * (entry * t.stride_c + r * t.ldc + c));
  }
}

void combine_three_products(Stream& stream, const ThreeProducts& t) {
  QSTAGE_DISPATCH(stream, combine_three_products_cpu(t), detail::combine_three_products_cuda(stream.native(), t));
}

void stage_operand(Stream& stream, const StageOperand& s) {
  if (s.layout == StageOperand::Layout::planes && (s.format != StageOperand::Format::split || !s.complex))
    throw std::logic_error("stage_operand: the planes layout stages complex operands split (3xTF32) only");
  QSTAGE_DISPATCH(stream, stage_operand_cpu(s), detail::stage_operand_cuda(stream.native(), s));
}

namespace {
constexpr std::int64_t kAlign = 256;
}  // namespace

// 3xTF32: the tensor cores' FP32 accumulation of one call's sums is not rounded to nearest, and
// its error grows with their length: on an H100, 1.9e-5 relative for a 4096^3 complex product (8192
// real terms, one call per part) against 1.6e-6 in FP32; in pieces of 1024 real terms, 2.4e-6 on
// an H200 whatever the length (docs/benchmarks.md). So big · big, the term that carries the
// value, runs over pieces of at most kSplitInnerLength real terms, each added to its sum in
// cuBLAS's FP32 epilogue (rounded to nearest). The two cross terms are 2^-11 smaller: their
// accumulation error does not show, so they run as one product over everything staged at once
// (big | small times small over big, stacked along the inner dimension). The inner dimension is
// staged kSplitStageLength real terms at a time (4M: 1024 complex terms; 3M: as many, each plane
// product's sums 1024 real terms long). In the 4M form, three products a piece of 1024 ran at
// 1.65x FP32's rate (H200), stacked 1.64-1.80x (H100): the short products themselves, not their
// number, cost the rate (311-344 TFLOP/s against 408-422 over 8192). The 3M form does a quarter
// less of them: 1.96-2.02x FP32 in one tile on an H100 at the same error (2.46e-6).
constexpr std::int64_t kSplitInnerLength = 1024;
constexpr std::int64_t kSplitStageLength = 2048;

// How a product is staged: its form and the bytes of one batch entry's staged tiles.
struct StagedForm {
  std::int64_t e, parts, value_bytes;
  bool three;  // the 3M form: complex 3xTF32 (reduced_gemm.hpp)
  StagedForm(const Gemm& g, bool cuda)
      : e(g.dtype == DType::complex64 ? 2 : 1),
        parts(g.compute == Compute::tf32x3 ? 2 : 1),
        value_bytes(g.compute == Compute::bf16 && cuda ? 2 : 4),
        three(g.compute == Compute::tf32x3 && g.dtype == DType::complex64) {}
  // B's tile (nt × kt) and A's (mt × kt), all planes and parts; the 3M form's three real products
  // of C's tile (mt × nt).
  std::int64_t b_bytes(std::int64_t nt, std::int64_t kt) const {
    return parts * value_bytes * (three ? 3 * kt * nt : e * kt * e * nt);
  }
  std::int64_t a_bytes(std::int64_t mt, std::int64_t kt) const {
    return parts * value_bytes * (three ? 3 * mt * kt : mt * e * kt);
  }
  std::int64_t p_bytes(std::int64_t mt, std::int64_t nt) const { return three ? 3 * 4 * mt * nt : 0; }
};

// The longest inner dimension staged at once for `g`.
std::int64_t inner_limit(const Gemm& g) {
  const std::int64_t e = g.dtype == DType::complex64 ? 2 : 1;
  return g.compute == Compute::tf32x3 ? std::min(g.k, std::max<std::int64_t>(1, kSplitStageLength / e)) : g.k;
}

std::int64_t reduced_gemm_workspace(const Gemm& g) {
  const StagedForm form(g, false);
  const std::int64_t k = inner_limit(g);
  const std::int64_t bytes = g.batch * (form.b_bytes(g.n, k) + form.a_bytes(g.m, k) + form.p_bytes(g.m, g.n));
  return std::max(kReducedGemmMinWorkspace, bytes + 4 * kAlign * form.parts);
}

namespace detail {

namespace {

std::int64_t aligned(std::int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One tiling of the product: tiles of mt × nt of C over kt of the inner dimension, `entries`
// batch entries at a time (all of them, or one). The 3M form's products are held for every row
// of a column tile over the inner dimension's pieces and combined into C once (`hold`), or, where
// the workspace cannot hold them, combined after each piece (a pass over C a piece: at 4096^3,
// 1.94x FP32's rate so against 2.02x held, on two H100s, docs/benchmarks.md).
struct Tiling {
  std::int64_t entries, mt, nt, kt;
  bool hold = false;
};

class ReducedProduct {
 public:
  ReducedProduct(Stream& stream, const Gemm& g)
      : stream_(stream), g_(g), cuda_(stream.kind() == BackendKind::cuda), form_(g, cuda_) {
    format_ = g.compute == Compute::tf32x3 ? StageOperand::Format::split
              : g.compute == Compute::bf16 ? StageOperand::Format::bf16
                                           : StageOperand::Format::tf32;
  }

  void run() {
    if (!g_.workspace || g_.workspace_bytes < kReducedGemmMinWorkspace)
      throw std::logic_error("gemm: a reduced-precision product needs a workspace");
    const Tiling t = tiling();
    // (fixed regions, sized for the largest tiles: B's planes and parts, then A's, then the 3M
    // form's products, whatever the order)
    b_region_ = t.entries * form_.b_bytes(t.nt, t.kt);
    a_region_ = t.entries * form_.a_bytes(t.mt, t.kt);
    hold_ = t.hold;
    // Which operand is staged again: with the inner dimension whole, either B's column tiles each
    // take every row tile of A (A staged once per column tile), or A's row tiles each take every
    // column tile of B (B staged once per row tile); the order that stages fewer bytes runs. Each
    // tile of C is the same products either way, so the order changes no value. A split inner
    // dimension keeps the columns outside, so that a tile's sums run over it in order.
    const std::int64_t column_tiles = (g_.n + t.nt - 1) / t.nt, row_tiles = (g_.m + t.mt - 1) / t.mt;
    const bool rows_outside = t.kt == g_.k && form_.a_bytes(g_.m, g_.k) + row_tiles * form_.b_bytes(g_.n, g_.k) <
                                                  column_tiles * form_.a_bytes(g_.m, g_.k) + form_.b_bytes(g_.n, g_.k);
    for (std::int64_t b0 = 0; b0 < g_.batch; b0 += t.entries) {
      if (rows_outside) {
        for (std::int64_t m0 = 0; m0 < g_.m; m0 += t.mt) {
          const std::int64_t mt = std::min(t.mt, g_.m - m0);
          stage_a(b0, t.entries, m0, mt, 0, g_.k);
          for (std::int64_t n0 = 0; n0 < g_.n; n0 += t.nt) {
            const std::int64_t nt = std::min(t.nt, g_.n - n0);
            stage_b(b0, t.entries, n0, nt, 0, g_.k);
            // (the 3M form: its products set, then combined into C)
            multiply(b0, t.entries, m0, mt, n0, nt, g_.k, !form_.three && g_.accumulate);
            if (form_.three) combine(b0, t.entries, m0, mt, n0, nt, g_.accumulate);
          }
        }
        continue;
      }
      for (std::int64_t n0 = 0; n0 < g_.n; n0 += t.nt) {
        const std::int64_t nt = std::min(t.nt, g_.n - n0);
        for (std::int64_t k0 = 0; k0 < g_.k; k0 += t.kt) {
          const std::int64_t kt = std::min(t.kt, g_.k - k0);
          stage_b(b0, t.entries, n0, nt, k0, kt);
          for (std::int64_t m0 = 0; m0 < g_.m; m0 += t.mt) {
            const std::int64_t mt = std::min(t.mt, g_.m - m0);
            stage_a(b0, t.entries, m0, mt, k0, kt);
            // (the 3M form: into its products, kept over the pieces when held)
            const bool onto_sum = form_.three ? hold_ && k0 > 0 : g_.accumulate || k0 > 0;
            multiply(b0, t.entries, m0, mt, n0, nt, kt, onto_sum);
            if (form_.three && !hold_) combine(b0, t.entries, m0, mt, n0, nt, g_.accumulate || k0 > 0);
          }
        }
        if (form_.three && hold_) combine(b0, t.entries, 0, g_.m, n0, nt, g_.accumulate);
      }
    }
  }

 private:
  // The whole batch at once when it fits (3xTF32: over pieces of the inner dimension, see
  // kSplitStageLength); else one entry at a time, B's tile in half the workspace (fewer columns
  // first, down to one, before the inner dimension is split: a row's sums then do not depend on
  // m or the workspace) and as many rows of A (and of the 3M form's products) as the rest holds.
  Tiling tiling() const {
    const std::int64_t w = g_.workspace_bytes - 4 * kAlign * form_.parts;
    const std::int64_t k = inner_limit(g_);
    if (g_.batch * (form_.b_bytes(g_.n, k) + form_.a_bytes(g_.m, k) + form_.p_bytes(g_.m, g_.n)) <= w)
      return {g_.batch, g_.m, g_.n, k, form_.three};
    // (the 3M form: first with its products held for every row beside B's tile in half the
    // workspace; when even one column of them does not fit, per row tile)
    for (const bool hold : {form_.three, false}) {
      const std::int64_t held_rows = hold ? g_.m : 0;
      std::int64_t nt = g_.n, kt = k;
      while (form_.b_bytes(nt, kt) + form_.p_bytes(held_rows, nt) > w / 2 && (nt > 1 || kt > 1)) {
        if (nt > 1)
          nt = (nt + 1) / 2;
        else
          kt = (kt + 1) / 2;
      }
      const std::int64_t fixed = form_.b_bytes(nt, kt) + form_.p_bytes(held_rows, nt);
      if (fixed > w / 2 && hold) continue;
      std::int64_t mt = std::min(g_.m, (w - fixed) / (form_.a_bytes(1, kt) + (hold ? 0 : form_.p_bytes(1, nt))));
      // On cpu, whole row blocks (gemm_cpu's unit) keep a row's bits independent of m.
      const std::int64_t rb = g_.row_block > 0 ? g_.row_block : 256;
      if (!cuda_ && mt > rb) mt = mt / rb * rb;
      return {1, std::max<std::int64_t>(mt, 1), nt, kt, hold};
    }
    throw std::logic_error("gemm: no tiling");  // (the loop's second pass always returns)
  }

  char* workspace() const { return static_cast<char*>(g_.workspace); }
  // Layout of the workspace: B's staged tile, then A's, each region sized for the largest tile
  // (3xTF32: both parts of each, stacked as stage_b and stage_a say), then the 3M form's products.
  char* b_staged() const { return workspace(); }
  char* a_staged() const { return workspace() + aligned(b_region_); }
  float* products() const { return reinterpret_cast<float*>(a_staged() + aligned(a_region_)); }
  std::size_t element() const { return form_.e * sizeof(float); }

  // The staging of `entries` batch entries of an operand from element `offset` on.
  StageOperand operand(const void* data, std::int64_t offset, std::int64_t ld, std::int64_t stride,
                       std::int64_t entries) const {
    StageOperand s;
    s.src = static_cast<const char*>(data) + offset * element();
    s.complex = form_.e == 2;
    s.ld = ld;
    s.batch = entries;
    s.stride = stride;
    s.format = format_;
    return s;
  }

  void stage_b(std::int64_t b0, std::int64_t entries, std::int64_t n0, std::int64_t nt, std::int64_t k0, std::int64_t kt) {
    const std::int64_t offset = b0 * g_.stride_b + (g_.b_transposed ? n0 * g_.ldb + k0 : k0 * g_.ldb + n0);
    StageOperand s = operand(g_.b, offset, g_.ldb, g_.stride_b, entries);
    s.rows = g_.b_transposed ? nt : kt;
    s.cols = g_.b_transposed ? kt : nt;
    s.layout = form_.three       ? StageOperand::Layout::planes
               : !s.complex      ? StageOperand::Layout::plain
               : g_.b_transposed ? StageOperand::Layout::expand_t
                                 : StageOperand::Layout::expand;
    if (form_.parts == 1) {
      s.big = b_staged();
    } else {  // stacked along the inner dimension: small over big (rows, or columns of Bᵀ)
      float* base = reinterpret_cast<float*>(b_staged());
      const std::int64_t inner = form_.three ? kt : form_.e * kt, cols = form_.three ? nt : form_.e * nt;
      s.out_ld = g_.b_transposed ? 2 * inner : cols;
      s.out_stride = 2 * inner * cols;
      s.plane_stride = entries * s.out_stride;
      s.small = base;
      s.big = base + (g_.b_transposed ? inner : inner * s.out_ld);
    }
    stage_operand(stream_, s);
  }

  void stage_a(std::int64_t b0, std::int64_t entries, std::int64_t m0, std::int64_t mt, std::int64_t k0, std::int64_t kt) {
    StageOperand s = operand(g_.a, b0 * g_.stride_a + m0 * g_.lda + k0, g_.lda, g_.stride_a, entries);
    s.rows = mt;
    s.cols = kt;
    s.layout = form_.three ? StageOperand::Layout::planes : StageOperand::Layout::plain;
    if (form_.parts == 1) {
      s.big = a_staged();
    } else {  // big | small in each row
      float* base = reinterpret_cast<float*>(a_staged());
      const std::int64_t inner = form_.three ? kt : form_.e * kt;
      s.out_ld = 2 * inner;
      s.out_stride = mt * s.out_ld;
      s.plane_stride = entries * s.out_stride;
      s.big = base;
      s.small = base + inner;
    }
    stage_operand(stream_, s);
  }

  // The tile's products into C (interleaved complex, or real) from the staged operands.
  void multiply(std::int64_t b0, std::int64_t entries, std::int64_t m0, std::int64_t mt, std::int64_t n0,
                std::int64_t nt, std::int64_t kt, bool accumulate) {
    Gemm r;
    r.dtype = DType::float32;
    r.m = mt;
    r.n = form_.e * nt;
    r.k = form_.e * kt;
    r.lda = form_.e * kt;
    r.b_transposed = g_.b_transposed;
    r.ldb = g_.b_transposed ? form_.e * kt : form_.e * nt;
    r.c = static_cast<char*>(g_.c) + (b0 * g_.stride_c + m0 * g_.ldc + n0) * element();
    r.ldc = form_.e * g_.ldc;
    r.row_block = g_.row_block;
    r.batch = entries;
    r.stride_a = mt * form_.e * kt;
    r.stride_b = form_.e * kt * form_.e * nt;
    r.stride_c = form_.e * g_.stride_c;
    r.accumulate = accumulate;
    if (form_.parts == 1) {
      r.a = a_staged();
      r.b = b_staged();
      return gemm_direct(stream_, r, operands());
    }
    if (!form_.three)
      return split_product(r, reinterpret_cast<const float*>(a_staged()), reinterpret_cast<const float*>(b_staged()));
    // The 3M form: plane p's real product (m × n × k) into its products (combine), set or, with
    // `accumulate`, added to.
    const std::int64_t rows = hold_ ? g_.m : mt, plane = entries * rows * nt;
    r.n = nt;
    r.k = kt;
    r.ldc = nt;
    r.stride_c = rows * nt;
    const std::int64_t a_plane = entries * mt * 2 * kt, b_plane = entries * 2 * kt * nt;  // (stage_a, stage_b)
    for (int p = 0; p < 3; ++p) {
      r.c = products() + p * plane + (hold_ ? m0 * nt : 0);
      split_product(r, reinterpret_cast<const float*>(a_staged()) + p * a_plane,
                    reinterpret_cast<const float*>(b_staged()) + p * b_plane);
    }
  }

  // The 3M form's products of rows m0 ... m0 + mt of C's column tile n0 (held: of every row) into
  // C, set or, with `accumulate`, added to.
  void combine(std::int64_t b0, std::int64_t entries, std::int64_t m0, std::int64_t mt, std::int64_t n0,
               std::int64_t nt, bool accumulate) {
    ThreeProducts t;
    t.planes = products() + (hold_ ? m0 * nt : 0);
    t.plane_stride = entries * (hold_ ? g_.m : mt) * nt;
    t.batch = entries;
    t.rows = mt;
    t.cols = nt;
    t.c = static_cast<char*>(g_.c) + (b0 * g_.stride_c + m0 * g_.ldc + n0) * element();
    t.ldc = g_.ldc;
    t.stride_c = g_.stride_c;
    t.accumulate = accumulate;
    combine_three_products(stream_, t);
  }

  // 3xTF32 of the real product `r` (its m, n, k, c, ldc, batch and accumulate) over stacked
  // operands (stage_a, stage_b): A's rows are big | small, B is small over big along the inner
  // dimension (K = r.k real terms each).
  void split_product(const Gemm& r, const float* a, const float* b) {
    const std::int64_t inner = r.k;
    Gemm base = r;
    base.lda = 2 * inner;
    base.stride_a = r.m * 2 * inner;
    base.ldb = g_.b_transposed ? 2 * inner : r.n;
    base.stride_b = 2 * inner * r.n;
    // big · small + small · big in one product over 2K terms, first (the smaller terms first)...
    Gemm cross = base;
    cross.k = 2 * inner;
    cross.a = a;
    cross.b = b;
    gemm_direct(stream_, cross, operands());
    // ...then big · big in pieces of kSplitInnerLength, in order, into the sum.
    const float* b_big = b + (g_.b_transposed ? inner : inner * base.ldb);
    for (std::int64_t k0 = 0; k0 < inner; k0 += kSplitInnerLength) {
      Gemm piece = base;
      piece.k = std::min(kSplitInnerLength, inner - k0);
      piece.a = a + k0;
      piece.b = b_big + (g_.b_transposed ? k0 : k0 * base.ldb);
      piece.accumulate = true;
      gemm_direct(stream_, piece, operands());
    }
  }

  Operands operands() const { return g_.compute == Compute::bf16 ? Operands::bf16 : Operands::tf32_cores; }

  Stream& stream_;
  const Gemm& g_;
  bool cuda_;
  StagedForm form_;
  StageOperand::Format format_;
  std::int64_t b_region_ = 0, a_region_ = 0;  // bytes of the largest staged B and A tiles (all parts)
  bool hold_ = false;                         // (Tiling::hold)
};

}  // namespace

void gemm_reduced(Stream& stream, const Gemm& args) {
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  if (args.k == 0) return gemm_direct(stream, args, Operands::full);  // (C = 0, or C unchanged)
  ReducedProduct(stream, args).run();
}

}  // namespace detail

}  // namespace qstage::kernels
