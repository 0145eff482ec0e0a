#include "stages/tn/paths/slicing.hpp"

#include <stdexcept>
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kernels/common.hpp"

namespace qstage::tn {

namespace {

// Sizes are sums of log2 extents; this absorbs their rounding when comparing with the target.
constexpr double kLog2Slack = 1e-9;

// The tree's numbers as it is sliced now, per node id, for scoring candidate modes against a
// target size.
struct SliceState {
  std::vector<int> nodes;          // post-order
  std::vector<double> log2_size;
  std::vector<double> step;        // multiply-adds of the node's step per slice (0 for leaves)
  std::vector<int> sliced_below;   // (leaf, sliced mode) holdings below the node: 0 = slice-invariant
  std::vector<int> contracted_at;  // per mode: the node whose step contracts it (-1: output mode)
  // Sums over the node and its ancestors ("up" the tree): a sum over the path from a leaf to the
  // root, or over the part of it below some ancestor, is then one or two lookups.
  std::vector<double> up_step, up_variant, up_invariant;
  std::vector<int> up_at_largest, up_oversized;
  double log2_slices = 0;
  double variant_sum = 0;      // the steps that run once per slice
  double invariant_sum = 0;    // ... and those that run once
  double largest = 0;          // log2 of the largest tensor
  int at_largest = 0;          // tensors of that size
  int oversized = 0;           // tensors above the target
  double total_with_reuse() const { return invariant_sum + variant_sum * std::exp2(log2_slices); }
};

// Modes in both operands of v's step and not in its result are contracted there (output modes
// and hyperindices with holders elsewhere are kept).
void record_contractions(const ContractionTree& tree, int v, std::vector<int>& contracted_at) {
  const Legs& a = tree.legs(tree.left(v));
  const Legs& b = tree.legs(tree.right(v));
  const Legs& c = tree.legs(v);
  for (size_t x = 0, y = 0; x < a.size() && y < b.size();) {
    if (a[x] < b[y]) {
      ++x;
    } else if (b[y] < a[x]) {
      ++y;
    } else {
      if (!std::binary_search(c.begin(), c.end(), a[x])) contracted_at[static_cast<size_t>(a[x])] = v;
      ++x;
      ++y;
    }
  }
}

// Leaves count with their size only if `inputs` (else as empty: tn.plan keeps inputs resident,
// outside the memory the target stands for).
double log2_size_of(const ContractionTree& tree, int v, bool inputs) {
  return !inputs && tree.is_leaf(v) ? -std::numeric_limits<double>::infinity() : tree.log2_size(v);
}

SliceState measure(const ContractionTree& tree, double target, bool inputs) {
  SliceState st;
  const size_t n = static_cast<size_t>(tree.node_capacity());
  st.nodes = tree.post_order();
  st.log2_size.assign(n, 0);
  st.step.assign(n, 0);
  st.sliced_below.assign(n, 0);
  st.contracted_at.assign(static_cast<size_t>(tree.network().modes()), -1);
  st.log2_slices = tree.log2_slices();
  st.largest = -std::numeric_limits<double>::infinity();
  for (int v : st.nodes) {
    const size_t i = static_cast<size_t>(v);
    st.log2_size[i] = log2_size_of(tree, v, inputs);
    st.largest = std::max(st.largest, st.log2_size[i]);
    if (tree.is_leaf(v)) {
      for (int k : tree.legs(v)) st.sliced_below[i] += tree.sliced(k) ? 1 : 0;
      continue;
    }
    st.sliced_below[i] = st.sliced_below[static_cast<size_t>(tree.left(v))] + st.sliced_below[static_cast<size_t>(tree.right(v))];
    st.step[i] = std::exp2(tree.log2_cost(v));
    (st.sliced_below[i] == 0 ? st.invariant_sum : st.variant_sum) += st.step[i];
    record_contractions(tree, v, st.contracted_at);
  }
  auto at_largest = [&](size_t i) { return st.log2_size[i] >= st.largest - kLog2Slack ? 1 : 0; };
  auto oversized = [&](size_t i) { return st.log2_size[i] > target + kLog2Slack ? 1 : 0; };
  st.up_step.assign(n, 0);
  st.up_variant.assign(n, 0);
  st.up_invariant.assign(n, 0);
  st.up_at_largest.assign(n, 0);
  st.up_oversized.assign(n, 0);
  for (auto it = st.nodes.rbegin(); it != st.nodes.rend(); ++it) {  // parents before children
    const size_t i = static_cast<size_t>(*it);
    const int p = tree.parent(*it);
    const bool invariant = st.sliced_below[i] == 0;
    const size_t up = static_cast<size_t>(std::max(p, 0));
    const bool root = p < 0;
    st.up_step[i] = (root ? 0 : st.up_step[up]) + st.step[i];
    st.up_variant[i] = (root ? 0 : st.up_variant[up]) + (invariant ? 0 : st.step[i]);
    st.up_invariant[i] = (root ? 0 : st.up_invariant[up]) + (invariant ? st.step[i] : 0);
    st.up_at_largest[i] = (root ? 0 : st.up_at_largest[up]) + at_largest(i);
    st.up_oversized[i] = (root ? 0 : st.up_oversized[up]) + oversized(i);
    st.at_largest += at_largest(i);
    st.oversized += oversized(i);
  }
  return st;
}

double largest_log2_size(const ContractionTree& tree, bool inputs) {
  double largest = -std::numeric_limits<double>::infinity();
  for (int v : tree.post_order()) largest = std::max(largest, log2_size_of(tree, v, inputs));
  return largest;
}

// What slicing one more mode would do.
struct SliceEffect {
  double total_with_reuse = 0;     // of the whole sliced contraction afterwards
  double total_without_reuse = 0;  // ... if every step ran once per slice
  int largest_shrunk = 0;          // tensors of the largest size that hold the mode
  bool fits = false;               // whether the tree fits the target afterwards
};

// Slicing mode k (held by leaves h1 and h2, contracted at their lowest common ancestor a) only
// touches the nodes on the two leaf-to-root paths: below a the tensors hold k and the steps loop
// over it, so they shrink by its extent (a's step too); every node on the paths now depends on
// the slice, so it runs once per slice. Everything else keeps its step, and runs once per slice
// or once as before, with the new slice count. With the "up" sums that is O(1) per mode.
SliceEffect effect_of_slicing_hyperindex(const ContractionTree& tree, const SliceState& st, int k, double target);

SliceEffect effect_of_slicing(const ContractionTree& tree, const SliceState& st, int k, double target) {
  const SearchNetwork& net = tree.network();
  if (net.hyper(k)) return effect_of_slicing_hyperindex(tree, st, k, target);
  const size_t h1 = static_cast<size_t>(net.holders(k)[0]);
  const size_t h2 = static_cast<size_t>(net.holders(k)[1]);
  const size_t a = static_cast<size_t>(st.contracted_at[static_cast<size_t>(k)]);
  const double log2_extent = net.log2_extent[static_cast<size_t>(k)];
  const double extent = std::exp2(log2_extent);
  // The union of the two paths: both paths up to the root, less the shared part from a up.
  const double path_variant = st.up_variant[h1] + st.up_variant[h2] - st.up_variant[a];
  const double path_invariant = st.up_invariant[h1] + st.up_invariant[h2] - st.up_invariant[a];
  const double looping = st.up_step[h1] + st.up_step[h2] - 2 * st.up_step[a] + st.step[a];
  const double above = st.up_step[a] - st.step[a];
  const double slices = std::exp2(st.log2_slices + log2_extent);
  SliceEffect e;
  e.total_with_reuse = (st.invariant_sum - path_invariant) + slices * (st.variant_sum - path_variant + looping / extent + above);
  e.total_without_reuse = slices * (st.variant_sum + st.invariant_sum - looping + looping / extent);
  e.largest_shrunk = st.up_at_largest[h1] + st.up_at_largest[h2] - 2 * st.up_at_largest[a];
  // The tree fits afterwards if every tensor above the target holds k (the largest among them)
  // and the largest drops to the target.
  const int oversized_holding = st.up_oversized[h1] + st.up_oversized[h2] - 2 * st.up_oversized[a];
  e.fits = oversized_holding == st.oversized && st.largest - log2_extent <= target + kLog2Slack;
  return e;
}

// The nodes that hold hyperindex k (contracted at a): the paths from its holders up to a, a left
// out, each node once; with, per node, how many of k's holders lie below it.
std::vector<std::pair<int, int>> hyperindex_paths(const ContractionTree& tree, int k, int a) {
  std::vector<std::pair<int, int>> nodes;  // (node, holders below), in the order first reached
  std::unordered_map<int, size_t> index;
  for (int h : tree.network().holders(k))
    for (int v = h; v != a && v >= 0; v = tree.parent(v)) {
      const auto [it, fresh] = index.try_emplace(v, nodes.size());
      if (fresh) nodes.push_back({v, 1});
      else ++nodes[it->second].second;
    }
  return nodes;
}

// effect_of_slicing for a hyperindex: the same sums, over the union of its holders' paths up to
// the step that contracts it, walked rather than looked up.
SliceEffect effect_of_slicing_hyperindex(const ContractionTree& tree, const SliceState& st, int k, double target) {
  const SearchNetwork& net = tree.network();
  const size_t a = static_cast<size_t>(st.contracted_at[static_cast<size_t>(k)]);
  const double log2_extent = net.log2_extent[static_cast<size_t>(k)];
  const double extent = std::exp2(log2_extent);
  double path_variant = st.up_variant[a], path_invariant = st.up_invariant[a], looping = st.step[a];
  int largest_shrunk = 0, oversized_holding = 0;
  for (const auto& [v, below] : hyperindex_paths(tree, k, static_cast<int>(a))) {
    const size_t i = static_cast<size_t>(v);
    const size_t up = static_cast<size_t>(tree.parent(v));  // v is below a: it has a parent
    path_variant += st.up_variant[i] - st.up_variant[up];
    path_invariant += st.up_invariant[i] - st.up_invariant[up];
    looping += st.step[i];
    largest_shrunk += st.up_at_largest[i] - st.up_at_largest[up];
    oversized_holding += st.up_oversized[i] - st.up_oversized[up];
  }
  const double above = st.up_step[a] - st.step[a];
  const double slices = std::exp2(st.log2_slices + log2_extent);
  SliceEffect e;
  e.total_with_reuse = (st.invariant_sum - path_invariant) + slices * (st.variant_sum - path_variant + looping / extent + above);
  e.total_without_reuse = slices * (st.variant_sum + st.invariant_sum - looping + looping / extent);
  e.largest_shrunk = largest_shrunk;
  e.fits = oversized_holding == st.oversized && st.largest - log2_extent <= target + kLog2Slack;
  return e;
}

// What unslicing a sliced mode k would do: whether every tensor that holds k still fits the
// target at k's full extent, and the total with reuse then. Walks the two leaf-to-root paths.
struct UnsliceEffect {
  bool fits = true;
  double total_with_reuse = 0;
};

UnsliceEffect effect_of_unslicing(const ContractionTree& tree, const SliceState& st, int k, double target) {
  const SearchNetwork& net = tree.network();
  const int a = st.contracted_at[static_cast<size_t>(k)];
  const double log2_extent = net.log2_extent[static_cast<size_t>(k)];
  const double extent = std::exp2(log2_extent);
  const double slices = std::exp2(st.log2_slices - log2_extent);
  const int holders = net.appearances[static_cast<size_t>(k)];
  UnsliceEffect e;
  double old_variant = 0, old_invariant = 0, new_total = 0;
  // `holdings`: how many of k's holdings lie below v (all of them from a up); below a, v holds k.
  // v is slice-invariant afterwards if those were its only sliced holdings.
  auto visit = [&](int v, int holdings, bool holds_k) {
    const size_t i = static_cast<size_t>(v);
    if (holds_k && st.log2_size[i] + log2_extent > target + kLog2Slack) e.fits = false;
    if (tree.is_leaf(v)) return;
    (st.sliced_below[i] == 0 ? old_invariant : old_variant) += st.step[i];
    const double step = holds_k || v == a ? st.step[i] * extent : st.step[i];
    new_total += st.sliced_below[i] == holdings ? step : step * slices;
  };
  if (net.hyper(k)) {
    for (const auto& [v, below] : hyperindex_paths(tree, k, a)) visit(v, below, true);
    for (int v = a; v >= 0; v = tree.parent(v)) visit(v, holders, false);
  } else {
    const auto h = net.holders(k);
    bool above = false;  // at a or above it
    for (int v = h[0]; v >= 0; v = tree.parent(v)) {
      above = above || v == a;
      visit(v, above ? 2 : 1, !above);
    }
    for (int v = h[1]; v != a; v = tree.parent(v)) visit(v, 1, true);
  }
  e.total_with_reuse = (st.invariant_sum - old_invariant) + slices * (st.variant_sum - old_variant) + new_total;
  return e;
}

// Closed, unsliced modes held by a tensor above the target: slicing anything else cannot help.
std::vector<int> candidate_modes(const ContractionTree& tree, const SliceState& st, double target) {
  const SearchNetwork& net = tree.network();
  std::vector<char> seen(static_cast<size_t>(net.modes()), 0);
  std::vector<int> out;
  for (int v : st.nodes) {
    if (st.log2_size[static_cast<size_t>(v)] <= target + kLog2Slack) continue;
    for (int k : tree.legs(v)) {
      const size_t i = static_cast<size_t>(k);
      if (seen[i] || net.output[i] || tree.sliced(k) || net.log2_extent[i] <= 0 || st.contracted_at[i] < 0) continue;
      seen[i] = 1;
      out.push_back(k);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Gumbel(0, 1) draws from a seeded counter-based stream.
struct GumbelStream {
  std::uint64_t state;
  double next() {
    state += kernels::kGolden;
    const double u = (static_cast<double>(kernels::splitmix64(state) >> 11) + 0.5) * 0x1p-53;
    return -std::log(-std::log(u));
  }
};

// Which mode to slice next. Slicing never lowers the total, so a mode that makes the tree fit and
// leaves a total (with reuse: that is the final cost) no higher than any other mode's total is
// the best choice there is. Otherwise the choice is a step on the way, scored as
//   ln(total without reuse after it) - ln 2 * (share of the largest tensors it shrinks):
// - without reuse, because the slices still to come will make most steps depend on the slice
//   anyway; counting reuse this early makes modes whose paths run through cheap, slice-invariant
//   steps look free, and the greedy then spends slices on them (the 5x8 grid at 2^24: overhead
//   16.7 that way, 3.6 this way);
// - with the share term, because a mode that shrinks every tensor of the largest size brings the
//   target a whole bit closer, which is worth about a doubling of the cost (a mode that shrinks
//   none of them brings it no closer at all; on the 53-qubit circuit at 2^30 the term takes the
//   overhead from 2788 to 293).
// Noise, when given, subtracts temperature * Gumbel from the log score: a Boltzmann choice in
// which a mode costing 1% more is e^(-0.01 / temperature) times as likely.
int choose_mode(const ContractionTree& tree, const SliceState& st, const std::vector<int>& candidates, double target,
                double temperature, GumbelStream* noise) {
  std::vector<SliceEffect> effects;
  double best_finishing = std::numeric_limits<double>::infinity();
  double best_other = std::numeric_limits<double>::infinity();
  bool any_fits = false;
  for (int k : candidates) {
    effects.push_back(effect_of_slicing(tree, st, k, target));
    const SliceEffect& e = effects.back();
    any_fits = any_fits || e.fits;
    (e.fits ? best_finishing : best_other) = std::min(e.fits ? best_finishing : best_other, e.total_with_reuse);
  }
  // (Only where a candidate fits: totals overflow to infinity on networks sliced into more than
  // 2^1000 slices, where "inf <= inf" once chose to finish with no candidate that fits, and the
  // mode -1 was sliced.)
  const bool finish_now = any_fits && best_finishing <= best_other;
  int best = -1;
  std::tuple<double, double, int> best_key{};  // score, then the reuse total, then the mode
  for (size_t c = 0; c < candidates.size(); ++c) {
    const SliceEffect& e = effects[c];
    if (finish_now && !e.fits) continue;
    double score = finish_now ? std::log(e.total_with_reuse)
                              : std::log(e.total_without_reuse) - std::log(2.0) * e.largest_shrunk / st.at_largest;
    if (noise) score -= temperature * noise->next();
    const std::tuple<double, double, int> key{score, e.total_with_reuse, candidates[c]};
    if (best < 0 || key < best_key) {
      best = candidates[c];
      best_key = key;
    }
  }
  return best;
}

// The cap for reshaping after a slice: the target once the tree fits it, else the tree's largest
// tensor, so that reconfiguration never undoes what slicing gained. (Capping at the target all
// along is worse: it forbids the intermediate shapes that reach the target with fewer slices -
// on the 53-qubit circuit at 2^30, 2^42 slices instead of 2^31.) Tensors the subtree already has
// stay allowed either way (reconfigure.hpp).
double reconfigure_cap(const ContractionTree& tree, double target, bool inputs) {
  const double largest = largest_log2_size(tree, inputs);
  return largest <= target + kLog2Slack ? target : std::max(largest, target);
}

// Reconfigures the subtrees above mode k's two tensors: slicing or unslicing k changed only the
// steps there (their cost, and whether they run once or once per slice).
void reshape_around(ContractionTree& tree, int k, const SliceOptions& o, double cap) {
  ReconfigureOptions r;
  r.subtree_size = o.subtree_size;
  r.max_log2_size = cap;
  r.deadline = o.deadline;
  for (int h : tree.network().holders(k)) r.only_above.push_back(h);
  reconfigure(tree, r);
}

bool before_deadline(const SliceOptions& o) { return std::chrono::steady_clock::now() < o.deadline; }

// Once the tree fits, a mode sliced early may have become unnecessary (later slices and
// reshaping shrank its tensors too). Unslicing never costs more, so drop such modes, the one that
// saves the most first, and reshape around it, until every added mode is needed.
void drop_unneeded_slices(ContractionTree& tree, std::vector<int>& added, const SliceOptions& o) {
  const double target = o.target_log2_size;
  while (before_deadline(o)) {  // (past the deadline the tree still fits, with modes to spare)
    const SliceState st = measure(tree, target, o.count_inputs);
    int drop = -1;
    double best_total = st.total_with_reuse();
    for (int k : added) {
      const UnsliceEffect e = effect_of_unslicing(tree, st, k, target);
      if (e.fits && e.total_with_reuse < best_total) {
        best_total = e.total_with_reuse;
        drop = k;
      }
    }
    if (drop < 0) return;
    tree.set_sliced(drop, false);
    added.erase(std::find(added.begin(), added.end(), drop));
    if (o.reconfigure && before_deadline(o)) reshape_around(tree, drop, o, target);
  }
}

// Whether the target is out of reach whatever is sliced: output modes are never sliced, so the
// output tensor keeps its size. Nothing else can block: every other tensor's modes are output
// modes, which the output holds too, or closed modes, which can be sliced.
bool provably_unreachable(const ContractionTree& tree, double target) {
  const SearchNetwork& net = tree.network();
  double output = 0;
  for (int k = 0; k < net.modes(); ++k)
    if (net.output[static_cast<size_t>(k)]) output += net.log2_extent[static_cast<size_t>(k)];
  return output > target + kLog2Slack;
}

struct TrialResult {
  int added = 0;
  bool fits = false;
  double total_with_reuse = 0;
};

// One greedy slicing run on `tree`: slice the chosen mode, reshape around it, repeat until the
// tree fits; then drop the modes it no longer needs.
TrialResult slice_once(ContractionTree& tree, const SliceOptions& o, GumbelStream* noise) {
  const double target = o.target_log2_size;
  std::vector<int> added;
  TrialResult result;
  for (;;) {
    const SliceState st = measure(tree, target, o.count_inputs);
    if (st.largest <= target + kLog2Slack) {
      result.fits = true;
      break;
    }
    if (!before_deadline(o)) break;  // out of time: reported as not fitting
    const std::vector<int> candidates = candidate_modes(tree, st, target);
    if (candidates.empty()) break;  // only output modes (or extent-1 modes) left to slice
    const int k = choose_mode(tree, st, candidates, target, o.temperature, noise);
    if (k < 0) throw std::logic_error("slicing: no mode chosen among the candidates");
    tree.set_sliced(k, true);
    added.push_back(k);
    if (o.reconfigure && before_deadline(o)) reshape_around(tree, k, o, reconfigure_cap(tree, target, o.count_inputs));
  }
  if (result.fits) drop_unneeded_slices(tree, added, o);
  result.added = static_cast<int>(added.size());
  result.total_with_reuse = tree.cost().total_with_reuse();
  return result;
}

// Fitting first, then the lower total with reuse.
bool better_trial(const TrialResult& a, const TrialResult& b) {
  if (a.fits != b.fits) return a.fits;
  return a.total_with_reuse < b.total_with_reuse;
}

}  // namespace

SliceReport slice_tree(ContractionTree& tree, const SliceOptions& o) {
  SliceReport rep;
  const double unsliced = std::max(tree.cost().total_with_reuse(), 1.0);
  rep.log10_unsliced = std::log10(unsliced);

  if (tree.complete() && !provably_unreachable(tree, o.target_log2_size)) {
    // The first try is the noiseless greedy; later tries add noise (each its own stream, from the
    // seed and the try's number) and the best is kept.
    const ContractionTree original = tree;
    TrialResult best = slice_once(tree, o, nullptr);
    for (int t = 1; t < o.tries && before_deadline(o); ++t) {
      ContractionTree trial = original;
      GumbelStream noise{kernels::splitmix64(o.seed ^ (kernels::kGolden * static_cast<std::uint64_t>(t)))};
      const TrialResult r = slice_once(trial, o, &noise);
      if (better_trial(r, best)) {
        tree = trial;
        best = r;
      }
    }
    rep.sliced_modes = best.added;
  }

  const TreeCost after = tree.cost();
  rep.fits = tree.complete() && largest_log2_size(tree, o.count_inputs) <= o.target_log2_size + kLog2Slack;
  rep.log10_sliced = std::log10(std::max(after.total_with_reuse(), 1.0));
  rep.overhead = after.total_with_reuse() / unsliced;
  rep.overhead_without_reuse = after.total() / unsliced;
  return rep;
}

}  // namespace qstage::tn
