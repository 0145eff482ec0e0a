#pragma once
// Subtree reconfiguration (cotengra's subtree_reconfigure; seed 000 uses the same idea): take a
// subtree of the contraction tree down to a frontier of at most `subtree_size` nodes, find the
// optimal way to contract those frontier tensors into the subtree's root by dynamic programming
// over subsets, and keep it if it is cheaper. Passes visit the most expensive steps first and
// repeat until a pass gains nothing (or the deadline passes).
//
// Costs are those of the tree as it is sliced (sliced modes at extent 1). The DP minimizes the
// subtree's multiply-adds (slice-invariant steps, which run once, weighted by 1/slices: the total
// with reuse) and never makes a tensor larger than 2^max_log2_size (the cap; the subtree's own
// tensors before the change are always allowed).
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

struct ReconfigureOptions {
  int subtree_size = 8;  // frontier nodes per subtree (2..12); DP is about 3^size
  int max_passes = 64;
  double max_log2_size = std::numeric_limits<double>::infinity();
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Not empty: start from the subtrees whose top is one of these nodes or above one (and go on
  // around what that rewrites) instead of from every subtree. Slicing uses it after each mode it
  // slices: only the steps above the mode's two tensors changed, so only they can gain.
  std::vector<int> only_above;
};

struct ReconfigureReport {
  int passes = 0;
  int subtrees_tried = 0;
  int subtrees_improved = 0;
  double log10_before = 0, log10_after = 0;  // total multiply-adds (with reuse), log10
};

// Improves `tree` in place; returns whether it changed. Deterministic (no randomness, no timing
// dependence except where the deadline stops it).
bool reconfigure(ContractionTree& tree, const ReconfigureOptions& o, ReconfigureReport* report = nullptr);

}  // namespace qstage::tn
