#pragma once
// The entry-by-entry arithmetic of Davidson's steps (kernels/sci/sci_davidson.hpp), one copy for the
// CPU twins and the CUDA kernels: the same operations in the same order on both.
#include <cstdint>

#include "core/hd.hpp"

namespace qstage::kernels {

// A block's eight lane sums added pairwise: the fixed shape's last additions.
QSTAGE_HD double lanes_total(const double* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The blocks' partial sums added in block order.
QSTAGE_HD double fold(const double* partials, std::uint64_t blocks) {
  if (blocks == 0) return 0;
  double s = partials[0];
  for (std::uint64_t k = 1; k < blocks; ++k) s += partials[k];
  return s;
}

// t_i / (theta - diagonal_i), the divisor kept at least 1e-4 from zero.
QSTAGE_HD double preconditioned(double t, double theta, double diagonal) {
  double d = theta - diagonal;
  if (d > -1e-4 && d < 1e-4) d = d < 0 ? -1e-4 : 1e-4;
  return t / d;
}

}  // namespace qstage::kernels
