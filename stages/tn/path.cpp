#include "stages/tn/path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <queue>

#include "core/error.hpp"
#include "kernels/common.hpp"

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
  std::map<Mode, int> live;  // mode -> live tensors holding it
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

PathCost path_cost(const Network& n, const Path& p) {
  const auto inter = intermediate_modes(n, p);
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

// ------------------------------------------------------------------------------ greedy
namespace {

struct Candidate {
  double score;
  int a, b;
  bool operator>(const Candidate& o) const {
    if (score != o.score) return score > o.score;
    return std::tie(a, b) > std::tie(o.a, o.b);  // deterministic ties
  }
};

struct Uniform {
  std::uint64_t state;
  double next() {
    state += kernels::kGolden;
    return (static_cast<double>(kernels::splitmix64(state) >> 11) + 0.5) * 0x1p-53;
  }
};

// One greedy pass. The score of a pair is cotengra's: |ab|/costmod - (|a| + |b|) * costmod, and with a
// temperature, sign(score) * log|score| minus Gumbel noise. Restarts sample costmod and temperature, which is
// what lets randomized greedy find good paths for deep circuits (plain greedy is orders of magnitude worse).
Path greedy_once(const Network& n, double costmod, double temperature, std::uint64_t seed) {
  const size_t N = n.tensors.size();
  const std::set<Mode> none;
  ModeUse use = initial_use(n);
  std::vector<std::vector<Mode>> modes;
  std::vector<double> size;
  for (const auto& t : n.tensors) {
    modes.push_back(t.modes);
    size.push_back(elements(n, t.modes, none));
  }
  std::vector<bool> alive(N, true);
  std::map<Mode, std::vector<int>> holders;  // mode -> live ids holding it
  for (size_t t = 0; t < N; ++t)
    for (Mode m : modes[t]) holders[m].push_back(static_cast<int>(t));
  Uniform rng{kernels::splitmix64(seed)};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int a, int b) {
    if (a > b) std::swap(a, b);
    const auto c = result_modes(modes[static_cast<size_t>(a)], modes[static_cast<size_t>(b)], use, none);
    double score = elements(n, c, none) / costmod - (size[static_cast<size_t>(a)] + size[static_cast<size_t>(b)]) * costmod;
    if (temperature > 0) {
      const double gumbel = -std::log(-std::log(rng.next()));
      score = (score > 0 ? std::log(score) : score < 0 ? -std::log(-score) : 0.0) - temperature * gumbel;
    }
    heap.push({score, a, b});
  };
  for (const auto& [m, ids] : holders)
    if (ids.size() == 2) push(ids[0], ids[1]);
  Path p;
  size_t live = N;
  while (live > 1) {
    int a = -1, b = -1;
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (alive[static_cast<size_t>(c.a)] && alive[static_cast<size_t>(c.b)]) {
        a = c.a;
        b = c.b;
        break;
      }
    }
    if (a < 0) {  // no shared modes left: outer product of the two smallest tensors
      std::vector<int> ids;
      for (size_t t = 0; t < modes.size(); ++t)
        if (alive[t]) ids.push_back(static_cast<int>(t));
      std::sort(ids.begin(), ids.end(), [&](int x, int y) { return size[static_cast<size_t>(x)] < size[static_cast<size_t>(y)]; });
      a = std::min(ids[0], ids[1]);
      b = std::max(ids[0], ids[1]);
    }
    auto c = result_modes(modes[static_cast<size_t>(a)], modes[static_cast<size_t>(b)], use, none);
    for (Mode m : modes[static_cast<size_t>(a)]) use.live[m]--;
    for (Mode m : modes[static_cast<size_t>(b)]) use.live[m]--;
    for (Mode m : c) use.live[m]++;
    alive[static_cast<size_t>(a)] = alive[static_cast<size_t>(b)] = false;
    const int id = static_cast<int>(modes.size());
    p.ssa.push_back({a, b});
    modes.push_back(c);
    size.push_back(elements(n, c, none));
    alive.push_back(true);
    --live;
    for (Mode m : c) {
      auto& ids = holders[m];
      ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int t) { return !alive[static_cast<size_t>(t)]; }), ids.end());
      ids.push_back(id);
      for (int other : ids)
        if (other != id) push(other, id);
    }
    for (Mode m : modes[static_cast<size_t>(a)]) {  // modes contracted away
      auto& ids = holders[m];
      ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int t) { return !alive[static_cast<size_t>(t)]; }), ids.end());
    }
    for (Mode m : modes[static_cast<size_t>(b)]) {
      auto& ids = holders[m];
      ids.erase(std::remove_if(ids.begin(), ids.end(), [&](int t) { return !alive[static_cast<size_t>(t)]; }), ids.end());
    }
  }
  return p;
}

}  // namespace

Path greedy_path(const Network& n, const GreedyOptions& o, GreedyReport* report) {
  if (n.tensors.size() < 2) return {};
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  Path best;
  PathCost best_cost;
  bool have = false, best_within = false;
  double best_costmod = 1, best_temperature = 0;
  int tries = 0;
  while (tries < std::max(1, o.max_tries) && (tries == 0 || seconds() < o.max_seconds)) {
    // The first try is plain greedy. Restarts draw costmod uniformly from [0.1, 4] and the temperature
    // log-uniformly from [0.001, max temperature], as cotengra's random-greedy does; after 16 tries, every other restart instead
    // perturbs the best parameters so far (a cheap stand-in for cotengra's hyper-optimizer).
    double costmod = 1, temperature = 0;
    if (tries > 0) {
      Uniform draw{kernels::splitmix64(o.seed ^ (0x9e37ull * static_cast<std::uint64_t>(tries)))};
      const double log_t_min = std::log(0.001), log_t_max = std::log(o.temperature);
      if (tries > 16 && tries % 2 == 0 && best_temperature > 0) {
        const double step_c = draw.next() + draw.next() - 1, step_t = draw.next() + draw.next() - 1;  // in (-1, 1)
        costmod = std::clamp(best_costmod * std::exp(0.5 * step_c), 0.1, 4.0);
        temperature = std::exp(std::clamp(std::log(best_temperature) + step_t, log_t_min, log_t_max));
      } else {
        costmod = 0.1 + 3.9 * draw.next();
        temperature = std::exp(log_t_min + (log_t_max - log_t_min) * draw.next());
      }
    }
    const Path p = greedy_once(n, costmod, temperature, o.seed + static_cast<std::uint64_t>(tries));
    const PathCost c = path_cost(n, p);
    const bool within = c.largest <= o.cap_elements;
    bool better = !have;
    if (have) {
      if (within != best_within) better = within;
      else if (within) better = c.multiply_adds < best_cost.multiply_adds;
      else better = c.largest < best_cost.largest || (c.largest == best_cost.largest && c.multiply_adds < best_cost.multiply_adds);
    }
    if (better) {
      best_costmod = costmod;
      best_temperature = temperature;
      best = p;
      best_cost = c;
      best_within = within;
      have = true;
    }
    ++tries;
  }
  if (report) *report = {tries, best_within, seconds()};
  return best;
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
