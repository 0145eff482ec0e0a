#include "kernels/sci_score.hpp"

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

void sci_score_rows_cpu(const SciScoreRows& a) {
  const auto n = static_cast<std::int64_t>(a.n);
#pragma omp parallel for schedule(static, 4096)
  for (std::int64_t r = 0; r < n; ++r) {
    const sci::Det d = a.candidate(static_cast<std::uint64_t>(r));
    a.skipped[r] = sci::score_skips(a.space, a.space_size, a.irreps, d);
    if (!a.skipped[r]) a.denominator[r] = sci::floored_denominator(a.energy - sci::diagonal(a.h, d));
  }
}

void sci_score_rows(Stream& stream, const SciScoreRows& args) {
  QSTAGE_DISPATCH(stream, sci_score_rows_cpu(args), detail::sci_score_rows_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
