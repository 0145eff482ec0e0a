#pragma once
// Selected CI's scoring of unique candidates (seed 004's EN-PT2), the per-candidate part, beside
// its CPU twin: whether a candidate is skipped (it is in the sorted space S, found by binary
// search, or of another irrep than the target's) and, if not, its Epstein-Nesbet denominator
// E - H_aa kept at least sci::kDenominatorFloor from zero. The sums over candidates stay on the
// host, in row order (sci.solve's score pass), so E_PT2 has the same bits on every backend: the
// GPU's file is compiled without fused multiply-adds, so its H_aa is the host's to the bit.
#include <cstdint>

#include "backend/backend.hpp"
#include "kernels/sci_math.hpp"

namespace qstage::kernels {

struct SciScoreRows {
  sci::HamiltonianView h;            // device memory on cuda
  const sci::Det* space = nullptr;   // the sorted space S
  std::uint64_t space_size = 0;
  sci::IrrepMasks irreps;            // the target's irrep and the orbitals' (known = false: no check)
  const std::uint64_t* candidates = nullptr;  // n rows of candidate_words: alpha, beta (, a tag)
  std::uint32_t candidate_words = 2;
  std::uint64_t n = 0;
  double energy = 0;                 // E (the space's E_var)
  double* denominator = nullptr;     // n values, written where not skipped
  unsigned char* skipped = nullptr;  // n values: 1 in the space or of another irrep, else 0
  QSTAGE_HD sci::Det candidate(std::uint64_t r) const {
    const std::uint64_t* row = candidates + r * candidate_words;
    return sci::Det{row[0], row[1]};
  }
};

void sci_score_rows(Stream& stream, const SciScoreRows& args);
void sci_score_rows_cpu(const SciScoreRows& args);

namespace detail {
void sci_score_rows_cuda(void* cuda_stream, const SciScoreRows& args);
}  // namespace detail

}  // namespace qstage::kernels
