#pragma once
// Tropical numbers with counting (Liu, Wang and Zhang, PRL 126, 090506 (2021)): a value is a pair
// (x, n), the largest exponent x a sum reaches and the number n of terms that reach it. Products
// add exponents and multiply counts; sums keep the larger exponent, adding counts on a tie:
//
//   (x1, n1) (x) (x2, n2) = (x1 + x2, n1 n2)
//   (x1, n1) (+) (x2, n2) = (x1, n1) if x1 > x2, (x2, n2) if x2 > x1, (x1, n1 + n2) if equal
//
// with zero (-inf, 0) and one (0, 1). A tensor network whose entries are (exponent, 1) where the
// ordinary network has x^exponent, and zero where it has 0, contracts to (the largest exponent,
// how many configurations reach it): the maximum independent set's size and their number, or a
// spin glass's -E_0 and its ground states' degeneracy. The pair is stored as complex128 (x in the
// real part, n in the imaginary part), so tensors, plans, slices and files stay those of complex
// networks. Counts are exact below 2^53; exponents that are integers (or sums of a few binary
// fractions) add exactly, so the result does not depend on the order of the sums.
#include <cmath>

#include "core/hd.hpp"

namespace qstage::kernels {

enum class Semiring { standard, tropical };

struct Tropical {
  double x, n;
};

QSTAGE_HD Tropical tropical_zero() { return {-INFINITY, 0.0}; }
QSTAGE_HD Tropical tropical_one() { return {0.0, 1.0}; }
QSTAGE_HD Tropical tropical_times(Tropical a, Tropical b) {
  if (a.n == 0 || b.n == 0) return tropical_zero();  // (zero absorbs: no -inf + inf)
  return {a.x + b.x, a.n * b.n};
}
QSTAGE_HD Tropical tropical_plus(Tropical a, Tropical b) {
  if (a.n == 0) return b;
  if (b.n == 0) return a;
  if (a.x > b.x) return a;
  if (b.x > a.x) return b;
  return {a.x, a.n + b.n};
}

}  // namespace qstage::kernels
