#include "kernels/sci/sci_davidson.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/dispatch.hpp"
#include "kernels/sci/sci_davidson_math.hpp"

namespace qstage::kernels {

namespace {

// One block's dot product in the fixed shape. (Eight independent chains: a single running sum
// waits for each addition before the next, 4 cycles an entry.)
double block_dot(const double* a, const double* b, std::uint64_t n) {
  double lane[8] = {};
  std::uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) lane[l] += a[i] * b[i];
  return lanes_total(lane);
}

// A sweep's partial sums: block(first, size) returns one block's, the blocks on OpenMP threads
// (inside a parallel region, on the caller's thread alone: the same bits).
template <typename Block>
void block_sums(std::uint64_t n, double* partials, Block block) {
  const std::uint64_t blocks = fixed_sum_blocks(n);
#pragma omp parallel for schedule(static) if (blocks >= 8)
  for (std::uint64_t k = 0; k < blocks; ++k)
    partials[k] = block(k * kFixedSumBlock, std::min(kFixedSumBlock, n - k * kFixedSumBlock));
}

}  // namespace

void fixed_dots_cpu(const FixedDots& a) {
  const std::uint64_t blocks = fixed_sum_blocks(a.n);
  // (the dots are independent: one a thread when there are several, each summed as above)
#pragma omp parallel for schedule(dynamic) if (a.count > 1)
  for (int k = 0; k < a.count; ++k) {
    const double* x = a.a + static_cast<std::uint64_t>(k) * a.a_step;
    const double* y = a.b + static_cast<std::uint64_t>(k) * a.b_step;
    double* partials = a.partials + static_cast<std::uint64_t>(k) * blocks;
    block_sums(a.n, partials, [&](std::uint64_t first, std::uint64_t size) { return block_dot(x + first, y + first, size); });
    a.sums[k] = fold(partials, blocks);
  }
}

void subtract_then_dot_cpu(const SubtractThenDot& a) {
  const double d = a.b ? *a.d : 0.0;
  block_sums(a.n, a.partials, [&](std::uint64_t first, std::uint64_t size) {
    if (a.b)
      for (std::uint64_t i = first; i < first + size; ++i) a.t[i] -= d * a.b[i];
    return block_dot(a.c + first, a.t + first, size);
  });
  *a.sum = fold(a.partials, fixed_sum_blocks(a.n));
}

void scale_to_unit_cpu(const ScaleToUnit& a) {
  const double f = 1 / std::sqrt(*a.square);
#pragma omp parallel for schedule(static)
  for (std::uint64_t i = 0; i < a.n; ++i) a.t[i] *= f;
}

void ritz_vector_cpu(const RitzVector& a) {
  // (a block of entries at a time, vector after vector: each vector read as one stream, not 2m at
  // once; per entry the vectors in order)
  block_sums(a.n, a.partials, [&](std::uint64_t first, std::uint64_t size) {
    double* x = a.x + first;
    double* ax = a.ax + first;
    std::fill(x, x + size, 0.0), std::fill(ax, ax + size, 0.0);
    for (int j = 0; j < a.m; ++j) {
      const double y = a.y[j];
      const double* b = a.basis + static_cast<std::uint64_t>(j) * a.stride + first;
      const double* p = a.products + static_cast<std::uint64_t>(j) * a.stride + first;
      for (std::uint64_t i = 0; i < size; ++i) x[i] += y * b[i], ax[i] += y * p[i];
    }
    double* r = a.r + first;
    for (std::uint64_t i = 0; i < size; ++i) r[i] = ax[i] - a.theta * x[i];
    return block_dot(r, r, size);
  });
  *a.sum = fold(a.partials, fixed_sum_blocks(a.n));
}

void precondition_cpu(const Precondition& a) {
#pragma omp parallel for schedule(static)
  for (std::uint64_t i = 0; i < a.n; ++i) a.t[i] = preconditioned(a.t[i], a.theta, a.diagonal[i]);
}

void fixed_dots(Stream& stream, const FixedDots& args) {
  QSTAGE_DISPATCH(stream, fixed_dots_cpu(args), detail::fixed_dots_cuda(stream.native(), args));
}
void subtract_then_dot(Stream& stream, const SubtractThenDot& args) {
  QSTAGE_DISPATCH(stream, subtract_then_dot_cpu(args), detail::subtract_then_dot_cuda(stream.native(), args));
}
void scale_to_unit(Stream& stream, const ScaleToUnit& args) {
  QSTAGE_DISPATCH(stream, scale_to_unit_cpu(args), detail::scale_to_unit_cuda(stream.native(), args));
}
void ritz_vector(Stream& stream, const RitzVector& args) {
  QSTAGE_DISPATCH(stream, ritz_vector_cpu(args), detail::ritz_vector_cuda(stream.native(), args));
}
void precondition(Stream& stream, const Precondition& args) {
  QSTAGE_DISPATCH(stream, precondition_cpu(args), detail::precondition_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
