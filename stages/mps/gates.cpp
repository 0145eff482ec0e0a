#include "stages/mps/gates.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "kernels/mps/u1_math.hpp"

namespace qstage::stages::mps {

cplx GateTable::at(int n, int m, int l) const {
  return kernels::gate_entry_allowed(n, m, l, d) ? u[kernels::gate_index(n, m, l, d)] : cplx{};
}

namespace {

std::vector<cplx> multiply(const std::vector<cplx>& a, const std::vector<cplx>& b, int n) {
  std::vector<cplx> c(static_cast<std::size_t>(n * n));
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) c[i * n + j] += a[i * n + k] * b[k * n + j];
  return c;
}

}  // namespace

std::vector<cplx> exp_minus_i(const std::vector<cplx>& h, int n, double t) {
  // A = -i t H scaled by 2^-s until its 1-norm is below 1/2; 24 Taylor terms are then exact to
  // far below double rounding, and s squarings undo the scaling.
  double norm1 = 0;
  for (int j = 0; j < n; ++j) {
    double col = 0;
    for (int i = 0; i < n; ++i) col += std::abs(h[i * n + j]);
    norm1 = std::max(norm1, col * std::abs(t));
  }
  int s = 0;
  while (norm1 / std::ldexp(1.0, s) > 0.5) ++s;
  const cplx factor = cplx{0, -t} / std::ldexp(1.0, s);
  std::vector<cplx> a(h.size()), term(h.size()), sum(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) a[i] = factor * h[i];
  for (int i = 0; i < n; ++i) sum[i * n + i] = term[i * n + i] = 1.0;
  for (int k = 1; k <= 24; ++k) {
    term = multiply(term, a, n);
    for (auto& v : term) v /= static_cast<double>(k);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += term[i];
  }
  for (int i = 0; i < s; ++i) sum = multiply(sum, sum, n);
  return sum;
}

void require_unitary(const std::vector<cplx>& u, int n, const std::string& what, const std::string& remedy) {
  double defect = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      cplx entry = i == j ? -1.0 : 0.0;  // (U^dagger U - 1)[i, j]
      for (int k = 0; k < n; ++k) entry += std::conj(u[k * n + i]) * u[k * n + j];
      const double e = std::abs(entry);
      defect = std::isnan(e) || std::isnan(defect) ? std::numeric_limits<double>::quiet_NaN() : std::max(defect, e);
    }
  if (!(defect <= kUnitarityTolerance))
    throw InputError(fmt::format("{} is not unitary in double precision: max |U^dagger U - 1| = {:.1e}; expected at most "
                                 "{:.0e}: {}", what, defect, kUnitarityTolerance, remedy));
}

GateTable gate_table(const std::vector<cplx>& g, int d, const std::string& what) {
  const int n2 = d * d;
  if (g.size() != static_cast<std::size_t>(n2 * n2))
    throw std::logic_error(fmt::format("mps: gate {} has {} entries, expected {}", what, g.size(), n2 * n2));
  double worst = 0;
  int worst_row = 0, worst_col = 0;
  for (int r = 0; r < n2; ++r)
    for (int c = 0; c < n2; ++c)
      if (r / d + r % d != c / d + c % d && std::abs(g[r * n2 + c]) > worst) {
        worst = std::abs(g[r * n2 + c]);
        worst_row = r, worst_col = c;
      }
  if (worst > 1e-13)
    throw InputError(fmt::format("{} does not conserve the particle number: <{},{}|G|{},{}> = {:.3e}; expected 0 between "
                                 "different totals",
                                 what, worst_row / d, worst_row % d, worst_col / d, worst_col % d, worst));
  GateTable t;
  t.d = d;
  t.u.assign(static_cast<std::size_t>(d * d * d), cplx{});
  for (int n = 0; n < d; ++n)
    for (int m = 0; m < d; ++m)
      for (int l = 0; l < d; ++l)
        if (kernels::gate_entry_allowed(n, m, l, d)) t.u[kernels::gate_index(n, m, l, d)] = g[(l * d + (n + m - l)) * n2 + n * d + m];
  return t;
}

}  // namespace qstage::stages::mps
