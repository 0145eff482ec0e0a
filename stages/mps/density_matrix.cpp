#include "stages/mps/density_matrix.hpp"

#include <map>
#include <stdexcept>

#include "kernels/mps/u1_math.hpp"

namespace qstage::stages::mps {
namespace {

using Env = std::map<int, std::vector<cplx>>;  // per charge key: a vector over the bond's sector

// The weight of site j's local index (n_ket, n_bra) in a contraction: w(n) for n_ket = n_bra = n, else 0.
template <class W>
Env grow_left(const U1Mps& psi, int j, const Env& e, W w) {
  const kernels::ChargeRule rule = psi.rule();
  Env next;
  for (const Block& b : psi.sites[j].blocks) {
    const int s = rule.local(b.c_left, b.c_right);
    if (s / psi.d != s % psi.d) continue;
    const double f = w(s / psi.d);
    if (f == 0) continue;
    const auto it = e.find(b.c_left);
    if (it == e.end()) continue;
    auto& dst = next[b.c_right];
    if (dst.empty()) dst.assign(static_cast<std::size_t>(b.cols), cplx{});
    for (std::int64_t r = 0; r < b.rows; ++r) {
      const cplx x = it->second[r] * f;
      if (x == cplx{}) continue;
      for (std::int64_t c = 0; c < b.cols; ++c) dst[c] += x * b.values[r * b.cols + c];
    }
  }
  return next;
}

Env grow_right(const U1Mps& psi, int j, const Env& e) {
  const kernels::ChargeRule rule = psi.rule();
  Env next;
  for (const Block& b : psi.sites[j].blocks) {
    const int s = rule.local(b.c_left, b.c_right);
    if (s / psi.d != s % psi.d) continue;
    const auto it = e.find(b.c_right);
    if (it == e.end()) continue;
    auto& dst = next[b.c_left];
    if (dst.empty()) dst.assign(static_cast<std::size_t>(b.rows), cplx{});
    for (std::int64_t r = 0; r < b.rows; ++r) {
      cplx acc{};
      for (std::int64_t c = 0; c < b.cols; ++c) acc += b.values[r * b.cols + c] * it->second[c];
      dst[r] += acc;
    }
  }
  return next;
}

double dot(const Env& l, const Env& r) {
  cplx sum{};
  for (const auto& [c, v] : l) {
    const auto it = r.find(c);
    if (it == r.end()) continue;
    for (std::size_t i = 0; i < v.size(); ++i) sum += v[i] * it->second[i];
  }
  return sum.real();
}

// Bond 0's lambda as a left environment (one index per pair).
Env boundary(const U1Mps& psi) {
  Env e;
  const Bond& b0 = psi.bonds[0];
  for (std::int64_t i = 0; i < b0.size(); ++i) e[b0.charges[i]] = {cplx{b0.lambda[i], 0.0}};
  return e;
}

void require_pair(const U1Mps& psi) {
  if (!psi.pair()) throw std::logic_error("mps: trace measurements need an n_pair (density matrix) state");
}

}  // namespace

TraceMeasurements trace_measurements(const U1Mps& psi, int bond) {
  require_pair(psi);
  const int L = psi.L;
  auto one = [](int) { return 1.0; };
  // Right environments R[k] (bond k), left ones Lf[k].
  std::vector<Env> right(static_cast<std::size_t>(L + 1)), left(static_cast<std::size_t>(L + 1));
  right[L] = {{0, {cplx{1.0, 0.0}}}};
  for (int j = L - 1; j >= 0; --j) right[j] = grow_right(psi, j, right[j + 1]);
  left[0] = boundary(psi);
  for (int j = 0; j < L; ++j) left[j + 1] = grow_left(psi, j, left[j], one);
  TraceMeasurements m;
  const double t = dot(left[0], right[0]);
  m.trace = psi.weight * t;
  for (int j = 0; j < L; ++j)
    m.density.push_back(dot(grow_left(psi, j, left[j], [](int n) { return static_cast<double>(n); }), right[j + 1]) / t);
  m.totals.assign(static_cast<std::size_t>(psi.total_charge + 1), 0.0);
  m.left.assign(static_cast<std::size_t>(psi.total_charge + 1), 0.0);
  const Bond& b0 = psi.bonds[0];
  for (std::int64_t i = 0; i < b0.size(); ++i) {
    const int key = b0.charges[i], n = kernels::pair_ket(key);
    if (n != kernels::pair_bra(key)) continue;  // off-diagonal in N: no trace
    Env e{{key, {cplx{b0.lambda[i], 0.0}}}};
    m.totals.at(n) += dot(e, right[0]) / t;
    for (int j = 0; j < bond; ++j) e = grow_left(psi, j, e, one);
    for (const auto& [c, v] : e) {
      Env single{{c, v}};
      m.left.at(n - kernels::pair_ket(c)) += dot(single, right[bond]) / t;
    }
  }
  return m;
}

double pattern_probability(const U1Mps& psi, const std::vector<int>& n) {
  require_pair(psi);
  if (static_cast<int>(n.size()) != psi.L) throw std::invalid_argument("mps: a pattern needs L occupations");
  Env e = boundary(psi), trace = boundary(psi);
  for (int j = 0; j < psi.L; ++j) {
    e = grow_left(psi, j, e, [&](int k) { return k == n[j] ? 1.0 : 0.0; });
    trace = grow_left(psi, j, trace, [](int) { return 1.0; });
  }
  const Env end{{0, {cplx{1.0, 0.0}}}};
  return dot(e, end) / dot(trace, end);
}

}  // namespace qstage::stages::mps
