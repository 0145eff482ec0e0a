#pragma once
// The path hyper-optimizer: samples path-finding methods and their parameters, keeps the best
// trees, then refines them (subtree reconfiguration, and slicing to a memory cap interleaved with
// reconfiguration), within a time budget, on all cores.
//
// How (cotengra's HyperOptimizer is the model; the code is ours):
// - Trials run from a window on all threads. Trial i's method and parameters depend only on the
//   seed, i and the results of trials 0 ... i - kLag, and results are folded in trial order, so the
//   same seed and trial count give the same tree whatever the thread count or speed.
// - Methods: "greedy" (randomized greedy: costmod, temperature) and "partition" (recursive METIS
//   partitioning: parts, imbalance, their decay with depth, cutoff, edge noise, and the greedy
//   parameters for small groups). Early trials sample uniformly; later ones mostly perturb the
//   best parameters found so far for their method, and methods get trials in proportion to how
//   well they do.
// - A trial's score is log10 of its total multiply-adds; with a cap, after slicing the tree to the
//   cap (slice-invariant steps counted once), so a tree that needs fewer slices can win.
// - Refinement: the best kRefined distinct trees are reconfigured (and, with a cap, sliced with
//   reconfiguration between the sliced modes) in parallel; the best result is the path.
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/tn/paths/slicing.hpp"
#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

struct HyperOptions {
  double max_seconds = 5;          // the whole search, refinement included
  // Planning time that fits the job: with a rate, the search stops once it has taken as long as
  // contracting the best tree found so far `jobs` times would at `multiply_add_rate` (per second),
  // but not before min_trials trials, or min_seconds if that comes first (and never after
  // max_seconds). Off with rate 0.
  double multiply_add_rate = 0;
  double jobs = 1;
  int min_trials = 0;  // (after which, with a rate, the budget counts the best tree as refined: hyper.cpp)
  double min_seconds = 0;
  int max_trials = 0;              // 0: as many as the time allows
  std::uint64_t seed = 0;
  std::vector<std::string> methods = {"greedy", "partition"};
  bool reconfigure = true;         // refine the best trees by subtree reconfiguration
  int subtree_size = 8;            // frontier size of reconfigured subtrees
  double max_log2_size = std::numeric_limits<double>::infinity();  // memory cap: slice to it (elements, log2)
  int threads = 0;                 // 0: omp_get_max_threads()
  // Called on the calling thread after each round (trials so far, best log10 score, seconds).
  std::function<void(int, double, double)> progress;
};

struct HyperResult {
  Path path;                       // SSA steps and sliced modes
  TreeCost cost;
  int trials = 0;
  double seconds = 0, search_seconds = 0, refine_seconds = 0;
  double budget_seconds = 0;       // the budget the search ended with (max_seconds, or less with a rate)
  double refine_gain = 0;          // log10 of the best trial's score above the best tree refined at the least
                                   // search's end (a fitted budget's probe)
  int refined_early = 0;           // kept trees refined then and still kept at the end (not refined again)
  double early_refine_seconds = 0; // what refining them then took (within search_seconds)
  std::string best_method;
  nlohmann::json best_params;      // the parameters of the trial the path came from
  double log10_best_trial = 0;     // its score before refinement
  nlohmann::json methods;          // per method: trials, best log10 score
  SliceReport slicing;             // with a cap
  ReconfigureReport reconfiguring; // the refinement of the chosen tree
  nlohmann::json to_json() const;
};

// Methods that hyper_optimize knows.
const std::vector<std::string>& hyper_methods();

// Throws InputError for an unknown method or a network of no tensors.
HyperResult hyper_optimize(const SearchNetwork& net, const HyperOptions& o);

// The time the search may take when its best tree so far costs 10^best_log10_multiply_adds per
// job (HyperOptions: max_seconds, or with a rate the predicted contraction time within
// [least_seconds, max_seconds]; hyper_optimize's least_seconds: the least trials' time).
double budget_seconds(const HyperOptions& o, double best_log10_multiply_adds, double least_seconds);

// The default time budget for a network of `tensors` tensors: 2 s for small networks, growing
// with the size (a 1000-tensor circuit gets 5 s), at most 10 s.
double default_search_seconds(int tensors);

}  // namespace qstage::tn
