#include "stages/mps/truncation.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace qstage::stages::mps {

TruncParams trunc_params_from_json(const nlohmann::json& t, const std::string& name, bool density_matrix) {
  TruncParams r;
  r.chi_max = t.value("chi_max", r.chi_max);
  r.svd_min = t.value("svd_min", r.svd_min);
  r.trunc_cut = t.value("trunc_cut", r.trunc_cut);
  r.chi_min = t.value("chi_min", r.chi_min);
  r.degeneracy_tol = t.value("degeneracy_tol", density_matrix ? kDensityMatrixDegeneracyTol : 0.0);
  if (r.chi_min < 0) throw InputError(fmt::format("parameter '{}.chi_min' is {}; expected 0 or more", name, r.chi_min));
  if (!(r.degeneracy_tol >= 0))
    throw InputError(fmt::format("parameter '{}.degeneracy_tol' is {}; expected 0 (none) or a tolerance > 0", name, r.degeneracy_tol));
  if (r.chi_max < 1) throw InputError(fmt::format("parameter '{}.chi_max' is {}; expected at least 1", name, r.chi_max));
  if (r.svd_min < 0 || r.trunc_cut < 0)
    throw InputError(fmt::format("parameters '{0}.svd_min' and '{0}.trunc_cut' must be >= 0", name));
  return r;
}

Truncation truncate(const std::vector<std::vector<double>>& values, const TruncParams& p) {
  struct Entry {
    double s;
    std::size_t block;
    std::size_t index;
  };
  std::vector<Entry> all;
  double total = 0;
  for (std::size_t b = 0; b < values.size(); ++b)
    for (std::size_t i = 0; i < values[b].size(); ++i) {
      all.push_back({values[b][i], b, i});
      total += values[b][i] * values[b][i];
    }
  std::sort(all.begin(), all.end(), [](const Entry& x, const Entry& y) {
    if (x.s != y.s) return x.s > y.s;
    if (x.block != y.block) return x.block < y.block;
    return x.index < y.index;
  });
  const double norm = std::sqrt(total);
  const auto n = static_cast<std::int64_t>(all.size());
  // allowed[k]: may the cut keep the k largest values (k = 1..n)? Each constraint allows a set of
  // counts and is applied, in TeNPy's order, only if it leaves some count allowed; the cut then
  // keeps the largest allowed count.
  std::vector<char> allowed(static_cast<std::size_t>(n + 1), 1);
  if (n > 0) allowed[0] = 0;
  auto apply = [&](auto&& ok) {
    std::vector<char> both(allowed.size(), 0);
    bool any = false;
    for (std::int64_t k = 1; k <= n; ++k) any |= (both[k] = allowed[k] && ok(k));
    if (any) allowed = std::move(both);
  };
  auto s = [&](std::int64_t q) { return norm > 0 ? all[q].s / norm : 0.0; };
  apply([&](std::int64_t k) { return k <= p.chi_max; });
  if (p.chi_min > 1) apply([&](std::int64_t k) { return k >= p.chi_min; });
  if (p.degeneracy_tol > 0)  // not between values whose logs differ by less (k = n drops nothing)
    apply([&](std::int64_t k) { return k == n || (s(k) > 0 ? std::log(s(k - 1) / s(k)) >= p.degeneracy_tol : s(k - 1) > 0); });
  if (p.svd_min > 0 && norm > 0) apply([&](std::int64_t k) { return s(k - 1) >= p.svd_min; });
  if (norm > 0) {
    // At most c: the fewest values whose dropped tail's summed squares stay <= trunc_cut^2.
    std::int64_t c = n;
    double tail = 0;
    while (c > 0 && tail + s(c - 1) * s(c - 1) <= p.trunc_cut * p.trunc_cut) {
      tail += s(c - 1) * s(c - 1);
      --c;
    }
    apply([&](std::int64_t k) { return k <= c; });
  }
  std::int64_t keep = n;
  while (keep > 0 && !allowed[keep]) --keep;
  Truncation t;
  t.kept.assign(values.size(), 0);
  for (std::int64_t q = 0; q < keep; ++q) ++t.kept[all[q].block];
  // eps summed directly rather than as 1 - kept: the difference would lose a small eps's digits.
  if (norm > 0) {
    double disc = 0;
    for (std::int64_t q = n - 1; q >= keep; --q) disc += (all[q].s / norm) * (all[q].s / norm);
    t.discarded = disc;
  }
  return t;
}

}  // namespace qstage::stages::mps
