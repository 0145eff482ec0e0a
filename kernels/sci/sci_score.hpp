#pragma once
// Selected CI's scoring of unique candidates (seed 004's EN-PT2), the per-candidate part, beside
// its CPU twin: whether a candidate is skipped (it is in the sorted space S, found by binary
// search, or of another irrep than the target's) and, if not, its Epstein-Nesbet denominator
// E - H_aa kept at least sci::kDenominatorFloor from zero; then the EN-PT2 terms' sums per tile,
// each tile's in row order, so E_PT2 has the same bits on every backend: the GPU's file is
// compiled without fused multiply-adds, so its H_aa and its terms are the host's to the bit.
#include <cstdint>

#include "backend/backend.hpp"
#include "kernels/sci/sci_math.hpp"

namespace qstage::kernels {

struct SciScoreRows {
  sci::HamiltonianView h;            // device memory on cuda
  const sci::Det* space = nullptr;   // the sorted space S
  std::uint64_t space_size = 0;
  sci::SpaceFilter filter;           // S's (optional): most candidates, outside S, are told so at one read
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

// The sums of the rows' EN-PT2 terms over their denominators (sci_score_rows'), rows skipped
// there left out, per tile of tile_rows rows and in row order within a tile, into `slots` sums a
// tile. Without tags, one slot and the term v^2 / den. With tags (the semistochastic PT2's, see
// kernels::sci::TaggedCandidate), row r goes to slot tag / 3 - first_batch with the term v^2 / den
// (tag % 3 == 0), -v^2 / den (1) or v / den (2).
struct SciTileSums {
  const double* denominator = nullptr;
  const unsigned char* skipped = nullptr;
  std::uint64_t n = 0;
  const double* values = nullptr;  // row r's value: values[r * value_stride]
  std::uint64_t value_stride = 1;
  const std::uint64_t* tags = nullptr;  // row r's tag: tags[r * tag_stride]; null: untagged
  std::uint64_t tag_stride = 0, first_batch = 0;
  std::uint32_t slots = 1;  // at most kSciTileSumSlots
  std::uint64_t tile_rows = 1;
  double* sums = nullptr;  // tiles * slots values
};
inline constexpr std::uint32_t kSciTileSumSlots = 16;

// Row r's term, and its slot (false: skipped).
QSTAGE_HD bool sci_tile_term(const SciTileSums& a, std::uint64_t r, double& term, std::uint32_t& slot) {
  if (a.skipped[r]) return false;
  const double v = a.values[r * a.value_stride], den = a.denominator[r];
  if (a.tags == nullptr) {
    slot = 0;
    term = v * v / den;
    return true;
  }
  const std::uint64_t tag = a.tags[r * a.tag_stride];
  slot = static_cast<std::uint32_t>(tag / 3 - a.first_batch);
  term = tag % 3 == 0 ? v * v / den : tag % 3 == 1 ? -(v * v) / den : v / den;
  return true;
}

void sci_score_rows(Stream& stream, const SciScoreRows& args);
void sci_score_rows_cpu(const SciScoreRows& args);
void sci_tile_sums(Stream& stream, const SciTileSums& args);
void sci_tile_sums_cpu(const SciTileSums& args);

namespace detail {
void sci_score_rows_cuda(void* cuda_stream, const SciScoreRows& args);
void sci_tile_sums_cuda(void* cuda_stream, const SciTileSums& args);
}  // namespace detail

}  // namespace qstage::kernels
