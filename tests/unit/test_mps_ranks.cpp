// mps.tebd's ranks (LayerUpdater with a RankExchange, docs/mps.md "Ranks"), simulated by threads
// of one process: each "rank" evolves its own copy of the state and the copies exchange the
// updates they computed through a shared allgather. Every rank ends with the bits of one rank.
#include <gtest/gtest.h>

#include <barrier>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "stages/mps/models.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"

using namespace qstage;
using namespace qstage::stages::mps;

namespace {

// P threads as ranks: allgather puts each one's bytes in a slot, waits for all, copies them all.
struct SharedSlots {
  explicit SharedSlots(int ranks) : sync(ranks), slots(static_cast<std::size_t>(ranks)) {}
  std::barrier<> sync;
  std::vector<std::string> slots;
};

class ThreadRanks final : public RankExchange {
 public:
  ThreadRanks(SharedSlots& shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(shared_.slots.size()); }
  std::vector<std::string> allgather(const std::string& mine) override {
    shared_.slots[static_cast<std::size_t>(rank_)] = mine;
    shared_.sync.arrive_and_wait();
    std::vector<std::string> all = shared_.slots;
    shared_.sync.arrive_and_wait();  // (nobody writes the next round's slot before all have copied)
    return all;
  }

 private:
  SharedSlots& shared_;
  int rank_;
};

struct Outcome {
  std::string state;  // the packed MPS (bits)
  double eps = 0, kept = 1;
  ExchangeStats stats;
};

std::unique_ptr<Backend> cpu() {
  return detail::make_cpu_backend(std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max());
}

Outcome evolve(U1Mps psi, const Evolution& ev, const TruncParams& trunc, RankExchange* ranks) {
  const auto backend = cpu();
  LayerUpdater updater(*backend, kernels::kGpuSvdFrom, Precision::complex128, ranks);
  Outcome o;
  for (int step = 1; step <= ev.steps; ++step) apply_step(psi, ev, step, trunc, o.eps, o.kept, updater);
  Packer out;
  out.put_mps(psi);
  o.state = out.take();
  o.stats = updater.exchange_stats();
  return o;
}

// The evolution on P simulated ranks: every rank's outcome.
std::vector<Outcome> evolve_on_ranks(const U1Mps& psi, const Evolution& ev, const TruncParams& trunc, int P) {
  SharedSlots shared(P);
  std::vector<Outcome> out(static_cast<std::size_t>(P));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      ThreadRanks ranks(shared, r);
      out[static_cast<std::size_t>(r)] = evolve(psi, ev, trunc, &ranks);
    });
  for (auto& t : threads) t.join();
  return out;
}

void expect_bits_of_one_rank(const U1Mps& psi, const Evolution& ev, const TruncParams& trunc) {
  const Outcome one = evolve(psi, ev, trunc, nullptr);
  EXPECT_EQ(one.stats.exchanges, 0);
  for (int P : {2, 3, 5}) {
    const std::vector<Outcome> ranks = evolve_on_ranks(psi, ev, trunc, P);
    std::int64_t computed = 0;
    for (int r = 0; r < P; ++r) {
      const Outcome& o = ranks[static_cast<std::size_t>(r)];
      EXPECT_EQ(o.state, one.state) << "rank " << r << " of " << P;
      EXPECT_EQ(o.eps, one.eps) << "rank " << r << " of " << P;  // (bitwise: == on doubles that are not NaN)
      EXPECT_EQ(o.kept, one.kept) << "rank " << r << " of " << P;
      EXPECT_GT(o.stats.exchanges, 0);
      EXPECT_EQ(o.stats.exchanges, ranks[0].stats.exchanges);
      std::int64_t mine = 0;
      for (const auto& [bond, count] : o.stats.bonds) mine += count;
      EXPECT_GT(mine, 0) << "rank " << r << " of " << P << " computed nothing";
      computed += mine;
    }
    // every update was computed by exactly one rank
    std::int64_t updates = 0;
    for (int step = 1; step <= ev.steps; ++step) updates += static_cast<std::int64_t>(ev.updates(step).size());
    EXPECT_EQ(computed, updates) << P << " ranks";
  }
}

}  // namespace

TEST(MpsRanks, OwnedUpdatesSplitTheListRoundRobin) {
  EXPECT_EQ(owned_updates(7, 0, 3), (std::vector<std::int64_t>{0, 3, 6}));
  EXPECT_EQ(owned_updates(7, 2, 3), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(owned_updates(1, 0, 4), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(owned_updates(1, 1, 4).empty());
  EXPECT_EQ(owned_updates(3, 0, 1), (std::vector<std::int64_t>{0, 1, 2}));
  // a layer that starts at rank `first`
  EXPECT_EQ(owned_updates(7, 0, 3, 1), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(owned_updates(7, 1, 3, 1), (std::vector<std::int64_t>{0, 3, 6}));
  EXPECT_EQ(owned_updates(1, 2, 4, 2), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(owned_updates(1, 0, 4, 2).empty());
}

TEST(MpsRanks, ATruncatedQuenchHasTheBitsOfOneRankOnEveryRank) {
  const U1Mps psi = random_state(12, 2, 6, 16, 5);
  ModelParams p;
  p.model = "xxz", p.J = 1, p.delta = 0.5, p.h = 0.2, p.dt = 0.1, p.steps = 4, p.order = 4;
  const Evolution ev = make_evolution(p, psi.L, psi.d);
  const TruncParams trunc{6, 1e-12, 1e-14};
  expect_bits_of_one_rank(psi, ev, trunc);
  EXPECT_GT(evolve(psi, ev, trunc, nullptr).eps, 1e-8);  // (it truncated)
}

TEST(MpsRanks, ALossyInterferometerHasTheBitsOfOneRankOnEveryRank) {
  // Single updates (the ranks take turns, the others receive each), a weight, canonicalize after lossy gates.
  const int L = 4, d = 3;
  std::vector<std::vector<cplx>> modes;
  for (int j = 0; j < L; ++j) modes.push_back(lossy_squeezed_density(j == L - 1 ? 0.0 : 0.6, 0.3 * j, 0.5, d));
  const U1Mps rho = product_superposition(d, modes, kernels::ChargeKind::n_pair);
  ModelParams p;
  p.model = "interferometer", p.haar = true, p.haar_seed = 11, p.density_matrix = true;
  const Evolution ev = make_evolution(p, L, d);
  expect_bits_of_one_rank(rho, ev, TruncParams{10, 1e-14, 1e-14});
}
