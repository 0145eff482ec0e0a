#pragma once
// Trees by recursive partitioning of the network's graph (cotengra's "kahypar" method, with METIS
// as the partitioner): split the tensors into `parts` groups with few and small legs between them
// (edge weights: log2 of the modes' extents), recurse into each group, and join the groups' results
// greedily; groups of at most `cutoff` tensors are contracted by randomized greedy. Balanced cuts
// keep intermediates small where the structure rewards them; on closed networks with wide
// bisections (deep circuits, lattices) greedy's sweeps measured better (greedy_tree: 10^18.5 on
// 53 qubits, 20 cycles; partition 10^22-23), so the hyper-optimizer should let the two compete.
//
// METIS (Debian's libmetis-dev) rather than Scotch: the networks here have no hyperedges (every
// mode joins at most two tensors), so a graph partitioner is exact; METIS takes an imbalance
// tolerance and a seed per call and is deterministic for a given seed (calls serialized, below),
// which keeps the search reproducible; and its k-way and bisection calls cover "parts".
#include <cstdint>

#include "stages/tn/paths/greedy.hpp"
#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

// Sizes below are counted in nodes after absorb_small_tensors (greedy.hpp), which runs first: a
// circuit's gates are absorbed into the two-qubit gates next to them (a 53-qubit, 20-cycle
// Sycamore circuit of 3369 tensors leaves 381 nodes). A group of n of those N nodes has relative
// size s = n / N; the decays follow cotengra's rules in s (the ranges its hyper-optimizer uses work).
struct PartitionParams {
  int parts = 2;                 // groups per split (2..16); 2: one METIS bisection, more: METIS k-way
  double parts_decay = 0.5;      // 0..1: a group splits into max(2, floor(parts * s^parts_decay))
  double imbalance = 0.1;        // > 0: parts may exceed the average by this fraction (METIS ufactor
                                 // 1000 * imbalance), after the decay clamped to [0.001, 1]
  double imbalance_decay = 0.0;  // -5..5: >= 0: imbalance * s^decay (tighter in small groups);
                                 // < 0: 1 - s^-decay * (1 - imbalance) (looser in small groups)
  int cutoff = 16;               // >= 1: groups of at most this many nodes go to greedy
  double edge_noise = 0.0;       // >= 0: edge weights are log2 extents times (1 + edge_noise * u),
                                 // u uniform on [0, 1), drawn per mode and seed (varies the cuts)
  GreedyParams greedy;           // for small groups and for joining a split's groups
};

// A whole tree. Deterministic for a given seed, also when called from several threads at once
// (Debian's METIS draws from the C library's rand() and traps SIGABRT/SIGTERM for the length of
// each call: partition.cpp gives it both per thread). Throws InputError for parameters out of range.
ContractionTree partition_tree(const SearchNetwork& net, const PartitionParams& p, std::uint64_t seed);

// Whether METIS calls on several threads overlap (the per-thread bindings are in effect in this
// process), or run one at a time.
bool metis_calls_overlap();

}  // namespace qstage::tn
