#pragma once
// Distribution planning (seed 000, section IV-B): which steps of a reordered contraction path run
// with their large intermediates sharded over P ranks, along which modes, and where the shards
// are reshuffled (all-to-all) or gathered.
//
// A step is *large* when an operand or its result holds at least `large_bytes`. A *use-chain*
// follows a large step's result through its consumers while they stay large; the side operands
// that join it are replicated on every rank. (Where two large intermediates meet, the chain that
// started first in step order continues; the other ends before that step with a gather.) Along a
// chain
// each step is in one of four states:
//   activate      the chain's first step: its result is sharded over the leading prefix of its
//                 modes whose extents reach P (eq. 4); each rank computes its shard;
//   keep          the result inherits the distributed modes (no communication);
//   redistribute  the result is reshuffled to the leading prefix of its own modes (all-to-all);
//                 forced where the next step contracts a distributed mode (or, out of core,
//                 where keeping would make the result's slots too large), elective otherwise;
//   gather        after the chain's last step the result is replicated. Where neither keeping
//                 nor reshuffling leaves modes the next step does not contract, the chain ends
//                 there (gathered) and the rest of it is a chain of its own.
// Where to redistribute is a dynamic programme over the distributed-mode sets (the state), with
// eq. 5-7's cost: each step's GEMM time per rank, max(bytes / B_dev, flops / F_dev) over P, and a
// reshuffle's |C| (P - 1) / (P B_net) + n_blk max(lambda, s_blk / B_net), n_blk the contiguous
// blocks a rank sends (the modes left of the last distributed one in C's layout, except the
// distributed ones) and s_blk their size. Deferring a reshuffle lets the distributed modes drift
// right and the blocks shrink; the programme redistributes where the tensor is small instead.
// Out of core, a step's and a reshuffle's cost also carries the host-device crossings of the
// shards held in host memory (DistributionOptions::host_bandwidth).
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/tn/network.hpp"
#include "stages/tn/plan.hpp"

namespace qstage::tn {

enum class Transition { local, activate, keep, redistribute, gather };
const char* transition_name(Transition t);

struct DistributionOptions {
  int ranks = 1;                           // P
  std::uint64_t large_bytes = 8ull << 30;  // s: a step is large from this many bytes (operand or result)
  std::uint64_t element_bytes = 8;
  double device_bandwidth = 3e12;          // B_dev (bytes/s)
  double device_rate = 5e13;               // F_dev (real flop/s)
  double net_bandwidth = 1.5e11;           // B_net (bytes/s a rank)
  double latency = 1e-5;                   // lambda (s a message)
  // Out of core per rank: the largest slot (one combo of a sharded tensor) a rank computes at
  // once. Sharding then spreads over as many leading modes as make every slot fit, so a rank
  // holds several slots, streamed one at a time through its device (its shard may lie in host
  // memory); keeping distributed modes whose result's slots would be larger is not allowed. The
  // default (no limit) is eq. 4 as written.
  std::uint64_t slot_bytes = ~std::uint64_t{0};
  // Out of core: a rank's device budget and its host-device bandwidth (bytes/s). A shard larger
  // than half the budget is counted as held in host memory: each step that writes it, reads it
  // or reshards it pays its crossing (the executor's copies are not overlapped with the work).
  // 0: none counted.
  std::uint64_t device_bytes = 0;
  double host_bandwidth = 0;
};

struct DistributedStep {
  Transition transition = Transition::local;
  bool forced = false;              // redistribute: the next step contracts a distributed mode
  std::vector<Mode> distributed;    // the result's distributed modes after the transition (C's order)
  double compute_seconds = 0;       // eq. 6 per rank
  double comm_seconds = 0;          // eq. 7 (redistribute), or the gather's
  std::uint64_t moved_bytes = 0;    // bytes reshuffled or gathered (the whole tensor's)
  std::int64_t blocks = 0;          // n_blk: contiguous blocks a rank sends
};

struct DistributionPlan {
  int ranks = 1;
  std::uint64_t slot_bytes = ~std::uint64_t{0};  // DistributionOptions::slot_bytes (written only when limited)
  std::vector<DistributedStep> steps;       // one per plan step
  std::vector<std::vector<int>> chains;     // use-chains: plan step indices, in order
  double compute_seconds = 0, comm_seconds = 0;  // summed over the steps (one slice)
  std::uint64_t moved_bytes = 0;
  // The schedule (what tn.contract runs) and apart from it the predicted seconds (they come
  // from rates tn.plan may have measured: Plan::prediction_json).
  nlohmann::json to_json() const;
  nlohmann::json prediction_json() const;
};

// Eq. 4: the distributed modes of a tensor with layout `layout` sharded afresh (activate,
// redistribute): the shortest leading prefix whose extents reach P (all of it if none does) and,
// out of core, whose slots (the tensor's elements over the prefix's combos) hold at most
// `slot_elements` each.
std::vector<Mode> leading_prefix(const Network& net, const std::vector<Mode>& layout, int ranks,
                                 double slot_elements = std::numeric_limits<double>::infinity());
// A slot limit of `slot_bytes` in elements of `element_bytes` (infinite without a limit, ~0).
double slot_elements(std::uint64_t slot_bytes, std::uint64_t element_bytes);
inline double slot_elements(const DistributionOptions& o) { return slot_elements(o.slot_bytes, o.element_bytes); }

// The cost of one chain under given decisions (redistribute[i] for step i of the chain; entry 0
// is the activation and ignored), or +inf when a decision leaves a distributed mode that the next
// step contracts: what the programme minimises over each of the plan's chains (exposed so that
// tests can enumerate the decisions).
double chain_cost(const Network& net, const std::vector<PlanStep>& steps, const std::vector<int>& chain,
                  const std::vector<bool>& redistribute, const DistributionOptions& o);

// The use-chains of `steps` (plan step indices), by the rule above.
std::vector<std::vector<int>> use_chains(const Network& net, const std::vector<PlanStep>& steps, const DistributionOptions& o);

// Plans every chain by the dynamic programme; steps outside chains stay local (replicated). The
// plan's chains are use_chains' split where no distribution survives (above), in step order.
DistributionPlan plan_distribution(const Network& net, const std::vector<PlanStep>& steps, const DistributionOptions& o);

}  // namespace qstage::tn
