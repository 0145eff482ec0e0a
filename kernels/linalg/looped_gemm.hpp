#pragma once
// Many tiny GEMMs whose operands sit at offsets that are not one arithmetic progression: the
// tensor-network steps whose batch modes (shared by both operands and the result) are laid out
// differently in each (a 24-qubit circuit has steps of 2 x 2 x 4 products over 2^24 loop
// indices). The kernels walk the loop digits themselves, instead of one BLAS call per loop index:
// one thread per result element in general; on the GPU, one thread per row of the large operand
// for short sums, tiles with the small operand in shared memory for gate steps, a warp or a
// cluster per element for long sums (looped_gemm.cu); and small products chained, many a launch
// (LoopedChain, below). Each element sums over k in a fixed order: the bits do not depend on the
// device's thread count or the launch shape.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "core/dtype.hpp"
#include "kernels/common.hpp"
#include "kernels/linalg/tropical.hpp"

namespace qstage::kernels {

inline constexpr int kMaxLoopGroups = 64;
// Sums at least this long run one block (or a cluster of blocks) per result element on the GPU
// (looped_gemm.cu).
inline constexpr std::int64_t kLoopedBlockSum = 4096;
// Power-of-two sums up to this long where one operand is small run one thread per row of the
// large operand on the GPU, which reads it once (looped_gemm.cu).
inline constexpr std::int64_t kLoopedRowsMaxSum = 64;

// A looped product: its loop description, the arrays sized for at most MaxGroups loop groups.
template <int MaxGroups>
struct LoopedProduct {
  DType dtype = DType::complex64;  // complex64 or complex128
  // tropical (kernels/linalg/tropical.hpp): complex128 elements read as (exponent, count) pairs,
  // C's elements the tropical sums over k of tropical products.
  Semiring semiring = Semiring::standard;
  std::int64_t m = 1, n = 1, k = 1;
  // For loop index (i_0, ..., i_{g-1}) (i_0 outermost) the product is C = A · Bᵀ with A at
  // a + sum i_d stride_a[d] (m × k, row-major), B at b + sum i_d stride_b[d] (n × k) and C at
  // c + sum i_d stride_c[d] (m × n). Strides in elements.
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int groups = 0;
  std::int64_t extent[MaxGroups] = {}, stride_a[MaxGroups] = {}, stride_b[MaxGroups] = {}, stride_c[MaxGroups] = {};
  // log2 of extent[d], m and n where they are powers of two, else -1: element_at then takes
  // digits by shifts and masks (64-bit division per digit made the kernels compute-bound).
  // looped_gemm() sets them; callers need not.
  std::int8_t shift[MaxGroups] = {}, m_shift = -1, n_shift = -1;
  QSTAGE_HD std::uint64_t loops() const {
    std::uint64_t n_loops = 1;
    for (int d = 0; d < groups; ++d) n_loops *= static_cast<std::uint64_t>(extent[d]);
    return n_loops;
  }
};
using LoopedGemm = LoopedProduct<kMaxLoopGroups>;

// Sets g's shifts from its extents, m and n.
void set_shifts(LoopedGemm& g);

void looped_gemm(Stream& stream, const LoopedGemm& g);
void looped_gemm_cpu(const LoopedGemm& g);

// Chains: small looped products, many in one launch. A circuit's amplitude network has hundreds
// of them a slice (gate tensors contracted with each other: 746 of the 40-qubit benchmark's 800
// steps, under 1 MB of the 57 GB it moves), and as one launch each (about 10 us on an H100) they
// cost more than its large steps' shortfall from the roofline.
inline constexpr int kChainMaxGroups = 8;
inline constexpr std::uint64_t kChainMaxResults = 8192;             // result elements a product
inline constexpr std::uint64_t kChainMaxMultiplyAdds = 1ull << 17;  // multiply-adds a product
// Sums at most this long: a thread of the chain sums one element (a longer sum over few results,
// a contraction's last steps, keeps the warp and cluster kernels).
inline constexpr std::int64_t kChainMaxSum = 256;
using ChainedGemm = LoopedProduct<kChainMaxGroups>;
// Products a launch of a chain runs (their parameters travel in the launch: 32 KB at most). The
// launch boundary orders them too: stages are formed within a launch's products.
inline constexpr int kChainBatch = 64;

// Runs looped products in the order pushed: those that fit a chain wait in the object and run
// together at flush() (or when one that does not fit comes, which then runs alone). The caller
// flushes before other work on the stream reads their results. The products' bits are
// looped_gemm's element kernel's (and the CPU twin's on the CPU).
//
// Queued products form stages: a product starts a new stage when it reads or writes memory a
// product of the current stage writes, or writes memory one reads. A stage's products are
// independent, so on the GPU all of their elements run at once over the whole device; stages run
// in order, a grid-wide barrier between them (products of a circuit's gate subtrees, ordered by
// tn.plan so that independent ones follow each other, fill stages of tens).
class LoopedChain {
 public:
  explicit LoopedChain(Stream& stream) : stream_(stream) {}
  static bool fits(const LoopedGemm& g);
  static bool fits(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t loops, int groups);
  void push(const LoopedGemm& g);
  void flush();
  std::size_t queued() const { return queued_.size(); }
  std::size_t stages() const {
    return static_cast<std::size_t>(std::count(starts_stage_.begin(), starts_stage_.end(), 1));
  }

  // The bytes a product's operand or result spans (from its lowest to its highest element).
  struct Span {
    std::uintptr_t begin = 0, end = 0;
    bool overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
  };
  struct Footprint {
    Span a, b, c;
    // Whether running `later` after this product can differ from running them at once.
    bool conflicts(const Footprint& later) const {
      return c.overlaps(later.a) || c.overlaps(later.b) || c.overlaps(later.c) || later.c.overlaps(a) ||
             later.c.overlaps(b);
    }
  };
  static Footprint footprint(const LoopedGemm& g);

 private:
  Stream& stream_;
  std::vector<ChainedGemm> queued_;
  std::vector<std::uint8_t> starts_stage_;  // per queued product
  std::vector<Footprint> stage_;            // the current stage's products
};

namespace detail {
void looped_gemm_cuda(void* cuda_stream, const LoopedGemm& g);
void looped_chain_cuda(void* cuda_stream, const ChainedGemm* products, const std::uint8_t* starts_stage,
                       std::size_t count);

// Aligned to its size, so that the GPU reads and writes a value in one access (8 or 16 bytes),
// not two (the looped kernels issue fewer loads and stores for the same sums).
template <typename Real>
struct alignas(2 * sizeof(Real)) Complex {
  Real re, im;
};

// Where result element e (row-major over loops, then m, then n) reads and writes: its row i and
// column j, and the offsets of its loop index in A, B and C (elements).
struct ElementAt {
  std::int64_t i, j, a, b, c;
};
// The next digit of `rest` in base `extent` (by a shift and a mask when shift >= 0).
QSTAGE_HD std::int64_t next_digit(std::uint64_t& rest, std::int64_t extent, int shift) {
  if (shift >= 0) {
    const auto digit = static_cast<std::int64_t>(rest & ((std::uint64_t{1} << shift) - 1));
    rest >>= shift;
    return digit;
  }
  const auto digit = static_cast<std::int64_t>(rest % static_cast<std::uint64_t>(extent));
  rest /= static_cast<std::uint64_t>(extent);
  return digit;
}

template <typename Product>
QSTAGE_HD ElementAt element_at(const Product& g, std::uint64_t e) {
  ElementAt at{0, 0, 0, 0, 0};
  std::uint64_t rest = e;
  at.j = next_digit(rest, g.n, g.n_shift);
  at.i = next_digit(rest, g.m, g.m_shift);
  for (int d = g.groups - 1; d >= 0; --d) {
    const std::int64_t digit = next_digit(rest, g.extent[d], g.shift[d]);
    at.a += digit * g.stride_a[d];
    at.b += digit * g.stride_b[d];
    at.c += digit * g.stride_c[d];
  }
  return at;
}

// Result element e, summed over k in order; shared by the CPU twin and the short-sum kernel.
template <typename Real, typename Product>
QSTAGE_HD void looped_gemm_element(const Product& g, std::uint64_t e) {
  const ElementAt at = element_at(g, e);
  const Complex<Real>* x = static_cast<const Complex<Real>*>(g.a) + at.a + at.i * g.k;
  const Complex<Real>* y = static_cast<const Complex<Real>*>(g.b) + at.b + at.j * g.k;
  Real re = 0, im = 0;
  for (std::int64_t p = 0; p < g.k; ++p) {
    re += x[p].re * y[p].re - x[p].im * y[p].im;
    im += x[p].re * y[p].im + x[p].im * y[p].re;
  }
  static_cast<Complex<Real>*>(g.c)[at.c + at.i * g.n + at.j] = Complex<Real>{re, im};
}

// The same element in the tropical semiring (complex128 storage); the CPU twin's and the GPU's.
template <typename Product>
QSTAGE_HD void looped_tropical_element(const Product& g, std::uint64_t e) {
  const ElementAt at = element_at(g, e);
  const Tropical* x = static_cast<const Tropical*>(g.a) + at.a + at.i * g.k;
  const Tropical* y = static_cast<const Tropical*>(g.b) + at.b + at.j * g.k;
  Tropical sum = tropical_zero();
  for (std::int64_t p = 0; p < g.k; ++p) sum = tropical_plus(sum, tropical_times(x[p], y[p]));
  static_cast<Tropical*>(g.c)[at.c + at.i * g.n + at.j] = sum;
}
}  // namespace detail

}  // namespace qstage::kernels
