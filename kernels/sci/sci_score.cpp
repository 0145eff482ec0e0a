#include "kernels/sci/sci_score.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

// A row of the same determinant as the row before (a semistochastic PT2's keys are sorted by
// (alpha, beta, tag): a determinant reached in several batches, or both above and below
// eps_pt2_large, has a row for each) takes that row's answer instead of computing it again: the
// same function of the same determinant, so the same bits.
void sci_score_rows_cpu(const SciScoreRows& a) {
  constexpr std::uint64_t kChunk = 4096;
  const auto chunks = static_cast<std::int64_t>((a.n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::uint64_t first = static_cast<std::uint64_t>(c) * kChunk, end = std::min(a.n, first + kChunk);
    sci::Det last;
    unsigned char skipped = 0;
    double denominator = 0;
    for (std::uint64_t r = first; r < end; ++r) {
      const sci::Det d = a.candidate(r);
      if (r == first || !(d == last)) {
        last = d;
        skipped = sci::score_skips(a.space, a.space_size, a.filter, a.irreps, d);
        if (!skipped) denominator = sci::floored_denominator(a.energy - sci::diagonal(a.h, d));
      }
      a.skipped[r] = skipped;
      if (!skipped) a.denominator[r] = denominator;
    }
  }
}

void sci_tile_sums_cpu(const SciTileSums& a) {
  const auto tiles = static_cast<std::int64_t>((a.n + a.tile_rows - 1) / a.tile_rows);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t t = 0; t < tiles; ++t) {
    // (summed on the thread's stack, stored once: neighbouring tiles' sums share cache lines, and
    // other threads sum those tiles)
    std::array<double, kSciTileSumSlots> sums{};
    const std::uint64_t end = std::min(a.n, (static_cast<std::uint64_t>(t) + 1) * a.tile_rows);
    for (std::uint64_t r = static_cast<std::uint64_t>(t) * a.tile_rows; r < end; ++r) {
      double term;
      std::uint32_t slot;
      if (sci_tile_term(a, r, term, slot)) sums[slot] += term;
    }
    std::copy(sums.begin(), sums.begin() + a.slots, a.sums + t * a.slots);
  }
}

void sci_score_rows(Stream& stream, const SciScoreRows& args) {
  QSTAGE_DISPATCH(stream, sci_score_rows_cpu(args), detail::sci_score_rows_cuda(stream.native(), args));
}

}  // namespace qstage::kernels

namespace qstage::kernels {

void sci_tile_sums(Stream& stream, const SciTileSums& args) {
  if (args.slots == 0 || args.slots > kSciTileSumSlots) throw std::invalid_argument("sci_tile_sums: slots out of range");
  QSTAGE_DISPATCH(stream, sci_tile_sums_cpu(args), detail::sci_tile_sums_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
