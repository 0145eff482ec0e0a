// The path hyper-optimizer (stages/tn/paths/hyper.hpp): valid paths, reproducible for a seed and
// trial count whatever the thread count, caps honoured by slicing, bad options refused.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "stages/tn/circuit.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"
#include "stages/tn/paths/hyper.hpp"
#include "circuit_util.hpp"

using namespace qstage;

namespace {

tn::Network circuit_network(int rows, int cols, int cycles, std::uint64_t seed) {
  tn::Network net = tn::amplitude_network(test::grid_circuit(rows, cols, cycles, seed));
  tn::set_bitstring(net, std::vector<std::uint8_t>(static_cast<size_t>(rows * cols), 0));
  return net;
}

tn::HyperOptions fixed_trials(int trials, std::uint64_t seed, int threads) {
  tn::HyperOptions o;
  o.max_seconds = 1e9;  // the trial count ends the search: reproducible
  o.max_trials = trials;
  o.seed = seed;
  o.threads = threads;
  return o;
}

}  // namespace

TEST(TnHyper, PathsAreValidAndCostsAgree) {
  const tn::Network net = circuit_network(4, 5, 10, 3);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  const tn::HyperResult r = tn::hyper_optimize(search, fixed_trials(32, 1, 2));
  EXPECT_EQ(r.trials, 32);
  const tn::PathCost c = tn::path_cost(net, r.path);  // throws if the path does not fit the network
  EXPECT_NEAR(c.multiply_adds, r.cost.multiply_adds, 1e-9 * c.multiply_adds);
  EXPECT_DOUBLE_EQ(c.largest, r.cost.largest);
  EXPECT_TRUE(r.path.sliced.empty());
  EXPECT_FALSE(r.best_method.empty());
  EXPECT_TRUE(r.methods.contains("greedy"));
  EXPECT_TRUE(r.methods.contains("partition"));
}

TEST(TnHyper, SameSeedAndTrialsGiveTheSamePathOnAnyThreadCount) {
  const tn::Network net = circuit_network(4, 5, 12, 5);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  const tn::Path one = tn::hyper_optimize(search, fixed_trials(48, 7, 1)).path;
  const tn::Path two = tn::hyper_optimize(search, fixed_trials(48, 7, 2)).path;
  const tn::Path again = tn::hyper_optimize(search, fixed_trials(48, 7, 2)).path;
  EXPECT_EQ(one.ssa, two.ssa);
  EXPECT_EQ(two.ssa, again.ssa);
  const tn::Path other = tn::hyper_optimize(search, fixed_trials(48, 8, 2)).path;
  EXPECT_EQ(tn::path_cost(net, other).slices, 1);  // another seed: still a valid path
}

TEST(TnHyper, CapIsReachedBySlicingOnlyClosedModes) {
  const tn::Network net = circuit_network(4, 5, 12, 2);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  const tn::HyperResult free = tn::hyper_optimize(search, fixed_trials(16, 1, 2));
  tn::HyperOptions o = fixed_trials(16, 1, 2);
  o.max_log2_size = std::log2(free.cost.largest) - 3;
  const tn::HyperResult capped = tn::hyper_optimize(search, o);
  const tn::PathCost c = tn::path_cost(net, capped.path);
  EXPECT_LE(std::log2(c.largest), o.max_log2_size + 1e-9);
  EXPECT_FALSE(capped.path.sliced.empty());
  EXPECT_TRUE(capped.slicing.fits);
  for (tn::Mode m : capped.path.sliced) EXPECT_EQ(std::count(net.output.begin(), net.output.end(), m), 0);
  // Against the reconfigured unsliced tree; reconfiguring between sliced modes can find a tree
  // that beats it, so the overhead is only known to be positive.
  EXPECT_GT(capped.slicing.overhead, 0.0);
}

TEST(TnHyper, OneMethodAlone) {
  const tn::Network net = circuit_network(3, 4, 8, 1);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  for (const char* method : {"greedy", "partition"}) {
    tn::HyperOptions o = fixed_trials(16, 2, 2);
    o.methods = {method};
    const tn::HyperResult r = tn::hyper_optimize(search, o);
    EXPECT_EQ(r.best_method, method);
    EXPECT_NO_THROW(tn::path_cost(net, r.path));
  }
}

TEST(TnHyper, TinyNetworks) {
  const std::map<std::string, std::int64_t> extents{{"a", 2}, {"b", 3}, {"c", 4}, {"d", 5}};
  for (const char* expr : {"ab->ab", "ab,bc->ac", "ab,bc,cd->ad", "ab,cd->abcd"}) {
    const tn::Network net = tn::network_from_einsum(expr, extents, expr);
    const tn::SearchNetwork search = tn::SearchNetwork::from(net);
    const tn::HyperResult r = tn::hyper_optimize(search, fixed_trials(4, 1, 1));
    EXPECT_EQ(r.path.ssa.size(), net.tensors.size() - 1) << expr;
    EXPECT_NO_THROW(tn::path_cost(net, r.path)) << expr;
  }
}

TEST(TnHyper, BadOptionsAreRefused) {
  const tn::Network net = circuit_network(2, 2, 4, 1);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  tn::HyperOptions o = fixed_trials(4, 1, 1);
  o.methods = {"annealing"};
  EXPECT_THROW(tn::hyper_optimize(search, o), InputError);
  o.methods = {};
  EXPECT_THROW(tn::hyper_optimize(search, o), InputError);
}

TEST(TnHyper, DefaultBudgetGrowsWithTheNetwork) {
  EXPECT_DOUBLE_EQ(tn::default_search_seconds(10), 2.0);
  EXPECT_DOUBLE_EQ(tn::default_search_seconds(1000), 5.0);
  EXPECT_DOUBLE_EQ(tn::default_search_seconds(100000), 10.0);
}

TEST(TnHyper, BudgetFitsThePredictedContractionTime) {
  tn::HyperOptions o;
  o.max_seconds = 5;
  EXPECT_DOUBLE_EQ(tn::budget_seconds(o, 12, 0.25), 5.0);  // no rate: max_seconds
  o.multiply_add_rate = 1e12;
  EXPECT_DOUBLE_EQ(tn::budget_seconds(o, 12, 0.25), 1.0);  // 1e12 multiply-adds at 1e12/s
  o.jobs = 3;
  EXPECT_DOUBLE_EQ(tn::budget_seconds(o, 12, 0.25), 3.0);  // every job contracts it
  EXPECT_DOUBLE_EQ(tn::budget_seconds(o, 9, 0.25), 0.25);  // at least the least trials' time
  EXPECT_DOUBLE_EQ(tn::budget_seconds(o, 15, 0.25), 5.0);  // at most max_seconds
  // The search reports the budget it ended with; a fixed trial count still decides the tree.
  const tn::Network net = circuit_network(3, 3, 6, 2);
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  tn::HyperOptions fixed = fixed_trials(32, 4, 2);
  tn::HyperOptions fitted = fixed;
  fitted.multiply_add_rate = 1e300;  // nothing to wait for: the least trials
  fitted.min_trials = 1000;          // ... which the trial count ends first
  const auto a = tn::hyper_optimize(search, fixed), b = tn::hyper_optimize(search, fitted);
  EXPECT_EQ(a.path.ssa, b.path.ssa);
  EXPECT_DOUBLE_EQ(b.budget_seconds, fitted.max_seconds);
  // With a rate that asks for no search, the search ends when its least trials have run: the
  // trials of that trial count, on any machine (their refinement, timed, may stop earlier).
  tn::HyperOptions least = fixed_trials(1000, 4, 2);
  least.multiply_add_rate = 1e300;
  least.min_trials = 32;
  const auto d = tn::hyper_optimize(search, least);
  EXPECT_EQ(d.trials, 32);
  EXPECT_EQ(d.methods, a.methods);  // (per method: its trials and best score)
  least.min_trials = 100000;        // ... or its least time, if that comes first (here after the first 16 trials)
  least.min_seconds = 1e-9;
  EXPECT_EQ(tn::hyper_optimize(search, least).trials, 16);
  // Once its least search has run and the budget is not spent, the search reconfigures its best trial
  // once and counts what that took off in the budget; the trees stay the fixed count's.
  // (on one thread: the probe then runs as soon as it is queued, before the next trial; on more,
  // a search that the trial count ends may stop with the probe still queued, and no gain, which
  // is what a loaded machine running this with 2 threads once did)
  tn::HyperOptions probed = fixed;
  probed.multiply_add_rate = 1e-3;  // a budget of max_seconds, far from spent
  probed.min_trials = 0;
  probed.threads = 1;
  const auto c = tn::hyper_optimize(search, probed);
  EXPECT_EQ(a.path.ssa, c.path.ssa);
  EXPECT_GT(c.refine_gain, 0);
  EXPECT_EQ(b.refine_gain, 0);  // (its budget was spent: no probe)
}
