#include <stdexcept>

#include "kernels/dispatch.hpp"

#include "kernels/tensor/stats.hpp"
#include "kernels/tensor/stats_math.hpp"

namespace qstage::kernels {

std::uint64_t stats_tiles(const Stats& a) {
  return a.tile_elements ? (a.elements + a.tile_elements - 1) / a.tile_elements : 0;
}

void fold(StatsPartial& a, const StatsPartial& b) { detail::merge(a, b); }

namespace {

template <typename T>
void stats_tiles_cpu(const Stats& a, bool complex) {
  const auto tiles = static_cast<std::int64_t>(stats_tiles(a));
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t t = 0; t < tiles; ++t) {
    StatsPartial p;
    const std::uint64_t begin = static_cast<std::uint64_t>(t) * a.tile_elements;
    const std::uint64_t end = std::min(a.elements, begin + a.tile_elements);
    for (std::uint64_t e = begin; e < end; ++e) {
      double re, im;
      detail::load<T>(a.data, e, complex, re, im);
      detail::accumulate(p, re, im, complex);
      detail::add_qsum<T>(p, a.data, e, complex, a.first_word);
    }
    a.partials[t] = p;
  }
}

}  // namespace

void stats_cpu(const Stats& a) {
  switch (a.dtype) {
    case DType::float32: return stats_tiles_cpu<float>(a, false);
    case DType::complex64: return stats_tiles_cpu<float>(a, true);
    case DType::float64: return stats_tiles_cpu<double>(a, false);
    case DType::complex128: return stats_tiles_cpu<double>(a, true);
    default: throw std::invalid_argument("stats: unsupported dtype");
  }
}

void stats(Stream& stream, const Stats& args) {
  QSTAGE_DISPATCH(stream, stats_cpu(args), detail::stats_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
