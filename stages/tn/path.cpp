#include "stages/tn/path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"

namespace qstage::tn {

using nlohmann::json;

json PathCost::to_json(bool complex) const {
  return {{"C_t_multiply_adds", multiply_adds},
          {"C_s_elements", largest},
          {"C_m_elements", moved},
          {"slices", slices},
          {"flops_total", total_flops(complex)},
          {"flop_convention", complex ? "8 real flops per complex multiply-add" : "2 flops per multiply-add"},
          {"log10_C_t", std::log10(std::max(multiply_adds, 1.0))},
          {"log2_C_s", std::log2(std::max(largest, 1.0))}};
}

namespace {

// Which modes survive a contraction: those in the output or in another remaining tensor.
struct ModeUse {
  ModeMap<int> live;  // mode -> live tensors holding it
  std::set<Mode> output;
};

std::vector<Mode> result_modes(const std::vector<Mode>& a, const std::vector<Mode>& b, const ModeUse& use,
                               const std::set<Mode>& sliced) {
  std::vector<Mode> out;
  auto keep = [&](Mode m, int here) {
    if (sliced.count(m)) return false;
    return use.output.count(m) || use.live.at(m) > here;
  };
  for (Mode m : a) {
    const bool in_b = std::find(b.begin(), b.end(), m) != b.end();
    if (keep(m, in_b ? 2 : 1)) out.push_back(m);
  }
  for (Mode m : b)
    if (std::find(a.begin(), a.end(), m) == a.end() && keep(m, 1)) out.push_back(m);
  return out;
}

double elements(const Network& n, const std::vector<Mode>& modes, const std::set<Mode>& sliced) {
  double s = 1;
  for (Mode m : modes)
    if (!sliced.count(m)) s *= static_cast<double>(n.extent.at(m));
  return s;
}

double union_elements(const Network& n, const std::vector<Mode>& a, const std::vector<Mode>& b,
                      const std::set<Mode>& sliced) {
  double s = elements(n, a, sliced);
  for (Mode m : b)
    if (std::find(a.begin(), a.end(), m) == a.end() && !sliced.count(m)) s *= static_cast<double>(n.extent.at(m));
  return s;
}

ModeUse initial_use(const Network& n) {
  ModeUse u;
  u.output.insert(n.output.begin(), n.output.end());
  for (const auto& t : n.tensors)
    for (Mode m : t.modes) u.live[m]++;
  return u;
}

}  // namespace

std::vector<std::vector<Mode>> intermediate_modes(const Network& n, const Path& p) {
  const size_t N = n.tensors.size();
  if (N == 0) throw InputError("the network has no tensors");
  if (p.ssa.size() != N - 1)
    throw InputError(fmt::format("the path has {} steps; a network of {} tensors needs {} (a path that does not "
                                 "match the network?)", p.ssa.size(), N, N - 1));
  std::set<Mode> sliced(p.sliced.begin(), p.sliced.end());
  for (Mode m : sliced)
    if (!n.extent.count(m)) throw InputError(fmt::format("sliced mode {} is not a mode of the network", m));
  ModeUse use = initial_use(n);
  std::vector<std::vector<Mode>> modes;
  for (const auto& t : n.tensors) modes.push_back(t.modes);
  std::vector<bool> used(2 * N - 1, false);
  std::vector<std::vector<Mode>> out;
  for (size_t s = 0; s < p.ssa.size(); ++s) {
    const auto [a, b] = p.ssa[s];
    const int limit = static_cast<int>(N + s);
    for (int id : {a, b})
      if (id < 0 || id >= limit || used[static_cast<size_t>(id)])
        throw InputError(fmt::format("path step {} uses id {}, which is {} (a path that does not match the network?)", s,
                                     id, id < 0 || id >= limit ? "not defined yet" : "already consumed"));
    if (a == b) throw InputError(fmt::format("path step {} contracts id {} with itself", s, a));
    used[static_cast<size_t>(a)] = used[static_cast<size_t>(b)] = true;
    const auto& A = modes[static_cast<size_t>(a)];
    const auto& B = modes[static_cast<size_t>(b)];
    auto C = result_modes(A, B, use, sliced);
    for (Mode m : A) use.live[m]--;
    for (Mode m : B) use.live[m]--;
    for (Mode m : C) use.live[m]++;
    modes.push_back(C);
    out.push_back(C);
  }
  return out;
}

PathCost path_cost(const Network& n, const Path& p) { return path_cost(n, p, intermediate_modes(n, p)); }

PathCost path_cost(const Network& n, const Path& p, const std::vector<std::vector<Mode>>& inter) {
  std::set<Mode> sliced(p.sliced.begin(), p.sliced.end());
  std::vector<std::vector<Mode>> modes;
  for (const auto& t : n.tensors) modes.push_back(t.modes);
  modes.insert(modes.end(), inter.begin(), inter.end());
  PathCost c;
  for (const auto& t : n.tensors) c.largest = std::max(c.largest, elements(n, t.modes, sliced));
  for (size_t s = 0; s < p.ssa.size(); ++s) {
    const auto& A = modes[static_cast<size_t>(p.ssa[s].first)];
    const auto& B = modes[static_cast<size_t>(p.ssa[s].second)];
    const double size_c = elements(n, inter[s], sliced);
    c.multiply_adds += union_elements(n, A, B, sliced);
    c.largest = std::max(c.largest, size_c);
    c.moved += elements(n, A, sliced) + elements(n, B, sliced) + size_c;
  }
  for (Mode m : sliced) c.slices *= static_cast<double>(n.extent.at(m));
  return c;
}

// ------------------------------------------------------------------------------ imports
Path path_from_ssa(const json& steps, std::size_t inputs, const std::string& what) {
  if (!steps.is_array()) throw InputError(fmt::format("{}: an SSA path must be a list of id lists", what));
  // A step of k operands makes one SSA id; as pairs it makes k-1 ids: map SSA ids to ours.
  std::vector<int> ours(inputs);
  for (size_t i = 0; i < inputs; ++i) ours[i] = static_cast<int>(i);
  int next = static_cast<int>(inputs);
  Path p;
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto& step = steps[s];
    if (!step.is_array() || step.size() < 2)
      throw InputError(fmt::format("{}: step {} is {}; expected a list of at least two ids", what, s, step.dump()));
    std::vector<int> operands;
    for (const auto& x : step) {
      const int id = x.get<int>();
      if (id < 0 || id >= static_cast<int>(ours.size()))
        throw InputError(fmt::format("{}: step {} uses id {}, which is not defined yet (a path that does not match the "
                                     "network?)", what, s, id));
      operands.push_back(ours[static_cast<size_t>(id)]);
    }
    int acc = operands[0];
    for (size_t k = 1; k < operands.size(); ++k) {
      p.ssa.push_back({acc, operands[k]});
      acc = next++;
    }
    ours.push_back(acc);
  }
  return p;
}

Path path_from_linear(const json& steps, std::size_t inputs, const std::string& what) {
  if (!steps.is_array()) throw InputError(fmt::format("{}: a linear path must be a list of position lists", what));
  std::vector<int> ids(inputs);
  for (size_t i = 0; i < inputs; ++i) ids[i] = static_cast<int>(i);
  int next = static_cast<int>(inputs);
  Path p;
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto& step = steps[s];
    if (!step.is_array() || step.empty())
      throw InputError(fmt::format("{}: step {} is {}; expected a list of positions", what, s, step.dump()));
    std::vector<int> pos;
    for (const auto& x : step) pos.push_back(x.get<int>());
    for (int q : pos)
      if (q < 0 || q >= static_cast<int>(ids.size()))
        throw InputError(fmt::format("{}: step {} names position {}, but only {} operands remain (a path that does not "
                                     "match the network?)", what, s, q, ids.size()));
    std::vector<int> operands;
    for (int q : pos) operands.push_back(ids[static_cast<size_t>(q)]);
    std::sort(pos.begin(), pos.end(), std::greater<>());
    if (std::adjacent_find(pos.begin(), pos.end()) != pos.end())
      throw InputError(fmt::format("{}: step {} names a position twice", what, s));
    for (int q : pos) ids.erase(ids.begin() + q);
    if (operands.size() == 1) {
      ids.push_back(operands[0]);  // a single-operand step (a trace or a no-op): nothing to pair
      continue;
    }
    int acc = operands[0];
    for (size_t k = 1; k < operands.size(); ++k) {
      p.ssa.push_back({acc, operands[k]});
      acc = next++;
    }
    ids.push_back(acc);
  }
  return p;
}

}  // namespace qstage::tn
