// Building contraction trees: randomized greedy and recursive partitioning (METIS). Every tree
// must be a complete, valid contraction whose costs agree with path_cost on its SSA path, and the
// same seed must give the same tree. Quality is printed, not asserted: it belongs to benchmarks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "stages/tn/circuit.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"
#include "circuit_util.hpp"
#include "stages/tn/paths/greedy.hpp"
#include "stages/tn/paths/partition.hpp"
#include "stages/tn/paths/tree.hpp"

using namespace qstage;
using tn::ContractionTree;
using tn::GreedyParams;
using tn::PartitionParams;
using tn::SearchNetwork;

namespace {

tn::Network circuit_network(int rows, int cols, int cycles, std::uint64_t seed) {
  return tn::amplitude_network(test::grid_circuit(rows, cols, cycles, seed));
}

tn::Network einsum(const std::string& expression, std::int64_t extent = 2) {
  std::map<std::string, std::int64_t> extents;
  for (char c : expression)
    if (std::isalpha(static_cast<unsigned char>(c))) extents[std::string(1, c)] = extent;
  return tn::network_from_einsum(expression, extents, "test");
}

void expect_near_relative(double expected, double actual, const std::string& what) {
  EXPECT_LE(std::abs(expected - actual), 1e-9 * std::max(1.0, std::abs(expected))) << what << ": " << expected
                                                                                     << " vs " << actual;
}

// The tree is complete and consistent, and its SSA path is a valid contraction of the network
// whose costs (path_cost, an independent implementation) match the tree's own.
void expect_valid(const tn::Network& n, const ContractionTree& t, const std::string& what) {
  ASSERT_TRUE(t.complete()) << what;
  ASSERT_NO_THROW(t.check()) << what;
  const tn::Path path = t.to_path();
  ASSERT_EQ(path.ssa.size(), n.tensors.size() - 1) << what;
  ASSERT_NO_THROW(tn::intermediate_modes(n, path)) << what;
  const tn::PathCost reference = tn::path_cost(n, path);
  const tn::TreeCost cost = t.cost();
  expect_near_relative(reference.multiply_adds, cost.multiply_adds, what + " multiply-adds");
  expect_near_relative(reference.largest, cost.largest, what + " largest");
  expect_near_relative(reference.slices, cost.slices, what + " slices");
}

bool same_path(const tn::Path& a, const tn::Path& b) { return a.ssa == b.ssa && a.sliced == b.sliced; }

GreedyParams greedy_params(double costmod, double temperature) {
  GreedyParams p;
  p.costmod = costmod;
  p.temperature = temperature;
  return p;
}

PartitionParams partition_params(int parts, double imbalance, int cutoff) {
  PartitionParams p;
  p.parts = parts;
  p.imbalance = imbalance;
  p.cutoff = cutoff;
  p.edge_noise = 0.2;
  p.greedy = greedy_params(1.0, 0.01);
  return p;
}

bool share_a_leg(const tn::Legs& a, const tn::Legs& b) {
  std::vector<int> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  return !common.empty();
}

double log10_multiply_adds(const ContractionTree& t) { return std::log10(std::max(t.cost().multiply_adds, 1.0)); }

}  // namespace

TEST(TnPathsGreedy, TreesAreValidForManyParameters) {
  const auto n = circuit_network(4, 4, 10, 3);
  const auto net = SearchNetwork::from(n);
  for (double costmod : {0.1, 1.0, 4.0})
    for (double temperature : {0.0, 0.01, 1.0})
      for (std::uint64_t seed : {0, 1}) {
        const auto t = tn::greedy_tree(net, greedy_params(costmod, temperature), seed);
        expect_valid(n, t, fmt::format("greedy costmod {} temperature {} seed {}", costmod, temperature, seed));
      }
}

TEST(TnPathsGreedy, SameSeedSamePathOtherSeedsDiffer) {
  const auto n = circuit_network(4, 5, 12, 7);
  const auto net = SearchNetwork::from(n);
  const auto p = greedy_params(1.3, 0.3);
  const auto first = tn::greedy_tree(net, p, 42).to_path();
  EXPECT_TRUE(same_path(first, tn::greedy_tree(net, p, 42).to_path()));
  int different = 0;
  for (std::uint64_t seed = 0; seed < 8; ++seed)
    if (!same_path(first, tn::greedy_tree(net, p, seed).to_path())) ++different;
  EXPECT_GE(different, 6);
  // Without a temperature there is no noise: the seed does not matter.
  const auto plain = greedy_params(1.0, 0.0);
  EXPECT_TRUE(same_path(tn::greedy_tree(net, plain, 1).to_path(), tn::greedy_tree(net, plain, 2).to_path()));
}

TEST(TnPathsGreedy, TinyAndDisconnectedNetworks) {
  for (const std::string expression : {"ab->ab", "ab,b->a", "ab,bc,c->a", "ab,cd->abcd", "ab,b,cd,c->ad",
                                       "ia,ib,ab->i", "a,b,c,d,e->abcde", "ab,ab->", "ab,bc,ca,de,ef,fd,g,g->"}) {
    const auto n = einsum(expression);
    const auto net = SearchNetwork::from(n);
    for (double temperature : {0.0, 0.5}) {
      const auto t = tn::greedy_tree(net, greedy_params(1.0, temperature), 5);
      expect_valid(n, t, expression);
    }
  }
}

TEST(TnPathsGreedy, JoinsTheBestScoreFirst) {
  // A(a,b) B(b,c) C(c,d) with b of extent 8, the rest 2. Score |ab| - (|a| + |b|) at costmod 1:
  // A.B makes (a,c): 4 - (16 + 16) = -28; B.C makes (b,d): 16 - (16 + 4) = -4. A.B goes first.
  std::map<std::string, std::int64_t> extents{{"a", 2}, {"b", 8}, {"c", 2}, {"d", 2}};
  const auto n = tn::network_from_einsum("ab,bc,cd->ad", extents, "test");
  const auto net = SearchNetwork::from(n);
  ContractionTree t(net);
  const int root = tn::greedy_join(t, {0, 1, 2}, greedy_params(1.0, 0.0), 0);
  EXPECT_EQ(root, t.root());
  const int first = t.left(root) == 2 ? t.right(root) : t.left(root);
  EXPECT_EQ(std::set<int>({t.left(first), t.right(first)}), std::set<int>({0, 1}));
}

TEST(TnPathsGreedy, OuterProductsJoinTheSmallestFirst) {
  // Three disconnected tensors of 2, 4 and 8 elements: the two smallest first, then the largest.
  std::map<std::string, std::int64_t> extents{{"a", 2}, {"b", 4}, {"c", 8}};
  const auto n = tn::network_from_einsum("c,a,b->abc", extents, "test");
  const auto net = SearchNetwork::from(n);
  const auto t = tn::greedy_tree(net, {}, 0);
  expect_valid(n, t, "outer products");
  const auto path = t.to_path();
  ASSERT_EQ(path.ssa.size(), 2u);
  EXPECT_EQ(std::set<int>({path.ssa[0].first, path.ssa[0].second}), std::set<int>({1, 2}));
}

TEST(TnPathsGreedy, JoinsASubsetAndRespectsSlicedModes) {
  const auto n = circuit_network(3, 4, 8, 11);
  const auto net = SearchNetwork::from(n);
  ContractionTree t(net);
  // Slice a few modes first: greedy must size tensors with those modes at extent 1.
  for (int k = 0; k < net.modes(); k += 7) t.set_sliced(k, true);
  const int half = net.tensors / 2;
  std::vector<int> first, second;
  for (int i = 0; i < net.tensors; ++i) (i < half ? first : second).push_back(i);
  const int a = tn::greedy_join(t, first, greedy_params(2.0, 0.1), 1);
  const int b = tn::greedy_join(t, second, greedy_params(0.5, 0.1), 2);
  EXPECT_EQ(t.parent(a), -1);
  EXPECT_EQ(t.parent(b), -1);
  EXPECT_FALSE(t.complete());
  tn::greedy_join(t, {a, b}, {}, 3);
  expect_valid(n, t, "sliced, joined in halves");
  EXPECT_GT(t.cost().slices, 1);
}

TEST(TnPathsGreedy, AbsorbsWhatDoesNotGrow) {
  // A chain of matrices collapses completely: every join keeps two legs.
  {
    const auto n = einsum("ab,bc,cd,de->ae");
    const auto net = SearchNetwork::from(n);
    ContractionTree t(net);
    const auto left = tn::absorb_small_tensors(t, {0, 1, 2, 3});
    ASSERT_EQ(left.size(), 1u);
    EXPECT_TRUE(t.complete());
    expect_valid(n, t, "matrix chain");
  }
  // A circuit: the single-qubit gates, initial states and projections go into the two-qubit gates,
  // and no pair left could be joined without growing.
  const auto n = circuit_network(4, 4, 8, 5);
  const auto net = SearchNetwork::from(n);
  ContractionTree t(net);
  std::vector<int> leaves(static_cast<size_t>(net.tensors));
  for (int i = 0; i < net.tensors; ++i) leaves[static_cast<size_t>(i)] = i;
  const auto left = tn::absorb_small_tensors(t, leaves);
  EXPECT_TRUE(std::is_sorted(left.begin(), left.end()));
  int two_qubit_gates = 0;
  for (const auto& tensor : n.tensors) two_qubit_gates += tensor.modes.size() == 4;
  EXPECT_LE(static_cast<int>(left.size()), two_qubit_gates);
  EXPECT_GT(left.size(), 1u);
  for (size_t i = 0; i < left.size(); ++i) {
    EXPECT_EQ(t.parent(left[i]), -1);
    EXPECT_LE(t.log2_size(left[i]), 4.0);  // never larger than a two-qubit gate
    for (size_t j = i + 1; j < left.size(); ++j) {
      if (!share_a_leg(t.legs(left[i]), t.legs(left[j]))) continue;
      tn::Legs joined;
      tn::Holdings holdings;
      tn::join_legs(net, t.legs(left[i]), t.holdings(left[i]), t.legs(left[j]), t.holdings(left[j]), joined, holdings);
      EXPECT_GT(t.log2_size_of(joined), std::max(t.log2_size(left[i]), t.log2_size(left[j])));
    }
  }
  tn::greedy_join(t, left, greedy_params(1.0, 0.0), 0);
  expect_valid(n, t, "absorbed, then greedy");
  ContractionTree fresh(net);
  EXPECT_THROW(tn::absorb_small_tensors(fresh, {0, 1, 0}), InputError);
}

TEST(TnPathsGreedy, RefusesBadInput) {
  const auto n = einsum("ab,bc,ca->");
  const auto net = SearchNetwork::from(n);
  ContractionTree t(net);
  EXPECT_THROW(tn::greedy_join(t, {}, {}, 0), InputError);
  EXPECT_THROW(tn::greedy_join(t, {0, 0, 1}, {}, 0), InputError);
  EXPECT_THROW(tn::greedy_join(t, {0, 7}, {}, 0), InputError);
  EXPECT_THROW(tn::greedy_join(t, {0, 1}, greedy_params(0.0, 0.0), 0), InputError);
  EXPECT_THROW(tn::greedy_join(t, {0, 1}, greedy_params(1.0, -1.0), 0), InputError);
  const int v = tn::greedy_join(t, {0, 1}, {}, 0);
  EXPECT_THROW(tn::greedy_join(t, {0, 2}, {}, 0), InputError);  // 0 has a parent now
  EXPECT_EQ(tn::greedy_join(t, {v}, {}, 0), v);
  const SearchNetwork empty;
  EXPECT_THROW(tn::greedy_tree(empty, {}, 0), InputError);
}

TEST(TnPathsPartition, TreesAreValidForManyParameters) {
  const auto n = circuit_network(4, 5, 12, 2);
  const auto net = SearchNetwork::from(n);
  int trial = 0;
  for (int parts : {2, 3, 8, 16})
    for (double imbalance : {0.01, 0.3, 1.0})
      for (int cutoff : {1, 10, 40}) {
        PartitionParams p = partition_params(parts, imbalance, cutoff);
        p.parts_decay = (trial % 3) * 0.5;
        p.imbalance_decay = (trial % 5) - 2.0;
        p.edge_noise = (trial % 2) * 0.5;
        const auto t = tn::partition_tree(net, p, static_cast<std::uint64_t>(trial++));
        expect_valid(n, t, fmt::format("partition parts {} imbalance {} cutoff {}", parts, imbalance, cutoff));
      }
}

TEST(TnPathsPartition, SameSeedSamePathOtherSeedsDiffer) {
  const auto n = circuit_network(5, 5, 12, 4);
  const auto net = SearchNetwork::from(n);
  const PartitionParams p = partition_params(4, 0.2, 12);
  const auto first = tn::partition_tree(net, p, 9).to_path();
  EXPECT_TRUE(same_path(first, tn::partition_tree(net, p, 9).to_path()));
  int different = 0;
  for (std::uint64_t seed = 0; seed < 8; ++seed)
    if (!same_path(first, tn::partition_tree(net, p, seed).to_path())) ++different;
  EXPECT_GE(different, 6);
}

TEST(TnPathsPartition, TinyAndDisconnectedNetworks) {
  for (const std::string expression : {"ab->ab", "ab,b->a", "ab,bc,c->a", "ab,cd->abcd", "ab,b,cd,c->ad",
                                       "ia,ib,ab->i", "a,b,c,d,e->abcde", "ab,bc,ca,de,ef,fd,g,g->",
                                       "ab,bc,cd,de,ef,fg,gh,hi,ij,jk,kl,la,mn,no,op,pm->"}) {
    const auto n = einsum(expression);
    const auto net = SearchNetwork::from(n);
    for (int cutoff : {1, 2, 3})
      for (int parts : {2, 5}) {
        const auto t = tn::partition_tree(net, partition_params(parts, 0.1, cutoff), 3);
        expect_valid(n, t, fmt::format("{} cutoff {} parts {}", expression, cutoff, parts));
      }
  }
}

TEST(TnPathsPartition, OpenOutputModes) {
  tn::RandomCircuitOptions o;
  o.rows = 3;
  o.cols = 4;
  o.cycles = 8;
  const auto n = tn::amplitude_network(tn::random_circuit(o), {0, 5, 11});
  ASSERT_EQ(n.output.size(), 3u);
  const auto net = SearchNetwork::from(n);
  expect_valid(n, tn::partition_tree(net, partition_params(3, 0.2, 4), 1), "partition, open qubits");
  expect_valid(n, tn::greedy_tree(net, greedy_params(1.0, 0.1), 1), "greedy, open qubits");
}

TEST(TnPathsPartition, RefusesBadParameters) {
  const auto n = einsum("ab,bc,ca->");
  const auto net = SearchNetwork::from(n);
  auto with = [](auto change) {
    PartitionParams p;
    change(p);
    return p;
  };
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.parts = 1; }), 0), InputError);
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.imbalance = 0; }), 0), InputError);
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.parts_decay = 2; }), 0), InputError);
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.cutoff = 0; }), 0), InputError);
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.edge_noise = -1; }), 0), InputError);
  EXPECT_THROW(tn::partition_tree(net, with([](PartitionParams& p) { p.greedy.costmod = -1; }), 0), InputError);
  const SearchNetwork empty;
  EXPECT_THROW(tn::partition_tree(empty, {}, 0), InputError);
}

// Partitioning against greedy on a 30-qubit, 12-cycle random circuit: printed for the record.
TEST(TnPathsPartition, RandomCircuitAgainstGreedy) {
  const auto n = circuit_network(5, 6, 12, 0);
  const auto net = SearchNetwork::from(n);
  double best_greedy = INFINITY, best_partition = INFINITY;
  for (std::uint64_t trial = 0; trial < 16; ++trial) {
    const auto g = tn::greedy_tree(net, greedy_params(0.5 + 0.2 * static_cast<double>(trial), 0.05), trial);
    expect_valid(n, g, "greedy");
    best_greedy = std::min(best_greedy, log10_multiply_adds(g));
    PartitionParams p = partition_params(2 + static_cast<int>(trial % 4), 0.05 + 0.05 * static_cast<double>(trial % 5),
                                         10 + static_cast<int>(trial));
    const auto t = tn::partition_tree(net, p, trial);
    expect_valid(n, t, "partition");
    best_partition = std::min(best_partition, log10_multiply_adds(t));
  }
  std::printf("5x6 grid, 12 cycles (%zu tensors): best log10 C_t over 16 trials: greedy %.2f, partition %.2f\n",
              n.tensors.size(), best_greedy, best_partition);
}

// Several threads partitioning at once, their METIS calls overlapping (this binary has the
// per-thread bindings of rand, srand and signal), give the trees one thread gives, and leave the
// process's SIGTERM handler as it was (METIS traps SIGTERM and SIGABRT during each call).
TEST(TnPathsPartition, ConcurrentCallsMatchSerialAndKeepSignalHandlers) {
  EXPECT_TRUE(tn::metis_calls_overlap());
  struct sigaction mine {}, before {}, after {};
  mine.sa_sigaction = [](int, siginfo_t*, void*) {};
  mine.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGTERM, &mine, &before), 0);

  const auto n = circuit_network(4, 5, 10, 6);
  const auto net = SearchNetwork::from(n);
  const PartitionParams p = partition_params(3, 0.1, 6);
  constexpr int kThreads = 4, kTreesEach = 6;
  std::vector<std::vector<tn::Path>> parallel(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int j = 0; j < kTreesEach; ++j)
        parallel[static_cast<size_t>(i)].push_back(
            tn::partition_tree(net, p, static_cast<std::uint64_t>(i * kTreesEach + j)).to_path());
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i)
    for (int j = 0; j < kTreesEach; ++j)
      EXPECT_TRUE(same_path(parallel[static_cast<size_t>(i)][static_cast<size_t>(j)],
                            tn::partition_tree(net, p, static_cast<std::uint64_t>(i * kTreesEach + j)).to_path()));

  ASSERT_EQ(sigaction(SIGTERM, &before, &after), 0);
  EXPECT_EQ(after.sa_sigaction, mine.sa_sigaction);
  EXPECT_TRUE(after.sa_flags & SA_SIGINFO);
}

// Hyperindices (modes held by three tensors or more): greedy, absorption and partitioning give
// valid trees whose costs agree with path_cost, deterministically.
TEST(TnPathsHyperindices, GreedyAndPartitionTreesAreValid) {
  for (const char* expression : {"ab,ac,ad,ae,bcde->", "ab,ac,ad,a->bcd", "ab,ab,ab->", "xa,xb,xc,xd,ya,yb,yc,yd->xy",
                                  "abc,acd,ade,aef,afb->a"}) {
    const tn::Network n = einsum(expression, 3);
    const SearchNetwork net = SearchNetwork::from(n);
    EXPECT_TRUE(net.has_hyperindices) << expression;
    expect_valid(n, tn::greedy_tree(net, greedy_params(1.0, 0.0), 0), fmt::format("greedy {}", expression));
    expect_valid(n, tn::partition_tree(net, partition_params(2, 0.1, 2), 0), fmt::format("partition {}", expression));
  }
  // Random networks of 60 tensors whose modes join 2..6 of them.
  for (std::uint64_t seed = 0; seed < 4; ++seed) {
    std::uint64_t state = seed;
    auto next = [&](std::uint64_t bound) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return (state >> 33) % bound;
    };
    tn::Network n;
    n.tensors.resize(60);
    for (tn::Mode m = 0; m < 150; ++m) {
      n.extent[m] = 2;
      const int holders = m < 60 ? 2 : 2 + static_cast<int>(next(5));
      std::set<int> chosen;
      if (m < 60) chosen = {static_cast<int>(m), static_cast<int>((m + 1) % 60)};  // a ring: connected
      while (static_cast<int>(chosen.size()) < holders) chosen.insert(static_cast<int>(next(60)));
      for (int t : chosen) n.tensors[static_cast<size_t>(t)].modes.push_back(m);
    }
    n.output = {60, 61};
    for (auto& t : n.tensors) t.data.assign(static_cast<size_t>(n.size_of(t.modes)), 1.0);
    ASSERT_NO_THROW(n.validate("random hypergraph"));
    const SearchNetwork net = SearchNetwork::from(n);
    for (double costmod : {0.5, 1.0, 2.0}) {
      const ContractionTree g = tn::greedy_tree(net, greedy_params(costmod, 0.01), seed);
      expect_valid(n, g, fmt::format("greedy seed {} costmod {}", seed, costmod));
      EXPECT_TRUE(same_path(g.to_path(), tn::greedy_tree(net, greedy_params(costmod, 0.01), seed).to_path()));
    }
    const ContractionTree p = tn::partition_tree(net, partition_params(4, 0.2, 8), seed);
    expect_valid(n, p, fmt::format("partition seed {}", seed));
    EXPECT_TRUE(same_path(p.to_path(), tn::partition_tree(net, partition_params(4, 0.2, 8), seed).to_path()));
    fmt::print("hypergraph seed {}: greedy 10^{:.2f}, partition 10^{:.2f}\n", seed,
               log10_multiply_adds(tn::greedy_tree(net, greedy_params(1.0, 0.0), seed)), log10_multiply_adds(p));
  }
}
