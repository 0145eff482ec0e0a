#include "stages/tn/paths/partition.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <metis.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <mutex>

#include "core/error.hpp"
#include "kernels/common.hpp"

namespace qstage::tn {
namespace {

// METIS on several threads at once. Debian's METIS 5.1 (built without GKlib's own generator) draws
// its random numbers from the C library's rand(), seeded with srand(options[SEED]) at the start of
// each call: one state for the process, so overlapping calls would interleave one sequence and the
// cuts (and trees) would depend on thread timing. And every call traps SIGABRT and SIGTERM with
// the System V signal() (__sysv_signal) and puts back what it found the same way, which drops
// SA_RESTART from qstage's stop handler and makes it one-shot; overlapping calls could even leave
// METIS's trap installed (it longjmps into a stack frame that is gone). The rest of GKlib's state
// is per thread (its jump buffers and memory cores are thread-local).
//
// So this file defines rand, srand and __sysv_signal, which the dynamic linker binds libmetis to
// ahead of the C library's (an executable's definitions come first, and ld exports those a linked
// shared library refers to): rand and srand are glibc's own generator (random_r, the same
// sequences) with one state per thread, and __sysv_signal, on a thread inside a METIS call, leaves
// the process's handlers alone (METIS's error trap is then never installed: an allocation failure
// inside METIS aborts instead of returning an error). Calls overlap only where these bindings were
// checked to be in effect (metis_calls_overlap); elsewhere they run one at a time as before, and
// the handlers are put back after each. Either way a search gives the same trees (the same
// sequences, bitwise the same paths); on 2 cores 320 trials of a 40-qubit circuit took 0.242 s on
// one thread and 0.149 s on two, 0.200 s on two while calls were serialized.
thread_local bool inside_metis = false;

struct ThreadRandom {
  random_data data{};             // (zeroed: initstate_r requires it)
  std::array<char, 128> state{};  // 128 bytes: glibc's default generator (TYPE_3)
  bool ready = false;
  void seed(unsigned s) {
    if (!ready) {
      initstate_r(s, state.data(), state.size(), &data);
      ready = true;
    } else {
      srandom_r(s, &data);
    }
  }
  int next() {
    if (!ready) seed(1);  // (glibc's rand() before any srand: seed 1)
    std::int32_t r = 0;
    random_r(&data, &r);
    return r;
  }
};
thread_local ThreadRandom thread_random;

// One METIS call: overlapping others where the bindings above are in effect, else alone, the
// process's SIGABRT and SIGTERM handlers put back exactly afterwards.
class MetisCall {
 public:
  MetisCall() {
    if (!metis_calls_overlap()) {
      lock_ = std::unique_lock<std::mutex>(mutex());
      sigaction(SIGABRT, nullptr, &saved_abort_);
      sigaction(SIGTERM, nullptr, &saved_terminate_);
    }
    inside_metis = true;
  }
  ~MetisCall() {
    inside_metis = false;
    if (lock_) {
      sigaction(SIGABRT, &saved_abort_, nullptr);
      sigaction(SIGTERM, &saved_terminate_, nullptr);
    }
  }
  MetisCall(const MetisCall&) = delete;
  MetisCall& operator=(const MetisCall&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  std::unique_lock<std::mutex> lock_;
  struct sigaction saved_abort_ {};
  struct sigaction saved_terminate_ {};
};

// Edge weights are integers for METIS: log2 extents times this, so that the relative noise on
// them (edge_noise) has room to act (a qubit bond weighs 100, not 1).
constexpr double kWeightScale = 100.0;

void check_params(const PartitionParams& p) {
  if (p.parts < 2) throw InputError(fmt::format("partition: parts is {}; expected at least 2", p.parts));
  if (!(p.parts_decay >= 0 && p.parts_decay <= 1))
    throw InputError(fmt::format("partition: parts_decay is {}; expected 0..1", p.parts_decay));
  if (!(p.imbalance > 0) || !std::isfinite(p.imbalance))
    throw InputError(fmt::format("partition: imbalance is {}; expected a positive number", p.imbalance));
  if (!std::isfinite(p.imbalance_decay))
    throw InputError(fmt::format("partition: imbalance_decay is {}; expected a finite number", p.imbalance_decay));
  if (p.cutoff < 1) throw InputError(fmt::format("partition: cutoff is {}; expected at least 1", p.cutoff));
  if (!(p.edge_noise >= 0) || !std::isfinite(p.edge_noise))
    throw InputError(fmt::format("partition: edge_noise is {}; expected a number >= 0", p.edge_noise));
}

// The graph of a group of nodes in METIS's CSR layout: vertices are the group's nodes (in the
// group's order), an edge joins two nodes that share legs, weighted by the sum of their weights.
struct GroupGraph {
  std::vector<idx_t> offsets{0};  // xadj
  std::vector<idx_t> neighbours;  // adjncy
  std::vector<idx_t> weights;     // adjwgt
  idx_t vertices() const { return static_cast<idx_t>(offsets.size() - 1); }
  bool has_edges() const { return !neighbours.empty(); }
};

class PartitionBuilder {
 public:
  PartitionBuilder(const SearchNetwork& net, const PartitionParams& p, std::uint64_t seed)
      : net_(net), params_(p), seed_stream_(kernels::splitmix64(seed)), tree_(net) {
    draw_edge_weights();
    local_of_.assign(static_cast<size_t>(tree_.node_capacity()), -1);
  }

  ContractionTree build() && {
    std::vector<int> leaves(static_cast<size_t>(net_.tensors));
    for (int t = 0; t < net_.tensors; ++t) leaves[static_cast<size_t>(t)] = t;
    // Gates absorbed into their neighbours first: otherwise they are most of the graph's vertices
    // (2833 of 3369 in a 53-qubit, 20-cycle Sycamore circuit), balance would count gates rather
    // than the tensors that matter, and a cut could pass between a gate and its neighbour.
    const std::vector<int> nodes = absorb_small_tensors(tree_, leaves);
    nodes_to_split_ = static_cast<int>(nodes.size());
    find_holders(nodes);
    contract_group(nodes);
    return std::move(tree_);
  }

 private:
  const SearchNetwork& net_;
  PartitionParams params_;
  std::uint64_t seed_stream_;
  ContractionTree tree_;
  ModeHolders holders_;                      // per mode: the parentless nodes holding it
  std::vector<idx_t> mode_weight_;           // per mode number
  std::vector<int> local_of_;                // node -> its vertex in the group being split, -1 outside
  int nodes_to_split_ = 0;                   // after absorption: what the group sizes are relative to

  // Seeds for METIS and greedy calls, drawn in the recursion's (deterministic) order.
  std::uint64_t next_seed() {
    seed_stream_ += kernels::kGolden;
    return kernels::splitmix64(seed_stream_);
  }

  // Noise is drawn once per mode (so both ends of an edge see the same weight, as METIS requires)
  // and once per tree, which is what makes trials with different seeds cut differently.
  void draw_edge_weights() {
    const std::uint64_t noise_key = next_seed();
    mode_weight_.resize(static_cast<size_t>(net_.modes()));
    for (int m = 0; m < net_.modes(); ++m) {
      const double uniform =
          static_cast<double>(kernels::splitmix64(noise_key + kernels::kGolden * static_cast<std::uint64_t>(m + 1)) >> 11) *
          0x1p-53;
      const double w = kWeightScale * net_.log2_extent[static_cast<size_t>(m)] * (1 + params_.edge_noise * uniform);
      mode_weight_[static_cast<size_t>(m)] = static_cast<idx_t>(std::max(1.0, std::round(w)));
    }
  }

  void find_holders(const std::vector<int>& nodes) {
    holders_.prepare(net_);
    for (int v : nodes)
      for (int m : tree_.legs(v)) holders_.add(m, v);
  }

  // Parts and imbalance for a group holding the fraction s of all nodes (cotengra's rules):
  // parts shrink towards 2 as groups get smaller, and the imbalance tightens (decay > 0) or loosens
  // (decay < 0) towards 1.
  int parts_for(double s) const {
    return std::max(2, static_cast<int>(params_.parts * std::pow(s, params_.parts_decay)));
  }
  double imbalance_for(double s) const {
    const double d = params_.imbalance_decay;
    const double x = d >= 0 ? params_.imbalance * std::pow(s, d) : 1 - std::pow(s, -d) * (1 - params_.imbalance);
    return std::clamp(x, 0.001, 1.0);
  }

  // Contracts the nodes `group` into one node and returns it.
  int contract_group(const std::vector<int>& group) {
    const int size = static_cast<int>(group.size());
    if (size <= std::max(2, params_.cutoff)) return greedy_join(tree_, group, params_.greedy, next_seed());
    const double s = static_cast<double>(size) / nodes_to_split_;
    const int parts = parts_for(s);
    if (parts >= size) return greedy_join(tree_, group, params_.greedy, next_seed());
    const auto pieces = split(group, parts, imbalance_for(s));
    if (pieces.size() < 2) return greedy_join(tree_, group, params_.greedy, next_seed());
    std::vector<int> results;
    results.reserve(pieces.size());
    for (const auto& piece : pieces) results.push_back(contract_group(piece));
    return greedy_join(tree_, results, params_.greedy, next_seed());
  }

  // A bond's edge weighs its mode's weight. A hyperindex held by k nodes becomes a clique, each of
  // its edges 1/(k-1) of the weight: cutting it off one holder then costs about one mode, as it
  // does in the contraction (the holders on both sides keep it once).
  idx_t edge_weight(int m) const {
    const idx_t w = mode_weight_[static_cast<size_t>(m)];
    if (!net_.hyper(m)) return w;
    return std::max<idx_t>(1, w / (net_.appearances[static_cast<size_t>(m)] - 1));
  }

  GroupGraph graph_of(const std::vector<int>& group) {
    for (size_t i = 0; i < group.size(); ++i) local_of_[static_cast<size_t>(group[i])] = static_cast<int>(i);
    GroupGraph g;
    g.offsets.reserve(group.size() + 1);
    // Neighbour -> its entry's position, to add up the legs two nodes share; a position before
    // this row's start is left from an earlier row.
    std::vector<int> slot_of(group.size(), -1);
    for (size_t i = 0; i < group.size(); ++i) {
      const int row_start = static_cast<int>(g.neighbours.size());
      for (int m : tree_.legs(group[i])) {
        const idx_t weight = edge_weight(m);
        holders_.for_each(m, [&](int other_node) {
          if (other_node == group[i]) return;
          const int other = local_of_[static_cast<size_t>(other_node)];
          if (other < 0) return;  // a leg to outside the group: not this split's concern
          int& slot = slot_of[static_cast<size_t>(other)];
          if (slot < row_start) {
            slot = static_cast<int>(g.neighbours.size());
            g.neighbours.push_back(other);
            g.weights.push_back(0);
          }
          g.weights[static_cast<size_t>(slot)] += weight;
        });
      }
      g.offsets.push_back(static_cast<idx_t>(g.neighbours.size()));
    }
    for (int v : group) local_of_[static_cast<size_t>(v)] = -1;
    return g;
  }

  // Splits a group with METIS into at most `parts` non-empty pieces (each in the group's order).
  // Fewer than two pieces back means METIS could not split it: the caller falls back to greedy.
  std::vector<std::vector<int>> split(const std::vector<int>& group, int parts, double imbalance) {
    GroupGraph g = graph_of(group);
    const std::uint64_t seed = next_seed();
    if (!g.has_edges()) return {};
    idx_t options[METIS_NOPTIONS];
    METIS_SetDefaultOptions(options);
    options[METIS_OPTION_NUMBERING] = 0;
    options[METIS_OPTION_SEED] = static_cast<idx_t>(seed & 0x7fffffff);
    options[METIS_OPTION_UFACTOR] = static_cast<idx_t>(std::max(1.0, std::round(1000 * imbalance)));
    idx_t vertices = g.vertices(), constraints = 1, nparts = parts, cut = 0;
    std::vector<idx_t> part(static_cast<size_t>(vertices), 0);
    // Two parts by one bisection; more by METIS's k-way scheme, which cuts better than its
    // recursive bisection here and, unlike it, never prints complaints: with a large imbalance
    // recursive bisection can leave a side empty that it still has to split (and says so on stdout).
    int status;
    {
      MetisCall call;
      status = (parts == 2 ? METIS_PartGraphRecursive : METIS_PartGraphKway)(
          &vertices, &constraints, g.offsets.data(), g.neighbours.data(), nullptr, nullptr, g.weights.data(), &nparts,
          nullptr, nullptr, options, &cut, part.data());
    }
    if (status != METIS_OK) return {};
    std::vector<std::vector<int>> pieces(static_cast<size_t>(parts));
    for (size_t i = 0; i < group.size(); ++i) {
      const idx_t k = part[i];
      if (k < 0 || k >= parts) return {};
      pieces[static_cast<size_t>(k)].push_back(group[i]);
    }
    std::erase_if(pieces, [](const std::vector<int>& piece) { return piece.empty(); });
    return pieces;
  }
};

}  // namespace

ContractionTree partition_tree(const SearchNetwork& net, const PartitionParams& p, std::uint64_t seed) {
  check_params(p);
  if (net.tensors == 0) throw InputError("partition: the network has no tensors");
  return PartitionBuilder(net, p, seed).build();
}

bool metis_calls_overlap() {
  static const bool bound = [] {
    auto same = [](const char* name, void* ours) { return dlsym(RTLD_DEFAULT, name) == ours; };
    return same("rand", reinterpret_cast<void*>(&::rand)) && same("srand", reinterpret_cast<void*>(&::srand)) &&
           same("__sysv_signal", reinterpret_cast<void*>(&::__sysv_signal));
  }();
  return bound;
}

}  // namespace qstage::tn

// The C library's generator and System V signal() as libmetis sees them (MetisCall says why).
extern "C" int rand() noexcept { return qstage::tn::thread_random.next(); }
extern "C" void srand(unsigned seed) noexcept { qstage::tn::thread_random.seed(seed); }
extern "C" __sighandler_t __sysv_signal(int signal, __sighandler_t handler) noexcept {
  if (qstage::tn::inside_metis && (signal == SIGABRT || signal == SIGTERM)) return SIG_DFL;
  static const auto next = reinterpret_cast<__sighandler_t (*)(int, __sighandler_t)>(dlsym(RTLD_NEXT, "__sysv_signal"));
  return next(signal, handler);
}
