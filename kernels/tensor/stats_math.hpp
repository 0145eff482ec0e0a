#pragma once
// The per-element step of the stats kernel, shared by the CPU twin and the CUDA kernel.
#include <cmath>

#include "kernels/checksum.hpp"
#include "kernels/common.hpp"
#include "kernels/tensor/stats.hpp"

namespace qstage::kernels::detail {

QSTAGE_HD bool finite(double x) { return x - x == 0.0; }  // false for NaN and ±Inf, fast-math proof

QSTAGE_HD void accumulate(StatsPartial& p, double re, double im, bool complex) {
  p.count += 1;
  if (!finite(re) || (complex && !finite(im))) {
    p.nonfinite += 1;
    return;
  }
  const double sq = re * re + im * im;
  p.sum_sq += sq;
  const double lo = complex ? (re < im ? re : im) : re;
  const double hi = complex ? (re < im ? im : re) : re;
  if (p.finite_components == 0) {
    p.min = lo;
    p.max = hi;
  } else {
    p.min = lo < p.min ? lo : p.min;
    p.max = hi > p.max ? hi : p.max;
  }
  p.finite_components += complex ? 2 : 1;
  const double a = sqrt(sq);
  p.max_abs = a > p.max_abs ? a : p.max_abs;
}

QSTAGE_HD void merge(StatsPartial& a, const StatsPartial& b) {
  if (b.finite_components) {
    if (a.finite_components == 0) {
      a.min = b.min;
      a.max = b.max;
    } else {
      a.min = b.min < a.min ? b.min : a.min;
      a.max = b.max > a.max ? b.max : a.max;
    }
  }
  a.sum_sq += b.sum_sq;
  a.max_abs = b.max_abs > a.max_abs ? b.max_abs : a.max_abs;
  a.nonfinite += b.nonfinite;
  a.count += b.count;
  a.finite_components += b.finite_components;
  a.qsum += b.qsum;
}

// Adds the qsum64 terms of element e's 4-byte words (1, 2 or 4 of them).
template <typename T>
QSTAGE_HD void add_qsum(StatsPartial& p, const void* data, std::uint64_t e, bool complex, std::uint64_t first_word) {
  constexpr unsigned words_per_component = sizeof(T) / 4;
  const unsigned words = words_per_component * (complex ? 2 : 1);
  const auto* w = static_cast<const std::uint32_t*>(data) + e * words;
  for (unsigned i = 0; i < words; ++i) p.qsum += qsum_term(w[i], first_word + e * words + i);
}

template <typename T>
QSTAGE_HD void load(const void* data, std::uint64_t e, bool complex, double& re, double& im) {
  const T* p = static_cast<const T*>(data);
  if (complex) {
    re = static_cast<double>(p[2 * e]);
    im = static_cast<double>(p[2 * e + 1]);
  } else {
    re = static_cast<double>(p[e]);
    im = 0;
  }
}

}  // namespace qstage::kernels::detail
