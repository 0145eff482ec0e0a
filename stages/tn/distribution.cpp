#include "stages/tn/distribution.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace qstage::tn {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

double elements(const Network& net, const std::vector<Mode>& modes) {
  double n = 1;
  for (Mode m : modes) n *= static_cast<double>(net.extent.at(m));
  return n;
}

bool contains(const std::vector<Mode>& modes, Mode m) { return std::find(modes.begin(), modes.end(), m) != modes.end(); }

// The contiguous blocks a rank holds of a tensor with layout `layout` sharded over `d`: the modes
// left of the last distributed one, except the distributed ones, number them; the modes right of
// it make one block.
struct Blocks {
  double count = 1, bytes = 0;
};
Blocks blocks_of(const Network& net, const std::vector<Mode>& layout, const std::vector<Mode>& d, std::uint64_t element_bytes) {
  std::size_t last = 0;
  for (std::size_t i = 0; i < layout.size(); ++i)
    if (contains(d, layout[i])) last = i;
  Blocks b;
  double tail = static_cast<double>(element_bytes);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const double e = static_cast<double>(net.extent.at(layout[i]));
    if (i > last) tail *= e;
    else if (!contains(d, layout[i])) b.count *= e;
  }
  b.bytes = tail;
  return b;
}

// Eq. 7, for a reshuffle or a gather of `layout` sharded over `d`.
double move_seconds(const Network& net, const std::vector<Mode>& layout, const std::vector<Mode>& d, const DistributionOptions& o,
                    std::int64_t* blocks = nullptr) {
  const double bytes = elements(net, layout) * static_cast<double>(o.element_bytes), p = o.ranks;
  const Blocks b = blocks_of(net, layout, d, o.element_bytes);
  if (blocks) *blocks = static_cast<std::int64_t>(std::min(b.count, 9.2e18));
  return bytes * (p - 1) / (p * o.net_bandwidth) + b.count * std::max(o.latency, b.bytes / o.net_bandwidth);
}

// Eq. 6 per rank: the step's work and traffic split over `ranks`.
double gemm_seconds(const Network& net, const PlanStep& st, int ranks, const DistributionOptions& o) {
  const double rw = (elements(net, st.a_modes) + elements(net, st.b_modes) + elements(net, st.c_modes)) * static_cast<double>(o.element_bytes);
  return std::max(rw / ranks / o.device_bandwidth, st.flops / ranks / o.device_rate);
}

// Out of core: the seconds a rank's shard of a tensor of `elements` takes to cross once between
// host and device memory where the executor holds it on the host (a shard it cannot hold beside
// the rest of its budget: counted from half of it), else 0.
double host_crossing(double elements, const DistributionOptions& o) {
  if (o.host_bandwidth <= 0) return 0;
  const double shard = elements * static_cast<double>(o.element_bytes) / o.ranks;
  return shard > static_cast<double>(o.device_bytes) / 2 ? shard / o.host_bandwidth : 0;
}

// Eq. 6 for the chain's step i, and out of core its shards' crossings: the result's out, the
// chain operand's (the previous chain step's result) in.
double chain_step_seconds(const Network& net, const std::vector<PlanStep>& steps, const std::vector<int>& chain, std::size_t i,
                          const DistributionOptions& o) {
  const PlanStep& st = steps[static_cast<std::size_t>(chain[i])];
  double t = gemm_seconds(net, st, o.ranks, o) + host_crossing(elements(net, st.c_modes), o);
  if (i > 0) t += host_crossing(elements(net, steps[static_cast<std::size_t>(chain[i - 1])].c_modes), o);
  return t;
}

// Eq. 7 for resharding `layout` from `d`, and out of core its shard's crossings: in to be sent,
// and out again where the new shard is held on the host too (not for a gather: replicated
// tensors stay on the device).
double reshard_seconds(const Network& net, const std::vector<Mode>& layout, const std::vector<Mode>& d, bool gather,
                       const DistributionOptions& o, std::int64_t* blocks = nullptr) {
  return move_seconds(net, layout, d, o, blocks) + (gather ? 1 : 2) * host_crossing(elements(net, layout), o);
}

// Whether the chain's step i may keep `d` (inherited) as its result's distributed modes: out of
// core, only where the result's slots fit (else it redistributes, or the chain ends).
bool slots_fit(const Network& net, const PlanStep& st, const std::vector<Mode>& d, const DistributionOptions& o) {
  const double limit = slot_elements(o);
  return std::isinf(limit) || elements(net, st.c_modes) / elements(net, d) <= limit;
}

// Whether the chain's step i may leave `d` distributed: the next step contracts none of it.
bool survives_next(const std::vector<PlanStep>& steps, const std::vector<int>& chain, std::size_t i, const std::vector<Mode>& d) {
  if (i + 1 >= chain.size()) return true;
  const std::vector<Mode>& next = steps[static_cast<std::size_t>(chain[i + 1])].c_modes;
  return std::all_of(d.begin(), d.end(), [&](Mode m) { return contains(next, m); });
}

// One state of the programme at a chain step: the distributed modes and how they were reached.
struct State {
  std::vector<Mode> d;
  double cost = kInfinity;
  int from = -1;  // the previous step's state
  bool redistributed = false, forced = false;
};

}  // namespace

std::vector<Mode> leading_prefix(const Network& net, const std::vector<Mode>& layout, int ranks, double slot_elements) {
  const double total = elements(net, layout);
  std::vector<Mode> d;
  double product = 1;
  for (Mode m : layout) {
    if (product >= ranks && total / product <= slot_elements) break;
    d.push_back(m);
    product *= static_cast<double>(net.extent.at(m));
  }
  return d;
}

double slot_elements(std::uint64_t slot_bytes, std::uint64_t element_bytes) {
  if (slot_bytes == ~std::uint64_t{0}) return std::numeric_limits<double>::infinity();
  return static_cast<double>(slot_bytes) / static_cast<double>(element_bytes);
}

const char* transition_name(Transition t) {
  switch (t) {
    case Transition::local: return "local";
    case Transition::activate: return "activate";
    case Transition::keep: return "keep";
    case Transition::redistribute: return "redistribute";
    case Transition::gather: return "gather";
  }
  return "?";
}

std::vector<std::vector<int>> use_chains(const Network& net, const std::vector<PlanStep>& steps, const DistributionOptions& o) {
  std::map<int, int> consumer;  // tensor id -> the step that reads it
  for (std::size_t s = 0; s < steps.size(); ++s) consumer[steps[s].a] = consumer[steps[s].b] = static_cast<int>(s);
  auto large = [&](const PlanStep& st) {
    const double limit = static_cast<double>(o.large_bytes) / static_cast<double>(o.element_bytes);
    return std::max({elements(net, st.a_modes), elements(net, st.b_modes), elements(net, st.c_modes)}) >= limit;
  };
  std::vector<bool> taken(steps.size(), false);
  std::vector<std::vector<int>> chains;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    if (taken[s] || !large(steps[s])) continue;
    std::vector<int> chain{static_cast<int>(s)};
    taken[s] = true;
    // Up through the consumers while they are large and no earlier chain has reached them.
    for (auto it = consumer.find(steps[s].c); it != consumer.end(); it = consumer.find(steps[static_cast<std::size_t>(chain.back())].c)) {
      const auto next = static_cast<std::size_t>(it->second);
      if (taken[next] || !large(steps[next])) break;
      chain.push_back(it->second);
      taken[next] = true;
    }
    chains.push_back(std::move(chain));
  }
  return chains;
}

double chain_cost(const Network& net, const std::vector<PlanStep>& steps, const std::vector<int>& chain,
                  const std::vector<bool>& redistribute, const DistributionOptions& o) {
  double cost = 0;
  std::vector<Mode> d;
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const PlanStep& st = steps[static_cast<std::size_t>(chain[i])];
    cost += chain_step_seconds(net, steps, chain, i, o);
    if (i == 0) {
      d = leading_prefix(net, st.c_modes, o.ranks, slot_elements(o));
    } else if (redistribute[i]) {
      cost += reshard_seconds(net, st.c_modes, d, false, o);
      d = leading_prefix(net, st.c_modes, o.ranks, slot_elements(o));
    } else if (!slots_fit(net, st, d, o)) {
      return kInfinity;
    }
    if (!survives_next(steps, chain, i, d)) return kInfinity;
  }
  return cost + reshard_seconds(net, steps[static_cast<std::size_t>(chain.back())].c_modes, d, true, o);
}

namespace {

// The programme on one chain: fills plan.steps for it and returns chain.size(), or, where no
// distributed-mode set survives to the step after step i (both keeping and reshuffling leave a
// mode that step contracts), returns i + 1: the chain must end with a gather after step i.
std::size_t solve_chain(const Network& net, const std::vector<PlanStep>& steps, const std::vector<int>& chain,
                        const DistributionOptions& o, DistributionPlan& plan) {
  // states[i]: the distributed-mode sets the chain's step i can leave, with their best cost.
  std::vector<std::vector<State>> states(chain.size());
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const PlanStep& st = steps[static_cast<std::size_t>(chain[i])];
    const double gemm = chain_step_seconds(net, steps, chain, i, o);
    const std::vector<Mode> fresh = leading_prefix(net, st.c_modes, o.ranks, slot_elements(o));
    auto offer = [&](State s) {
      if (!survives_next(steps, chain, i, s.d)) return;
      for (State& t : states[i])
        if (t.d == s.d) {
          if (s.cost < t.cost) t = std::move(s);
          return;
        }
      states[i].push_back(std::move(s));
    };
    if (i == 0) {
      offer({fresh, gemm, -1, false, false});
    } else {
      for (std::size_t k = 0; k < states[i - 1].size(); ++k) {
        const State& prev = states[i - 1][k];
        const bool keep_ok = survives_next(steps, chain, i, prev.d) && slots_fit(net, st, prev.d, o);
        if (slots_fit(net, st, prev.d, o)) offer({prev.d, prev.cost + gemm, static_cast<int>(k), false, false});
        offer({fresh, prev.cost + gemm + reshard_seconds(net, st.c_modes, prev.d, false, o), static_cast<int>(k), true, !keep_ok});
      }
    }
    if (states[i].empty()) return i + 1;
  }
  // The last step's result is gathered; pick the cheapest ending and trace it back.
  const std::vector<Mode>& last_layout = steps[static_cast<std::size_t>(chain.back())].c_modes;
  int best = -1;
  double best_cost = kInfinity;
  for (std::size_t k = 0; k < states.back().size(); ++k) {
    const double c = states.back()[k].cost + reshard_seconds(net, last_layout, states.back()[k].d, true, o);
    if (c < best_cost) best_cost = c, best = static_cast<int>(k);
  }
  for (int i = static_cast<int>(chain.size()) - 1, k = best; i >= 0; k = states[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)].from, --i) {
    const State& s = states[static_cast<std::size_t>(i)][static_cast<std::size_t>(k)];
    const PlanStep& st = steps[static_cast<std::size_t>(chain[static_cast<std::size_t>(i)])];
    DistributedStep& out = plan.steps[static_cast<std::size_t>(chain[static_cast<std::size_t>(i)])];
    out.distributed = s.d;
    out.compute_seconds = chain_step_seconds(net, steps, chain, static_cast<std::size_t>(i), o);
    out.transition = i == 0 ? Transition::activate : s.redistributed ? Transition::redistribute : Transition::keep;
    out.forced = s.forced;
    if (s.redistributed) {
      const State& prev = states[static_cast<std::size_t>(i - 1)][static_cast<std::size_t>(s.from)];
      out.comm_seconds = reshard_seconds(net, st.c_modes, prev.d, false, o, &out.blocks);
      out.moved_bytes = static_cast<std::uint64_t>(elements(net, st.c_modes)) * o.element_bytes;
    }
  }
  // The gather after the chain is the last step's (a step that also redistributed carries both).
  DistributedStep& last = plan.steps[static_cast<std::size_t>(chain.back())];
  std::int64_t gather_blocks = 0;
  last.comm_seconds += reshard_seconds(net, last_layout, last.distributed, true, o, &gather_blocks);
  last.moved_bytes += static_cast<std::uint64_t>(elements(net, last_layout)) * o.element_bytes;
  last.blocks += gather_blocks;
  if (last.transition == Transition::keep) last.transition = Transition::gather;
  return chain.size();
}

}  // namespace

DistributionPlan plan_distribution(const Network& net, const std::vector<PlanStep>& steps, const DistributionOptions& o) {
  DistributionPlan plan;
  plan.ranks = o.ranks;
  plan.slot_bytes = o.slot_bytes;
  plan.steps.resize(steps.size());
  for (std::size_t s = 0; s < steps.size(); ++s) plan.steps[s].compute_seconds = gemm_seconds(net, steps[s], 1, o);
  std::vector<std::vector<int>> work;
  if (o.ranks > 1) work = use_chains(net, steps, o);
  // A chain no distribution survives ends with a gather where it breaks; the rest starts anew.
  for (std::size_t w = 0; w < work.size(); ++w) {
    std::vector<int> chain = work[w];
    const std::size_t solved = solve_chain(net, steps, chain, o, plan);
    if (solved < chain.size()) {
      std::vector<int> rest(chain.begin() + static_cast<std::ptrdiff_t>(solved), chain.end());
      chain.resize(solved);
      solve_chain(net, steps, chain, o, plan);  // (its last step needs nothing to survive)
      work.push_back(std::move(rest));
    }
    plan.chains.push_back(std::move(chain));
  }
  std::sort(plan.chains.begin(), plan.chains.end());
  for (const DistributedStep& s : plan.steps) {
    plan.compute_seconds += s.compute_seconds;
    plan.comm_seconds += s.comm_seconds;
    plan.moved_bytes += s.moved_bytes;
  }
  return plan;
}

nlohmann::json DistributionPlan::to_json() const {
  nlohmann::json j = {{"ranks", ranks}, {"chains", chains}, {"moved_bytes", moved_bytes}};
  nlohmann::json list = nlohmann::json::array();
  for (const DistributedStep& s : steps)
    list.push_back({{"transition", transition_name(s.transition)}, {"forced", s.forced}, {"distributed_modes", s.distributed},
                    {"moved_bytes", s.moved_bytes}, {"blocks", s.blocks}});
  j["steps"] = list;
  if (slot_bytes != ~std::uint64_t{0}) j["slot_bytes"] = slot_bytes;
  return j;
}

nlohmann::json DistributionPlan::prediction_json() const {
  nlohmann::json j = {{"predicted_compute_seconds", compute_seconds}, {"predicted_comm_seconds", comm_seconds}};
  nlohmann::json list = nlohmann::json::array();
  for (const DistributedStep& s : steps) list.push_back({{"compute_seconds", s.compute_seconds}, {"comm_seconds", s.comm_seconds}});
  j["steps"] = list;
  return j;
}

}  // namespace qstage::tn
