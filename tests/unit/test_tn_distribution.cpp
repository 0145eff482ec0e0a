// Distribution planning (stages/tn/distribution): the dynamic programme against brute force over
// every keep/redistribute choice on random use-chains, and its behaviour on hand-made chains: a
// forced redistribution, an elective one moved to a size valley, the gather, and one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "stages/tn/distribution.hpp"

using namespace qstage::tn;

namespace {

// A chain of steps built by hand: tensor 0 is the chain's start, each step contracts the chain
// tensor with a side tensor (ids 1000 + i) into the next chain tensor (ids 1, 2, ...).
struct Chain {
  Network net;
  std::vector<PlanStep> steps;
  std::vector<Mode> current;
  explicit Chain(std::vector<Mode> start) : current(std::move(start)) {}
  // Contracts `reduced` (modes of the current tensor) away and lays the result out as `result`
  // (the current tensor's other modes plus any new ones, in any order).
  void step(const std::vector<Mode>& reduced, const std::vector<Mode>& result) {
    PlanStep st;
    st.a = static_cast<int>(steps.size());
    st.b = 1000 + static_cast<int>(steps.size());
    st.c = st.a + 1;
    st.a_modes = current;
    st.b_modes = reduced;
    for (Mode m : result)
      if (std::find(current.begin(), current.end(), m) == current.end()) st.b_modes.push_back(m);
    st.c_modes = result;
    double k = 1;
    for (Mode m : reduced) k *= static_cast<double>(net.extent.at(m));
    st.flops = 8.0 * static_cast<double>(net.size_of(result)) * k;
    steps.push_back(st);
    current = result;
  }
};

DistributionOptions options(int ranks) {
  DistributionOptions o;
  o.ranks = ranks;
  o.large_bytes = 1;  // every step is large: the chain is the whole sequence
  o.element_bytes = 8;
  o.device_bandwidth = 1e12, o.device_rate = 1e13, o.net_bandwidth = 1e10, o.latency = 1e-6;
  return o;
}

}  // namespace

TEST(TnDistribution, TheProgrammeEqualsBruteForceOnRandomChains) {
  std::mt19937_64 rng(17);
  int checked = 0, redistributing = 0, forced = 0, splits = 0;  // (so that the comparison is not vacuous)
  for (int trial = 0; trial < 40; ++trial) {
    const int length = 3 + trial % 12;  // up to 14 steps
    std::vector<Mode> start;
    Mode next = 0;
    for (int i = 0; i < 10; ++i) start.push_back(next++);
    Chain c(start);
    for (Mode m = 0; m < 200; ++m) c.net.extent[m] = 2;
    for (int s = 0; s < length; ++s) {
      // contract one or two modes anywhere, add one to three new ones, and shuffle part of the layout
      std::vector<Mode> cur = c.current, reduced, result;
      const int cut = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < cut && cur.size() > 3; ++k) {
        const std::size_t at = rng() % cur.size();
        reduced.push_back(cur[at]);
        cur.erase(cur.begin() + static_cast<std::ptrdiff_t>(at));
      }
      const int fresh = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < fresh; ++k) cur.insert(cur.begin() + static_cast<std::ptrdiff_t>(rng() % (cur.size() + 1)), next++);
      if (rng() % 2) std::swap(cur[rng() % cur.size()], cur[rng() % cur.size()]);
      result = cur;
      c.step(reduced, result);
    }
    struct Case {
      int ranks;
      std::uint64_t slot_elements, device_elements;  // 0: in core
    };
    for (const auto& [ranks, slot_elements, device_elements] : std::vector<Case>{{2, 0, 0}, {4, 0, 0}, {8, 0, 0}, {2, 64, 0}, {4, 128, 2048}}) {
      DistributionOptions o = options(ranks);
      if (slot_elements) o.slot_bytes = slot_elements * o.element_bytes;  // out of core: longer prefixes, some keeps not allowed
      if (device_elements) o.device_bytes = device_elements * o.element_bytes, o.host_bandwidth = 1e9;  // and host crossings
      const DistributionPlan plan = plan_distribution(c.net, c.steps, o);
      // the chains cover the sequence in order (split where no distribution survives)
      std::vector<int> covered;
      for (const auto& chain : plan.chains) covered.insert(covered.end(), chain.begin(), chain.end());
      ASSERT_EQ(covered.size(), c.steps.size());
      for (std::size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], static_cast<int>(i));
      for (const std::vector<int>& chain : plan.chains) {
        double best = std::numeric_limits<double>::infinity();
        const std::size_t n = chain.size();
        for (std::uint64_t mask = 0; mask < (std::uint64_t{1} << (n - 1)); ++mask) {
          std::vector<bool> redistribute(n, false);
          for (std::size_t i = 1; i < n; ++i) redistribute[i] = (mask >> (i - 1)) & 1;
          best = std::min(best, chain_cost(c.net, c.steps, chain, redistribute, o));
        }
        ASSERT_TRUE(std::isfinite(best)) << "trial " << trial << ": a chain the plan kept has no distribution";
        double planned = 0;
        std::vector<bool> chosen(n, false);
        for (std::size_t i = 0; i < n; ++i) {
          const DistributedStep& s = plan.steps[static_cast<std::size_t>(chain[i])];
          planned += s.compute_seconds + s.comm_seconds;
          chosen[i] = i > 0 && s.transition == Transition::redistribute;
          forced += s.forced;
        }
        EXPECT_NEAR(planned, best, 1e-12 * best) << "trial " << trial << ", " << ranks << " ranks, slots " << slot_elements;
        // and the plan's own decisions cost what it says
        EXPECT_NEAR(chain_cost(c.net, c.steps, chain, chosen, o), planned, 1e-12 * best);
        ++checked;
        redistributing += std::count(chosen.begin(), chosen.end(), true) > 0;
      }
      splits += static_cast<int>(plan.chains.size()) - 1;
    }
  }
  std::printf("%d chains checked, %d with a redistribution, %d forced ones, %d splits\n", checked, redistributing, forced, splits);
  EXPECT_GT(checked, 200);
  EXPECT_GT(splits, 10);
  EXPECT_GT(redistributing, 15);
  EXPECT_GT(forced, 5);
}

TEST(TnDistribution, ARedistributionIsForcedWhereTheNextStepContractsADistributedMode) {
  // Mode 0 leads step 0's result (distributed on 2 ranks); step 2 contracts it, so step 1, whose
  // result leads with mode 1, must reshuffle onto that.
  Chain c({0, 1, 2, 3, 4, 5});
  for (Mode m = 0; m < 20; ++m) c.net.extent[m] = 2;
  c.step({5}, {0, 1, 2, 3, 4, 6});
  c.step({4}, {1, 0, 2, 3, 6, 7});
  c.step({0}, {1, 2, 3, 6, 7, 8});
  const DistributionPlan plan = plan_distribution(c.net, c.steps, options(2));
  ASSERT_EQ(plan.chains.size(), 1u);
  EXPECT_EQ(plan.steps[0].transition, Transition::activate);
  EXPECT_EQ(plan.steps[0].distributed, std::vector<Mode>{0});
  EXPECT_EQ(plan.steps[1].transition, Transition::redistribute);
  EXPECT_TRUE(plan.steps[1].forced);
  EXPECT_EQ(plan.steps[1].distributed, std::vector<Mode>{1});
  EXPECT_EQ(plan.steps[1].moved_bytes, 8u << 6);
  EXPECT_EQ(plan.steps[1].blocks, 2);  // mode 0 second in the layout: a rank's shard is two blocks
  EXPECT_EQ(plan.steps[2].transition, Transition::gather);
}

TEST(TnDistribution, AnElectiveRedistributionGoesToTheSizeValley) {
  // Big (2^24), big, a valley (2^12), big again, then a step that contracts the mode distributed
  // since the start. Reshuffling in the valley is 4096x cheaper than the forced one at the peak.
  Chain c({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
  for (Mode m = 0; m < 100; ++m) c.net.extent[m] = 2;
  c.step({23}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 30});
  // the valley: 12 modes contracted; mode 40 (new, long-lived) leads its layout, mode 0 second
  c.step({11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}, {40, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 30});
  std::vector<Mode> peak{40, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 30};
  for (Mode m = 50; m < 62; ++m) peak.push_back(m);
  c.step({}, peak);
  std::vector<Mode> after(peak.begin(), peak.end());
  after.erase(after.begin() + 1);  // mode 0 contracted
  c.step({0}, after);
  const DistributionPlan plan = plan_distribution(c.net, c.steps, options(2));
  ASSERT_EQ(plan.chains.size(), 1u);
  EXPECT_EQ(plan.steps[1].transition, Transition::redistribute);
  EXPECT_FALSE(plan.steps[1].forced);
  EXPECT_EQ(plan.steps[1].distributed, std::vector<Mode>{40});
  EXPECT_EQ(plan.steps[1].moved_bytes, 8u << 13);
  EXPECT_EQ(plan.steps[2].transition, Transition::keep);
  EXPECT_EQ(plan.steps[3].transition, Transition::gather);
  EXPECT_EQ(plan.steps[3].blocks, 1);  // mode 40 leads: one block a rank
}

TEST(TnDistribution, SmallStepsStayLocalAndTheChainEndsWithAGather) {
  Chain c({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  for (Mode m = 0; m < 40; ++m) c.net.extent[m] = 2;
  c.step({9}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 20});           // 2^10 elements: large below
  c.step({8, 20, 7, 6, 5}, {0, 1, 2, 3, 4});              // 2^5 after it: small
  c.step({4}, {0, 1, 2, 3});
  DistributionOptions o = options(4);
  o.large_bytes = 8 * 512;  // 512 elements
  const DistributionPlan plan = plan_distribution(c.net, c.steps, o);
  ASSERT_EQ(plan.chains.size(), 1u);
  EXPECT_EQ(plan.chains[0], (std::vector<int>{0, 1}));  // step 1 reads a large operand
  EXPECT_EQ(plan.steps[0].transition, Transition::activate);
  EXPECT_EQ(plan.steps[0].distributed, (std::vector<Mode>{0, 1}));  // 2 x 2 reach 4 ranks
  EXPECT_EQ(plan.steps[1].transition, Transition::gather);
  EXPECT_GT(plan.steps[1].comm_seconds, 0);
  EXPECT_EQ(plan.steps[2].transition, Transition::local);
  // one rank: nothing distributed
  const DistributionPlan one = plan_distribution(c.net, c.steps, options(1));
  EXPECT_TRUE(one.chains.empty());
  for (const auto& s : one.steps) EXPECT_EQ(s.transition, Transition::local);
  EXPECT_EQ(one.comm_seconds, 0);
}

TEST(TnDistribution, OutOfCoreSlotsLengthenThePrefixAndForceARedistributionWhereAKeptSlotWouldGrow) {
  // 64 elements sharded over 2 ranks: eq. 4 takes one mode; with slots of at most 16 elements, two
  // (4 combos). Step 1 adds a mode without contracting any: keeping {0, 1} would make 32-element
  // slots, so it reshuffles onto the prefix of its own layout that makes 16 again.
  Chain c({0, 1, 2, 3, 4, 5});
  for (Mode m = 0; m < 20; ++m) c.net.extent[m] = 2;
  c.step({5}, {0, 1, 2, 3, 4, 6});
  c.step({}, {0, 1, 2, 3, 4, 6, 7});
  c.step({4}, {0, 1, 2, 3, 6, 7});
  EXPECT_EQ(leading_prefix(c.net, c.steps[0].c_modes, 2), std::vector<Mode>{0});
  EXPECT_EQ(leading_prefix(c.net, c.steps[0].c_modes, 2, 16), (std::vector<Mode>{0, 1}));
  EXPECT_EQ(leading_prefix(c.net, c.steps[0].c_modes, 8, 16), (std::vector<Mode>{0, 1, 2}));  // P decides where it is larger
  EXPECT_EQ(leading_prefix(c.net, {0, 1}, 2, 0.5), (std::vector<Mode>{0, 1}));             // a limit no prefix meets: all
  DistributionOptions o = options(2);
  const DistributionPlan in_core = plan_distribution(c.net, c.steps, o);
  EXPECT_EQ(in_core.steps[0].distributed, std::vector<Mode>{0});
  EXPECT_EQ(in_core.steps[1].transition, Transition::keep);
  EXPECT_EQ(in_core.to_json().count("slot_bytes"), 0u);  // (plans without the limit are written as before)
  o.slot_bytes = 16 * o.element_bytes;
  const DistributionPlan out = plan_distribution(c.net, c.steps, o);
  ASSERT_EQ(out.chains.size(), 1u);
  EXPECT_EQ(out.steps[0].distributed, (std::vector<Mode>{0, 1}));
  EXPECT_EQ(out.steps[1].transition, Transition::redistribute);
  EXPECT_TRUE(out.steps[1].forced);
  EXPECT_EQ(out.steps[1].distributed, (std::vector<Mode>{0, 1, 2}));
  EXPECT_EQ(out.to_json().at("slot_bytes").get<std::uint64_t>(), 16 * o.element_bytes);
  // keeping {0, 1} through step 1 is not a plan at all
  EXPECT_TRUE(std::isinf(chain_cost(c.net, c.steps, out.chains[0], {false, false, false}, o)));
  // A rank's budget of 32 elements: shards above 16 (step 0's 32, step 1's 64, step 2's 32 at
  // P = 2) are held on the host and cross at 1e9 B/s: step 1 reads step 0's shard and writes its
  // own, and its reshuffle copies its shard in and out again.
  o.device_bytes = 32 * o.element_bytes, o.host_bandwidth = 1e9;
  const DistributionPlan host = plan_distribution(c.net, c.steps, o);
  auto crossing = [&](double elements) { return elements * 8 / 2 / 1e9; };
  EXPECT_NEAR(host.steps[1].compute_seconds - out.steps[1].compute_seconds, crossing(64) + crossing(128), 1e-15);
  EXPECT_NEAR(host.steps[1].comm_seconds - out.steps[1].comm_seconds, 2 * crossing(128), 1e-15);
  EXPECT_NEAR(host.steps[0].compute_seconds - out.steps[0].compute_seconds, crossing(64), 1e-15);
}
