#pragma once
// The charge-blocked two-site update of TEBD (docs/mps.md; seed 001 eq. 16 with Hastings' form).
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "kernels/mps/charge_blocks.hpp"
#include "stages/mps/gates.hpp"
#include "stages/mps/truncation.hpp"
#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

// Where the time of the two-site updates went (seconds, measured at the stream's synchronisations).
struct UpdateTimings {
  double theta = 0;       // the gate times B B per new centre charge, and diag(lambda) of it
  double svd = 0;         // the SVDs of the charge blocks
  double truncation = 0;  // the singular values to the host and the global cut
  double planning = 0;    // the host's plan of the update (blocks, products, the gather form's tables)
  double transfers = 0;   // the sites to the backend, the new blocks back (with the packing)
  double finish = 0;      // B'[j] = C Y^dagger / norm
  std::int64_t updates = 0;
  std::int64_t products = 0, gathered_pairs = 0;  // Theta's GEMM products, and its pairs in gather form
  std::int64_t wide_pairs = 0, rounds = 0;  // of those, pairs whose products went through the workspace, in rounds
  std::int64_t grouped = 0, groups = 0;  // updates split into groups of centre charges (to fit their device share); groups of all updates
  std::int64_t svd_for_memory = 0;       // charge blocks decomposed on the host because their GPU SVD workspace did not fit
  double canonical = 0;          // wall seconds of LayerUpdater::recanonicalize
  std::int64_t canonicalizations = 0;
  kernels::SvdReport svd_paths;
  UpdateTimings& operator+=(const UpdateTimings& o) {
    planning += o.planning, theta += o.theta, svd += o.svd, truncation += o.truncation, transfers += o.transfers, finish += o.finish;
    updates += o.updates, products += o.products, gathered_pairs += o.gathered_pairs, wide_pairs += o.wide_pairs,
        rounds += o.rounds;
    grouped += o.grouped, groups += o.groups, svd_for_memory += o.svd_for_memory;
    canonical += o.canonical, canonicalizations += o.canonicalizations;
    svd_paths += o.svd_paths;
    return *this;
  }
};

// The arithmetic of the two-site updates (mps.tebd's precision): complex128, or complex64, where
// the GEMMs, the row scaling, the SVDs and C Y^dagger run in single precision on staging copies
// of the two sites rounded to complex64; the MPS itself stays complex128 in host memory (so it
// carries single-precision rounding, but its memory is not halved) and the singular values go to
// the host's truncation as doubles (docs/mps.md).
enum class Precision { complex128, complex64 };

// Applies two-site gates on a backend: the MPS stays in host memory and each update streams the
// two sites it touches through the backend (docs/mps.md). Workspaces grow to the largest update
// and are charged to the backend's budgets. An update larger than the device share goes through
// the backend in groups of centre charges (BondUpdate), with the same arithmetic per block.
template <typename T>
class BondUpdate;

class BondUpdater {
 public:
  // gpu_svd_from: kernels::batched_svd's gpu_from (cuda: which charge blocks the GPU decomposes).
  explicit BondUpdater(Backend& backend, std::int64_t gpu_svd_from = kernels::kGpuSvdFrom,
                       Precision precision = Precision::complex128);
  ~BondUpdater();
  // Applies `gate` to sites j and j+1 and truncates the centre bond j+1: Theta per new centre
  // charge from GEMMs over the old centre sectors, one SVD per charge block, global truncation,
  // then B'[j+1] = Y and B'[j] = (gate B B) Y^dagger / norm, so lambda is never divided by.
  // Returns the discarded weight eps.
  double update(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc);
  const UpdateTimings& timings() const { return timings_; }
  // The device bytes one update may take (estimated from its blocks; unlimited by default).
  void set_device_share(std::uint64_t bytes) { device_share_ = bytes; }
  std::uint64_t device_share() const { return device_share_; }
  std::uint64_t device_bytes() const;  // its buffers' device bytes now
  // Whether a charge block whose GPU SVD workspace does not fit the share is decomposed on the
  // host (its bits then those of the host's LAPACK) rather than refused with BudgetExceeded.
  void set_host_svd_when_short(bool on) { host_svd_when_short_ = on; }
  // Frees its device workspace (the next update grows it anew).
  void release_device();
  // The last update's kept norm: ||Theta|| after the gate and the truncation, in units of the
  // state's norm before it (1 in B form), before the update renormalised it to 1. n_pair states
  // multiply their weight by it (LayerUpdater, update_bond).
  double last_norm() const { return last_norm_; }

 private:
  struct Workspace;
  template <typename T>
  friend class BondUpdate;  // one update, step by step (tebd.cpp)
  double last_norm_ = 1;
  Precision precision_;
  Backend& backend_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Workspace> work_;
  std::int64_t gpu_svd_from_;
  std::uint64_t device_share_ = std::numeric_limits<std::uint64_t>::max();
  bool host_svd_when_short_ = false;
  UpdateTimings timings_;
};

// What the ranks' exchanges did on this rank (for the log).
struct ExchangeStats {
  std::map<int, std::int64_t> bonds;  // the left site of each update this rank computed: how many times
  std::int64_t exchanges = 0;         // allgathers (one per layer or single update): also the next layer's first rank
  double seconds = 0;                 // packing, the allgathers (waiting for the others included) and unpacking
  std::uint64_t bytes_sent = 0, bytes_received = 0;
};

// Which of `count` updates (a layer, in list order) rank `rank` of `ranks` computes: the i with
// (i + first) % ranks == rank, round robin over the list starting at rank `first`, so that the
// large centre bonds spread over the ranks. LayerUpdater starts each layer one rank further
// (first = the layers before it, mod ranks), so single updates (beam splitters) take turns too.
std::vector<std::int64_t> owned_updates(std::int64_t count, int rank, int ranks, int first = 0);

// One brickwork layer at a time: the bonds first, first + 2, ... touch disjoint sites, so they are
// updated at the same time, each on a BondUpdater (and stream) of its own, on OpenMP threads (seed
// 001's unitary-level parallelism), as many at once as the device budget holds (each update lent
// what its estimate asks, a larger one in groups of centre charges; run_shared). Each update is computed as it would be
// alone and the discarded weights are summed in bond order, so the result does not depend on the thread count.
//
// With `ranks` (several MPI ranks, each holding the whole MPS), each rank computes its
// owned_updates with its threads (starting each layer one rank further), then the ranks allgather
// what they computed through the communicator (comm::Communicator::allgatherv; per update: its
// index, discarded weight and kept norm, the new centre bond j+1 and sites j, j+1, packed as
// serial.hpp does) so that every rank holds the same new MPS, bit for bit; eps and the weight are
// then combined in list order on every rank, as with one rank. An exception in a rank's updates
// travels in its packet: every rank throws it (InputError and CheckFailed keep their type, others
// become RuntimeFailure), so no rank waits for another. One rank (or none given): no exchange, no copy.
class LayerUpdater {
 public:
  LayerUpdater(Backend& backend, std::int64_t gpu_svd_from = kernels::kGpuSvdFrom,
               Precision precision = Precision::complex128, comm::Communicator* ranks = nullptr);
  ~LayerUpdater();
  struct BondGate {
    int bond = 0;  // sites (bond, bond + 1)
    const GateTable* gate = nullptr;
  };
  // Applies updates that touch disjoint sites; eps gains each one's discarded weight, in list order.
  // An n_pair state's weight is multiplied by each update's kept norm (in list order), so that
  // rho = weight * (the state) stays the evolved, unnormalised density matrix.
  void apply(U1Mps& psi, const std::vector<BondGate>& updates, const TruncParams& trunc, double& eps);
  // Brings psi back to canonical form after a gate on sites (bond, bond + 1) that was not unitary
  // (a beam splitter cut at d, a lossy gate): canonicalize(psi, bond), timed for the log.
  void recanonicalize(U1Mps& psi, int bond);
  // The updaters' timings summed (thread-seconds), and the layers' wall seconds.
  UpdateTimings timings() const;
  double wall_seconds() const { return wall_; }
  // How the layers' updates shared the device budget (the log's summary).
  struct Sharing {
    int most_at_once = 0;     // updates running at the same time, at most
    std::int64_t waited = 0;  // updates that waited for device memory before they started
    std::int64_t alone = 0;   // updates run alone after the others (they did not fit the budget beside them)
    std::int64_t alone_by_pool =
        0;  // of those, refused by the device pool beside the others (their bond then or before)
  };
  const Sharing& sharing() const { return sharing_; }
  const ExchangeStats& exchange_stats() const { return exchange_; }

 private:
  // The ranks' allgather of the updates each computed (above); throws the first rank's failure.
  void exchange(U1Mps& psi, const std::vector<BondGate>& updates, const std::vector<std::int64_t>& mine,
                const std::exception_ptr& failure, std::vector<double>& discarded, std::vector<double>& norms);
  Backend& backend_;
  std::int64_t gpu_svd_from_;
  Precision precision_;
  comm::Communicator* ranks_ = nullptr;
  ExchangeStats exchange_;
  // The updaters not running an update (each with its stream and the device buffers it kept),
  // made as updates start, kept across layers; updates take them in turn (UpdaterSlots, tebd.cpp).
  std::vector<std::unique_ptr<BondUpdater>> idle_;
  UpdateTimings retired_;  // the timings of updaters destroyed to make room
  Sharing sharing_;
  // Bonds whose update the device pool refused beside the others' (an estimate below the truth):
  // from then on they run alone after the others.
  std::set<int> alone_bonds_;
  std::unique_ptr<Stream> planner_;  // the updates' estimates (cuSOLVER's workspace queries)
  // Runs `indices` of `updates` at most a thread each at a time, each lent the device bytes its
  // estimate asks (UpdaterSlots); those that cannot run beside the others go to `alone`
  // (ascending), another failure to `failure`.
  void run_shared(U1Mps& psi, const std::vector<BondGate>& updates, const std::vector<std::int64_t>& indices,
                  const TruncParams& trunc, std::vector<double>& discarded, std::vector<double>& norms,
                  std::exception_ptr& failure, std::vector<std::int64_t>& alone);
  // Runs `indices` of `updates` one at a time on one updater with the whole budget; a budget too
  // small for one update is an InputError naming it.
  void run_alone(U1Mps& psi, const std::vector<BondGate>& updates, std::vector<std::int64_t> indices, const TruncParams& trunc,
                 std::vector<double>& discarded, std::vector<double>& norms);
  double wall_ = 0;
};

// update() of a BondUpdater on the CPU backend (tests, and callers without a backend).
double update_bond(U1Mps& psi, int j, const GateTable& gate, const TruncParams& trunc,
                   Precision precision = Precision::complex128);

// <psi| op |psi> of a conserving two-site operator on sites j, j+1 (a table like a gate's), from
// lambda[j] B[j] B[j+1] (B form).
double bond_expectation(const U1Mps& psi, int j, const GateTable& op);

}  // namespace qstage::stages::mps
