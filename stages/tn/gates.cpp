// The gate set: qsim's gates (lib/gates_qsim.h) and OpenQASM 2.0's qelib1.inc gates, as matrices
// in qstage's convention (first listed qubit most significant; see circuit.hpp).
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>

#include "core/error.hpp"
#include "stages/tn/circuit.hpp"

namespace qstage::tn {

namespace {

using M = std::vector<cd>;
using P = std::vector<double>;
const cd I(0, 1);
const double kIs2 = 0.7071067811865475;

M diag(std::initializer_list<cd> d) {
  const size_t n = d.size();
  M m(n * n, 0.0);
  size_t i = 0;
  for (cd v : d) m[i * n + i] = v, ++i;
  return m;
}

// block-diag(I, U): U applied to the trailing qubits when the first (control) qubit is 1.
M controlled(const M& u) {
  const size_t n = static_cast<size_t>(std::lround(std::sqrt(static_cast<double>(u.size()))));
  const size_t N = 2 * n;
  M m(N * N, 0.0);
  for (size_t i = 0; i < n; ++i) m[i * N + i] = 1.0;
  for (size_t r = 0; r < n; ++r)
    for (size_t c = 0; c < n; ++c) m[(n + r) * N + n + c] = u[r * n + c];
  return m;
}

M u3(double t, double p, double l) {
  return {std::cos(t / 2), -std::exp(I * l) * std::sin(t / 2), std::exp(I * p) * std::sin(t / 2),
          std::exp(I * (p + l)) * std::cos(t / 2)};
}
M rx(double a) { return {std::cos(a / 2), -I * std::sin(a / 2), -I * std::sin(a / 2), std::cos(a / 2)}; }
M ry(double a) { return {std::cos(a / 2), -std::sin(a / 2), std::sin(a / 2), std::cos(a / 2)}; }
M rz(double a) { return diag({std::exp(-I * (a / 2)), std::exp(I * (a / 2))}); }
M x() { return {0, 1, 1, 0}; }
M y() { return {0, -I, I, 0}; }
M z() { return diag({1, -1}); }
M h() { return {kIs2, kIs2, kIs2, -kIs2}; }
M sqrt_x() { return {cd(0.5, 0.5), cd(0.5, -0.5), cd(0.5, -0.5), cd(0.5, 0.5)}; }

struct Def {
  int arity, params;
  std::function<M(const P&)> make;
};

const std::map<std::string, Def, std::less<>>& table() {
  static const std::map<std::string, Def, std::less<>> t = {
      // one qubit (qsim and qelib1 names)
      {"id", {1, 0, [](const P&) { return diag({1, 1}); }}},
      {"id1", {1, 0, [](const P&) { return diag({1, 1}); }}},
      {"h", {1, 0, [](const P&) { return h(); }}},
      {"x", {1, 0, [](const P&) { return x(); }}},
      {"y", {1, 0, [](const P&) { return y(); }}},
      {"z", {1, 0, [](const P&) { return z(); }}},
      {"s", {1, 0, [](const P&) { return diag({1, I}); }}},
      {"sdg", {1, 0, [](const P&) { return diag({1, -I}); }}},
      {"t", {1, 0, [](const P&) { return diag({1, std::exp(I * (M_PI / 4))}); }}},
      {"tdg", {1, 0, [](const P&) { return diag({1, std::exp(-I * (M_PI / 4))}); }}},
      {"x_1_2", {1, 0, [](const P&) { return sqrt_x(); }}},
      {"sx", {1, 0, [](const P&) { return sqrt_x(); }}},
      {"sxdg", {1, 0, [](const P&) { return M{cd(0.5, -0.5), cd(0.5, 0.5), cd(0.5, 0.5), cd(0.5, -0.5)}; }}},
      {"y_1_2", {1, 0, [](const P&) { return M{cd(0.5, 0.5), cd(-0.5, -0.5), cd(0.5, 0.5), cd(0.5, 0.5)}; }}},
      {"hz_1_2", {1, 0, [](const P&) { return M{cd(0.5, 0.5), cd(0, -kIs2), cd(kIs2, 0), cd(0.5, 0.5)}; }}},
      {"rx", {1, 1, [](const P& p) { return rx(p[0]); }}},
      {"ry", {1, 1, [](const P& p) { return ry(p[0]); }}},
      {"rz", {1, 1, [](const P& p) { return rz(p[0]); }}},
      {"rxy", {1, 2, [](const P& p) {  // qsim: rotation about an axis in the XY plane
         const double cp = std::cos(p[1] / 2), sp = -std::sin(p[1] / 2);
         const double ct = std::cos(p[0]) * sp, st = std::sin(p[0]) * sp;
         return M{cp, cd(st, ct), cd(-st, ct), cp};
       }}},
      {"u3", {1, 3, [](const P& p) { return u3(p[0], p[1], p[2]); }}},
      {"u", {1, 3, [](const P& p) { return u3(p[0], p[1], p[2]); }}},
      {"U", {1, 3, [](const P& p) { return u3(p[0], p[1], p[2]); }}},
      {"u2", {1, 2, [](const P& p) { return u3(M_PI / 2, p[0], p[1]); }}},
      {"u1", {1, 1, [](const P& p) { return diag({1, std::exp(I * p[0])}); }}},
      {"p", {1, 1, [](const P& p) { return diag({1, std::exp(I * p[0])}); }}},
      // two qubits
      {"id2", {2, 0, [](const P&) { return diag({1, 1, 1, 1}); }}},
      {"cx", {2, 0, [](const P&) { return controlled(x()); }}},
      {"cnot", {2, 0, [](const P&) { return controlled(x()); }}},
      {"CX", {2, 0, [](const P&) { return controlled(x()); }}},
      {"cy", {2, 0, [](const P&) { return controlled(y()); }}},
      {"cz", {2, 0, [](const P&) { return diag({1, 1, 1, -1}); }}},
      {"ch", {2, 0, [](const P&) { return controlled(h()); }}},
      {"swap", {2, 0, [](const P&) { return M{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1}; }}},
      {"sw", {2, 0, [](const P&) { return M{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1}; }}},
      {"is", {2, 0, [](const P&) { return M{1, 0, 0, 0, 0, 0, I, 0, 0, I, 0, 0, 0, 0, 0, 1}; }}},
      {"fs", {2, 2, [](const P& p) {  // qsim's fSim(theta, phi)
         const double c = std::cos(p[0]), s = std::sin(p[0]);
         return M{1, 0, 0, 0, 0, c, -I * s, 0, 0, -I * s, c, 0, 0, 0, 0, std::exp(-I * p[1])};
       }}},
      {"cp_qsim", {2, 1, [](const P& p) { return diag({1, 1, 1, std::exp(-I * p[0])}); }}},
      {"cu1", {2, 1, [](const P& p) { return diag({1, 1, 1, std::exp(I * p[0])}); }}},
      {"crx", {2, 1, [](const P& p) { return controlled(rx(p[0])); }}},
      {"cry", {2, 1, [](const P& p) { return controlled(ry(p[0])); }}},
      {"crz", {2, 1, [](const P& p) { return controlled(rz(p[0])); }}},
      {"cu3", {2, 3, [](const P& p) { return controlled(u3(p[0], p[1], p[2])); }}},
      {"rzz", {2, 1, [](const P& p) {  // exp(-i theta/2 Z(x)Z)
         const cd a = std::exp(-I * (p[0] / 2)), b = std::exp(I * (p[0] / 2));
         return diag({a, b, b, a});
       }}},
      {"rxx", {2, 1, [](const P& p) {  // exp(-i theta/2 X(x)X)
         const cd c = std::cos(p[0] / 2), s = -I * std::sin(p[0] / 2);
         return M{c, 0, 0, s, 0, c, s, 0, 0, s, c, 0, s, 0, 0, c};
       }}},
      // three qubits
      {"ccx", {3, 0, [](const P&) { return controlled(controlled(x())); }}},
      {"cswap", {3, 0, [](const P&) {
         return controlled(M{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1});
       }}},
  };
  return t;
}

}  // namespace

int gate_arity(std::string_view name) {
  auto it = table().find(name);
  return it == table().end() ? 0 : it->second.arity;
}

int gate_param_count(std::string_view name) {
  auto it = table().find(name);
  return it == table().end() ? -1 : it->second.params;
}

std::vector<cd> gate_matrix(std::string_view name, const std::vector<double>& params, std::string_view what) {
  auto it = table().find(name);
  if (it == table().end()) throw InputError(fmt::format("{}: unknown gate '{}'", what, name));
  if (static_cast<int>(params.size()) != it->second.params)
    throw InputError(fmt::format("{}: gate '{}' takes {} parameter(s), got {}", what, name, it->second.params,
                                 params.size()));
  return it->second.make(params);
}

}  // namespace qstage::tn
