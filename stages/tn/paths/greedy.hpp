#pragma once
// Randomized greedy contraction (cotengra's "greedy" with random cost parameters): repeatedly
// join the pair of connected tensors with the best score
//   |a.b| / costmod - (|a| + |b|) * costmod
// (sizes in elements), with a temperature: sign(score) log(1 + |score|) - temperature * Gumbel
// noise. Sampling costmod per trial is what lets greedy find good trees for deep circuits (53
// qubits, 20 cycles: costmod 1 gives 10^28.7 multiply-adds, costmod 2.2..4 10^18.5). Noise on this
// log scale only reorders near-ties, so 1e-4..1e-2 act alike; it helps some circuits (40 qubits,
// 12 cycles: 10^10.9 against 10^12.6 without), costs others (53/20: 10^18.9 against 10^18.5) and
// hurts everywhere from about 0.1 up. A search should sample temperature 0 as well as 1e-4..0.05.
#include <cstdint>
#include <vector>

#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

struct GreedyParams {
  double costmod = 1.0;      // > 0
  double temperature = 0.0;  // >= 0; 0: no noise
};

// Joins the parentless nodes `nodes` of `tree` (at least one) into one, greedily, and returns the
// node that holds them all. Pairs that share a leg go first; when none is left, the two smallest
// tensors are joined (outer products). Sizes count sliced modes at extent 1. Deterministic for a
// given seed; equal keys go to the pair whose nodes come first in `nodes` (a join's result counts
// as after all of them). That order matters: a circuit's tensors are numbered in time order, and
// with temperature 0 the ties make greedy sweep through time (53 qubits, 20 cycles: 10^18.5 in id
// order, 10^20.4 shuffled). Throws InputError for bad parameters or nodes (not parentless, listed
// twice, or sharing a mode three ways).
int greedy_join(ContractionTree& tree, const std::vector<int>& nodes, const GreedyParams& p, std::uint64_t seed);

// Joins each of the parentless nodes `nodes` into a neighbour among them while the result is no
// larger than the larger of the two (a circuit's single-qubit gates, initial states and
// projections into the two-qubit gates next to them), and returns the parentless nodes left, in id
// order. Such joins cost next to nothing and good trees make them; taking them first keeps greedy
// and the partitioner from spending choices (and cuts) on them. Deterministic, no parameters; it
// allocates per node of the tree, so it is meant for whole networks rather than small groups.
std::vector<int> absorb_small_tensors(ContractionTree& tree, const std::vector<int>& nodes);

// A whole tree: absorb_small_tensors over all leaves, then greedy_join of what is left. Absorbing
// first is better on every circuit tried and several times faster (53 qubits, 20 cycles: best
// log10 C_t over 100 draws 18.5 against 19.5 without, and 18.9 against 23.4 with temperatures).
ContractionTree greedy_tree(const SearchNetwork& net, const GreedyParams& p, std::uint64_t seed);

}  // namespace qstage::tn
