#pragma once
// Per-tile statistics of a tensor (a tile = a fixed block of rows, the engine's reduction unit).
// Tiles are folded in tile order afterwards, so the result does not depend on batches or ranks.
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"

namespace qstage::kernels {

struct StatsPartial {
  double sum_sq = 0;           // sum of |x|^2 over finite elements
  double min = 0, max = 0;     // over finite real components (both parts of complex values)
  double max_abs = 0;          // largest |x| (complex modulus) over finite elements
  std::uint64_t nonfinite = 0; // elements with a NaN or infinite component
  std::uint64_t count = 0;     // elements
  std::uint64_t finite_components = 0;  // components that entered min/max (0: min/max undefined)
  std::uint64_t qsum = 0;      // qsum64 terms of the elements' words (kernels/checksum.hpp)
};

struct Stats {
  DType dtype = DType::float32;  // float32, float64, complex64, complex128
  const void* data = nullptr;            // device memory: tiles × tile_elements elements
  std::uint64_t elements = 0;            // total elements (the last tile may be short)
  std::uint64_t tile_elements = 0;
  std::uint64_t first_word = 0;          // global index of the data's first 4-byte word (for qsum)
  StatsPartial* partials = nullptr;      // device memory: one per tile
};

// Tiles are reduced in a fixed order on each backend (CPU: sequential per tile; GPU: a fixed
// block tree), so results are bitwise reproducible per backend; sum_sq differs between the two
// by rounding only (relative 1e-12 is the tolerance the tests state).
void stats(Stream& stream, const Stats& args);
void stats_cpu(const Stats& args);
std::uint64_t stats_tiles(const Stats& args);

// Folds b into a (b's elements come after a's).
void fold(StatsPartial& a, const StatsPartial& b);

namespace detail {
void stats_cuda(void* cuda_stream, const Stats& args);
}

}  // namespace qstage::kernels
