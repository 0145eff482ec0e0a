#pragma once
// Slicing by cost (cotengra's SliceFinder, and seed 000's slicing): choose closed modes to fix per
// slice so that the largest tensor fits a target size, picking each time the mode that gives the
// smallest total cost - not merely the largest shrink - and, between choices, reconfiguring the
// sliced tree (the best order changes once a mode is sliced). Total cost counts slice-invariant
// steps once (tree.hpp): sliced execution runs them once, not once per slice.
#include <chrono>
#include <cstdint>

#include "stages/tn/paths/reconfigure.hpp"
#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

struct SliceOptions {
  double target_log2_size = 0;   // the largest tensor must be at most 2^this (elements)
  bool count_inputs = true;      // the target holds for input tensors too (false: intermediates only)
  bool reconfigure = true;       // reconfigure the tree between sliced modes
  int subtree_size = 8;          // for that reconfiguration
  int tries = 1;                 // > 1: also randomized choices (Gumbel noise on scores), keep the best
  double temperature = 0.02;     // of that noise, relative
  std::uint64_t seed = 0;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct SliceReport {
  int sliced_modes = 0;             // modes added
  double log10_unsliced = 0;        // total multiply-adds before slicing (the tree as given)
  double log10_sliced = 0;          // total with reuse after
  double overhead = 1;              // sliced total (with reuse) / unsliced total
  double overhead_without_reuse = 1;  // every step once per slice / unsliced total
  bool fits = false;                // the largest tensor is within the target
};

// Slices (and, with reconfigure, reshapes) `tree` in place until its largest tensor fits the
// target, or no closed mode is left. Output modes are never sliced. Deterministic for a seed.
SliceReport slice_tree(ContractionTree& tree, const SliceOptions& o);

}  // namespace qstage::tn
