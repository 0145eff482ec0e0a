// mps.tebd's ranks (LayerUpdater with a comm::Communicator, docs/mps.md "Ranks") under mpirun
// (ctest runs it on 3 ranks): each rank evolves its own copy of the state, and the copies exchange
// the updates they computed through the communicator's allgatherv. On 2 and 3 ranks, every rank
// ends with the bits of one rank, and every update was computed by exactly one rank.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/mpi.hpp"
#include "gtest_mpi.hpp"
#include "stages/mps/models.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"

using namespace qstage;
using namespace qstage::stages::mps;

namespace {

struct Outcome {
  std::string state;  // the packed MPS (bits)
  double eps = 0, kept = 1;
  ExchangeStats stats;
};

Outcome evolve(U1Mps psi, const Evolution& ev, const TruncParams& trunc, comm::Communicator* ranks) {
  const auto backend =
      detail::make_cpu_backend(std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max());
  LayerUpdater updater(*backend, kernels::kGpuSvdFrom, Precision::complex128, ranks);
  Outcome o;
  for (int step = 1; step <= ev.steps; ++step) apply_step(psi, ev, step, trunc, o.eps, o.kept, updater);
  stages::mps::Packer out;
  out.put_mps(psi);
  o.state = out.take();
  o.stats = updater.exchange_stats();
  return o;
}

void expect_bits_of_one_rank(const U1Mps& psi, const Evolution& ev, const TruncParams& trunc) {
  const mpi::Comm world;
  const Outcome one = evolve(psi, ev, trunc, nullptr);
  EXPECT_EQ(one.stats.exchanges, 0);
  std::int64_t updates = 0;
  for (int step = 1; step <= ev.steps; ++step) updates += static_cast<std::int64_t>(ev.updates(step).size());
  for (int P = 2; P <= world.size(); ++P) {
    const mpi::SubComm group(world, world.rank() < P ? 0 : 1);
    std::int64_t mine = 0;
    if (world.rank() < P) {
      comm::Communicator ranks(group.comm());
      const Outcome o = evolve(psi, ev, trunc, &ranks);
      EXPECT_EQ(o.state, one.state) << "rank " << world.rank() << " of " << P;
      EXPECT_EQ(o.eps, one.eps) << "rank " << world.rank() << " of " << P;  // (bitwise: == on doubles that are not NaN)
      EXPECT_EQ(o.kept, one.kept) << "rank " << world.rank() << " of " << P;
      EXPECT_GT(o.stats.exchanges, 0);
      EXPECT_EQ(group.comm().max(std::vector<std::int64_t>{o.stats.exchanges})[0], o.stats.exchanges);  // as many on every rank
      for (const auto& [bond, count] : o.stats.bonds) mine += count;
      EXPECT_GT(mine, 0) << "rank " << world.rank() << " of " << P << " computed nothing";
    }
    // every update was computed by exactly one rank
    const std::int64_t computed = world.sum_wrapping({static_cast<std::uint64_t>(mine)})[0];
    if (world.root()) EXPECT_EQ(computed, updates) << P << " ranks";
  }
}

}  // namespace

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

int main(int argc, char** argv) { return qstage::test::run_all_tests_on_every_rank(argc, argv); }
