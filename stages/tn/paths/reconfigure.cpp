#include "stages/tn/paths/reconfigure.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

namespace qstage::tn {

namespace {

constexpr int kMaxFrontier = 12;
// Leg sets in the DP are bitsets over the subtree's local modes, in at most this many 64-bit words
// (512 modes). Subtrees with more distinct modes on their frontier are skipped: twelve tensors of
// a circuit network hold a few dozen modes at most, so only pathological networks get there.
constexpr int kMaxWords = 8;
// A rewrite must gain more than this fraction of the subtree's cost: rounding differences between
// equal-cost shapes would otherwise swap them back and forth.
constexpr double kRelativeGain = 1e-12;
// Sizes are sums of log2 extents; this absorbs their rounding when comparing with the cap.
constexpr double kLog2Slack = 1e-9;

// ------------------------------------------------------------------------------ subtree shape

// The part of the tree from `top` down to `frontier` (nodes none of which is below another, that
// together cover top's leaves).
struct Subtree {
  int top = -1;
  std::vector<int> frontier;
};

// Two ways to grow a subtree's frontier down from its top. Passes use the first until it gains
// nothing, then the second, and so on until neither gains: the two give different subtrees, so
// each escapes some of the other's local optima (converged, the 5x8 grid 12-cycle circuit's
// greedy tree goes from 10^12.13 to 10^10.74 with the first alone, 10^11.20 with the second alone,
// 10^10.68 alternating; the 53-qubit circuit's from 10^18.58 to 18.44, 18.51 and 18.39).
enum class Growth {
  costliest_first,  // expand the frontier node whose own step is the most expensive
  breadth_first,    // expand the shallowest nodes first (cotengra's get_subtree, search="bfs")
};

// Grows the frontier from top's children by expanding, each time, the frontier node whose own
// step is the most expensive (ties: the lower id), until it holds `size` nodes or only leaves.
// Expensive steps are where a different order can gain the most, so they go into the DP.
Subtree grow_costliest_first(const ContractionTree& tree, int top, int size) {
  Subtree s;
  s.top = top;
  s.frontier = {tree.left(top), tree.right(top)};
  std::vector<double> step_cost = {tree.log2_cost(s.frontier[0]), tree.log2_cost(s.frontier[1])};
  while (static_cast<int>(s.frontier.size()) < size) {
    int pick = -1;
    for (size_t i = 0; i < s.frontier.size(); ++i) {
      if (tree.is_leaf(s.frontier[i])) continue;
      if (pick < 0 || step_cost[i] > step_cost[static_cast<size_t>(pick)] ||
          (step_cost[i] == step_cost[static_cast<size_t>(pick)] && s.frontier[i] < s.frontier[static_cast<size_t>(pick)]))
        pick = static_cast<int>(i);
    }
    if (pick < 0) break;
    const int v = s.frontier[static_cast<size_t>(pick)];
    s.frontier[static_cast<size_t>(pick)] = tree.left(v);
    step_cost[static_cast<size_t>(pick)] = tree.log2_cost(tree.left(v));
    s.frontier.push_back(tree.right(v));
    step_cost.push_back(tree.log2_cost(tree.right(v)));
  }
  return s;
}

// Grows the frontier level by level (right child queued before left), until it holds `size`
// nodes or only leaves.
Subtree grow_breadth_first(const ContractionTree& tree, int top, int size) {
  Subtree s;
  s.top = top;
  std::vector<int> queue{top}, real_leaves;
  size_t head = 0;
  while (queue.size() - head + real_leaves.size() < static_cast<size_t>(size) && head < queue.size()) {
    const int v = queue[head++];
    if (tree.is_leaf(v)) {
      real_leaves.push_back(v);
      continue;
    }
    queue.push_back(tree.right(v));
    queue.push_back(tree.left(v));
  }
  s.frontier.assign(queue.begin() + static_cast<long>(head), queue.end());
  s.frontier.insert(s.frontier.end(), real_leaves.begin(), real_leaves.end());
  return s;
}

Subtree grow_subtree(const ContractionTree& tree, int top, int size, Growth growth) {
  return growth == Growth::costliest_first ? grow_costliest_first(tree, top, size) : grow_breadth_first(tree, top, size);
}

// The current shape between top and frontier as splits of frontier-position masks, children
// before parents (the last one makes the top), and the inner node ids in the same order.
// `position` maps node id -> frontier position (-1 elsewhere) and is left as it was found.
struct Shape {
  std::vector<int> inner;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> splits;  // (left's mask, right's mask)
};

Shape current_shape(const ContractionTree& tree, const Subtree& s, std::vector<int>& position) {
  for (size_t i = 0; i < s.frontier.size(); ++i) position[static_cast<size_t>(s.frontier[i])] = static_cast<int>(i);
  Shape shape;
  std::vector<std::pair<int, bool>> stack{{s.top, false}};
  std::vector<std::uint32_t> finished;  // masks of finished subtrees, a stack
  while (!stack.empty()) {
    auto [v, expanded] = stack.back();
    stack.pop_back();
    const int p = position[static_cast<size_t>(v)];
    if (p >= 0) {
      finished.push_back(1u << p);
    } else if (expanded) {
      const std::uint32_t r = finished.back();
      finished.pop_back();
      const std::uint32_t l = finished.back();
      finished.pop_back();
      finished.push_back(l | r);
      shape.inner.push_back(v);
      shape.splits.push_back({l, r});
    } else {
      stack.push_back({v, true});
      stack.push_back({tree.right(v), false});
      stack.push_back({tree.left(v), false});
    }
  }
  for (int f : s.frontier) position[static_cast<size_t>(f)] = -1;
  return shape;
}

// ------------------------------------------------------------------------------ local modes

// The frontier's modes that cost anything (not sliced, extent > 1), numbered 0..L-1 in order of
// (log2 extent, mode): modes of one extent then form a run of bits, so a leg set's log2 size is
// a few popcounts weighted per run.
struct LocalModes {
  std::vector<int> global;  // local -> global mode number
  struct Run {
    int first, count;
    double log2_extent;
  };
  std::vector<Run> runs;
  int count() const { return static_cast<int>(global.size()); }
};

LocalModes local_modes(const ContractionTree& tree, const std::vector<int>& frontier, std::vector<int>& local_of) {
  const SearchNetwork& net = tree.network();
  LocalModes lm;
  for (int f : frontier)
    for (int k : tree.legs(f))
      if (!tree.sliced(k) && net.log2_extent[static_cast<size_t>(k)] > 0 && local_of[static_cast<size_t>(k)] < 0) {
        local_of[static_cast<size_t>(k)] = 0;  // seen
        lm.global.push_back(k);
      }
  std::sort(lm.global.begin(), lm.global.end(), [&](int a, int b) {
    const double ea = net.log2_extent[static_cast<size_t>(a)], eb = net.log2_extent[static_cast<size_t>(b)];
    return ea != eb ? ea < eb : a < b;
  });
  for (int i = 0; i < lm.count(); ++i) {
    const int k = lm.global[static_cast<size_t>(i)];
    local_of[static_cast<size_t>(k)] = i;
    const double e = net.log2_extent[static_cast<size_t>(k)];
    if (lm.runs.empty() || lm.runs.back().log2_extent != e) lm.runs.push_back({i, 0, e});
    ++lm.runs.back().count;
  }
  return lm;
}

void forget_local_modes(const LocalModes& lm, std::vector<int>& local_of) {
  for (int k : lm.global) local_of[static_cast<size_t>(k)] = -1;
}

// ------------------------------------------------------------------------------ subset DP

template <int W>
struct Bits {
  std::array<std::uint64_t, W> w{};
  void set(int i) { w[static_cast<size_t>(i >> 6)] |= std::uint64_t{1} << (i & 63); }
  friend Bits operator^(const Bits& a, const Bits& b) {
    Bits r;
    for (int i = 0; i < W; ++i) r.w[i] = a.w[i] ^ b.w[i];
    return r;
  }
  friend Bits operator|(const Bits& a, const Bits& b) {
    Bits r;
    for (int i = 0; i < W; ++i) r.w[i] = a.w[i] | b.w[i];
    return r;
  }
  friend Bits operator&(const Bits& a, const Bits& b) {
    Bits r;
    for (int i = 0; i < W; ++i) r.w[i] = a.w[i] & b.w[i];
    return r;
  }
};

// log2 of the size of a leg set: per run of equal extents, popcount times log2 extent.
template <int W>
struct Weigher {
  std::vector<std::pair<Bits<W>, double>> runs;  // mask of the run, log2 extent
  bool uniform = false;                          // one run: a single popcount does
  double uniform_log2 = 0;

  std::array<double, 64 * W + 1> uniform_size;  // uniform: exp2(n * uniform_log2) for n legs, n <= lm.count()

  explicit Weigher(const LocalModes& lm) {
    for (const auto& r : lm.runs) {
      Bits<W> m;
      for (int i = r.first; i < r.first + r.count; ++i) m.set(i);
      runs.push_back({m, r.log2_extent});
    }
    uniform = runs.size() == 1;
    if (uniform) {
      uniform_log2 = runs[0].second;
      for (int n = 0; n <= lm.count(); ++n) uniform_size[static_cast<size_t>(n)] = std::exp2(n * uniform_log2);
    }
  }
  [[gnu::always_inline]] static int legs(const Bits<W>& b) {
    int n = 0;
    for (int i = 0; i < W; ++i) n += std::popcount(b.w[i]);
    return n;
  }
  double operator()(const Bits<W>& b) const {
    if (uniform) return legs(b) * uniform_log2;
    double s = 0;
    for (const auto& [mask, e] : runs) {
      int n = 0;
      for (int i = 0; i < W; ++i) n += std::popcount(b.w[i] & mask.w[i]);
      s += n * e;
    }
    return s;
  }
  // The size exp2(weight): looked up where every extent is the same (the DP's inner loop asks
  // for it per split; the values are exp2's own).
  double size(const Bits<W>& b) const {
    return uniform ? uniform_size[static_cast<size_t>(legs(b))] : std::exp2((*this)(b));
  }
};

// What the DP needs to know about a subtree, independent of the word count.
struct DpProblem {
  int F = 0;
  std::vector<std::vector<int>> frontier_locals;  // per frontier position: its legs as local modes
  std::vector<int> output_locals;                 // local modes kept whenever held: output modes, and
                                                  // hyperindices with holders outside the subtree
  // Hyperindices that three or more frontier tensors hold, and nothing outside: (local mode, mask of
  // those positions). A subset's tensor keeps one while the subset holds some but not all of it.
  std::vector<std::pair<int, std::uint32_t>> closing;
  std::vector<char> invariant;                    // per frontier position
  double invariant_weight = 1;                    // 1 / slices: slice-invariant steps run once
  double max_log2_size = 0;
  const Shape* shape = nullptr;                   // the current shape
};

struct DpResult {
  double best = 0;     // the optimum's cost
  double current = 0;  // the current shape's cost, by the same arithmetic
  std::vector<std::pair<int, int>> joins;  // the optimum, as replace_subtree wants it
};

// Reused buffers: a pass solves thousands of subtrees.
template <int W>
struct DpBuffers {
  std::vector<Bits<W>> legs, xor_legs, or_legs;
  std::vector<double> best;
  std::vector<std::uint32_t> split;
  std::vector<char> allowed, invariant;
};

int append_joins(std::uint32_t S, const std::vector<std::uint32_t>& split, int F, std::vector<std::pair<int, int>>& joins) {
  if (std::popcount(S) == 1) return std::countr_zero(S);
  const int a = append_joins(split[S], split, F, joins);
  const int b = append_joins(S ^ split[S], split, F, joins);
  joins.push_back({a, b});
  return F + static_cast<int>(joins.size()) - 1;
}

// Optimal contraction of the F frontier tensors into the top by DP over subsets of positions:
// best[S] = min over splits S = S1 + S2 of best[S1] + best[S2] + weight(S) * 2^|legs(S1) ∪ legs(S2)|,
// weight(S) = 1/slices if S is slice-invariant, else 1. legs(S) = XOR of the members' legs plus
// their output modes (exact for bonds; hyperindices, see DpProblem). Subsets whose tensor exceeds
// the cap are infeasible unless the current shape already makes that tensor, so the current
// shape is always a candidate and the optimum never costs more than it.
template <int W>
[[gnu::always_inline]] inline DpResult solve_subsets_body(const DpProblem& p, const LocalModes& lm, DpBuffers<W>& buf) {
  const int F = p.F;
  const std::uint32_t full = (1u << F) - 1;
  const size_t n = size_t{1} << F;
  const Weigher<W> weigh(lm);
  Bits<W> output;
  for (int i : p.output_locals) output.set(i);

  buf.legs.assign(n, Bits<W>{});
  buf.xor_legs.assign(n, Bits<W>{});
  buf.or_legs.assign(n, Bits<W>{});
  buf.invariant.assign(n, 1);
  buf.allowed.assign(n, 0);
  buf.best.assign(n, std::numeric_limits<double>::infinity());
  buf.split.assign(n, 0);

  for (int i = 0; i < F; ++i) {
    Bits<W> b;
    for (int m : p.frontier_locals[static_cast<size_t>(i)]) b.set(m);
    buf.xor_legs[1u << i] = buf.or_legs[1u << i] = b;
  }
  for (std::uint32_t S = 1; S <= full; ++S) {
    const std::uint32_t low = S & (~S + 1);
    const std::uint32_t rest = S ^ low;
    const bool low_invariant = p.invariant[static_cast<size_t>(std::countr_zero(low))];
    if (rest) {
      buf.xor_legs[S] = buf.xor_legs[rest] ^ buf.xor_legs[low];
      buf.or_legs[S] = buf.or_legs[rest] | buf.or_legs[low];
      buf.invariant[S] = buf.invariant[rest] && low_invariant;
    } else {
      buf.invariant[S] = low_invariant;
    }
    buf.legs[S] = buf.xor_legs[S] | (buf.or_legs[S] & output);
    for (const auto& [local, mask] : p.closing)
      if ((S & mask) != 0 && (S & mask) != mask) buf.legs[S].set(local);
    buf.allowed[S] = rest == 0 || weigh(buf.legs[S]) <= p.max_log2_size + kLog2Slack;
  }
  for (const auto& [l, r] : p.shape->splits) buf.allowed[l | r] = 1;
  for (int i = 0; i < F; ++i) buf.best[1u << i] = 0;

  auto step_cost = [&](std::uint32_t S1, std::uint32_t S2) {
    return weigh.size(buf.legs[S1] | buf.legs[S2]) * (buf.invariant[S1 | S2] ? p.invariant_weight : 1.0);
  };

  for (std::uint32_t S = 1; S <= full; ++S) {
    if (std::popcount(S) < 2 || !buf.allowed[S]) continue;
    // Each unordered split once: S1 holds S's lowest member, S2 the rest (never empty).
    const std::uint32_t low = S & (~S + 1);
    const std::uint32_t rest = S ^ low;
    double best = std::numeric_limits<double>::infinity();
    std::uint32_t best_split = 0;
    for (std::uint32_t sub = (rest - 1) & rest;; sub = (sub - 1) & rest) {
      const std::uint32_t S1 = sub | low, S2 = S ^ S1;
      const double below = buf.best[S1] + buf.best[S2];  // infinite if either is infeasible
      if (below < best) {  // steps cost > 0: only then can this split win
        const double total = below + step_cost(S1, S2);
        if (total < best) {
          best = total;
          best_split = S1;
        }
      }
      if (sub == 0) break;
    }
    buf.best[S] = best;
    buf.split[S] = best_split;
  }

  DpResult r;
  r.best = buf.best[full];
  for (const auto& [l, rr] : p.shape->splits) r.current += step_cost(l, rr);
  if (r.best < r.current * (1 - kRelativeGain)) append_joins(full, buf.split, F, r.joins);
  return r;
}

// The DP compiled twice on x86-64: with the popcnt instruction (x86-64-v2, every x86 CPU since
// 2008) where the CPU has it, else as the portable build compiles it (a call to libgcc's
// __popcountdi2 per weighed split: 9 % of a refinement).
#if defined(__x86_64__) && defined(__GNUC__)
template <int W>
[[gnu::target("popcnt")]] DpResult solve_subsets_popcnt(const DpProblem& p, const LocalModes& lm, DpBuffers<W>& buf) {
  return solve_subsets_body<W>(p, lm, buf);
}
#endif
template <int W>
DpResult solve_subsets(const DpProblem& p, const LocalModes& lm, DpBuffers<W>& buf) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool popcnt = __builtin_cpu_supports("popcnt");
  if (popcnt) return solve_subsets_popcnt<W>(p, lm, buf);
#endif
  return solve_subsets_body<W>(p, lm, buf);
}

// Buffers for every word count, kept across the subtrees of a call.
struct Workspace {
  DpBuffers<1> w1;
  DpBuffers<2> w2;
  DpBuffers<4> w4;
  DpBuffers<8> w8;
  std::vector<int> position;  // node id -> frontier position, -1 elsewhere
  std::vector<int> local_of;  // mode number -> local mode, -1 elsewhere
};

// Solves with the fewest words that hold the subtree's modes; false if it has too many.
bool solve(const DpProblem& p, const LocalModes& lm, Workspace& ws, DpResult& r) {
  const int L = lm.count();
  if (L <= 64) r = solve_subsets<1>(p, lm, ws.w1);
  else if (L <= 128) r = solve_subsets<2>(p, lm, ws.w2);
  else if (L <= 256) r = solve_subsets<4>(p, lm, ws.w4);
  else if (L <= 64 * kMaxWords) r = solve_subsets<8>(p, lm, ws.w8);
  else return false;
  return true;
}

// ------------------------------------------------------------------------------ passes

// Identifies a subtree and its current shape, for "already optimized". Two counters per node id:
// `tensor` changes when replace_subtree reuses the id for a different set of leaves, `links` when
// the node gets different children (reused, or the top of a rewrite). Equal keys mean the same
// frontier tensors joined the same way, so a subtree solved before needs no second look - and a
// rewrite elsewhere that reshaped part of it changes its key.
struct Versions {
  std::vector<std::uint32_t> tensor, links;
};
using SubtreeKey = std::vector<std::uint64_t>;

SubtreeKey subtree_key(const Subtree& s, const Shape& shape, const Versions& versions) {
  auto entry = [](std::uint32_t version, int id, bool inner) {
    return (std::uint64_t{version} << 32) | (static_cast<std::uint64_t>(id) << 1) | (inner ? 1u : 0u);
  };
  SubtreeKey key;
  for (int f : s.frontier) key.push_back(entry(versions.tensor[static_cast<size_t>(f)], f, false));
  for (int v : shape.inner) key.push_back(entry(versions.links[static_cast<size_t>(v)], v, true));
  std::sort(key.begin(), key.end());
  return key;
}

DpProblem dp_problem(const ContractionTree& tree, const Subtree& s, const Shape& shape, const LocalModes& lm,
                     const std::vector<int>& local_of, const std::vector<char>& invariant, double invariant_weight,
                     double max_log2_size) {
  const SearchNetwork& net = tree.network();
  DpProblem p;
  p.F = static_cast<int>(s.frontier.size());
  // Hyperindices on the frontier: which positions hold each, and how many of its holders they cover.
  std::vector<std::uint32_t> mask(static_cast<size_t>(lm.count()), 0);
  std::vector<int> covered(static_cast<size_t>(lm.count()), 0);
  if (net.has_hyperindices)
    for (int i = 0; i < p.F; ++i)
      for (const auto& [k, held] : tree.holdings(s.frontier[static_cast<size_t>(i)])) {
        const int local = local_of[static_cast<size_t>(k)];
        if (local < 0) continue;
        mask[static_cast<size_t>(local)] |= 1u << i;
        covered[static_cast<size_t>(local)] += held;
      }
  std::vector<char> kept(static_cast<size_t>(lm.count()), 0), closing(static_cast<size_t>(lm.count()), 0);
  for (int i = 0; i < lm.count(); ++i) {
    const size_t k = static_cast<size_t>(lm.global[static_cast<size_t>(i)]);
    if (net.output[k]) {
      kept[static_cast<size_t>(i)] = 1;
    } else if (net.hyper(static_cast<int>(k))) {
      if (covered[static_cast<size_t>(i)] < net.appearances[k]) kept[static_cast<size_t>(i)] = 1;
      else if (std::popcount(mask[static_cast<size_t>(i)]) > 2) closing[static_cast<size_t>(i)] = 1;
    }
    if (kept[static_cast<size_t>(i)]) p.output_locals.push_back(i);
    if (closing[static_cast<size_t>(i)]) p.closing.push_back({i, mask[static_cast<size_t>(i)]});
  }
  for (int f : s.frontier) {
    std::vector<int> locals;
    for (int k : tree.legs(f)) {
      const int local = local_of[static_cast<size_t>(k)];
      if (local >= 0 && !closing[static_cast<size_t>(local)]) locals.push_back(local);
    }
    p.frontier_locals.push_back(std::move(locals));
    p.invariant.push_back(invariant[static_cast<size_t>(f)]);
  }
  p.invariant_weight = invariant_weight;
  p.max_log2_size = max_log2_size;
  p.shape = &shape;
  return p;
}

// After replace_subtree: the nodes between top and frontier are new; their invariance is the AND
// of the frontier nodes below them. Returns the new shape.
Shape update_invariance(const ContractionTree& tree, const Subtree& s, std::vector<int>& position,
                        std::vector<char>& invariant) {
  Shape shape = current_shape(tree, s, position);
  for (int v : shape.inner)
    invariant[static_cast<size_t>(v)] = invariant[static_cast<size_t>(tree.left(v))] && invariant[static_cast<size_t>(tree.right(v))];
  return shape;
}

struct PassResult {
  int tried = 0, improved = 0;
  bool out_of_time = false;
};

// The tops to visit in the next pass. `ever` remembers every top marked during the call, so that
// switching to the other growth revisits all of them (and, with only_above, nothing else).
struct DirtySet {
  std::vector<char> now, ever;
  void mark(int v) { now[static_cast<size_t>(v)] = ever[static_cast<size_t>(v)] = 1; }
  // v and its ancestors: the subtrees that reach down to v.
  void mark_up(const ContractionTree& tree, int v) {
    for (; v >= 0; v = tree.parent(v)) mark(v);
  }
  void rearm() { now = ever; }
};

// One pass over the subtrees whose top is dirty: the most expensive steps first (that is where
// the gain is, and a deadline cuts the cheap ones). A rewrite at top t changes the subtrees that
// reach into t's new inner nodes - those of t's ancestors and of the inner nodes themselves - so
// it marks them for the next pass; a subtree whose key is known is skipped.
PassResult run_pass(ContractionTree& tree, const ReconfigureOptions& o, Workspace& ws, std::set<SubtreeKey>& optimized,
                    Versions& versions, std::vector<char>& invariant, DirtySet& dirty, Growth growth) {
  PassResult result;
  const double invariant_weight = std::exp2(-tree.log2_slices());
  const int size = std::clamp(o.subtree_size, 2, kMaxFrontier);
  std::vector<std::pair<double, int>> tops;
  for (int v : tree.post_order())
    if (!tree.is_leaf(v) && dirty.now[static_cast<size_t>(v)]) tops.push_back({-tree.log2_cost(v), v});
  std::sort(tops.begin(), tops.end());
  for (const auto& [neg_cost, top] : tops) {
    if (std::chrono::steady_clock::now() >= o.deadline) {
      result.out_of_time = true;
      break;
    }
    dirty.now[static_cast<size_t>(top)] = 0;
    const Subtree s = grow_subtree(tree, top, size, growth);
    if (s.frontier.size() < 3) continue;  // two tensors join one way only
    const Shape shape = current_shape(tree, s, ws.position);
    SubtreeKey key = subtree_key(s, shape, versions);
    if (optimized.count(key)) continue;
    const LocalModes lm = local_modes(tree, s.frontier, ws.local_of);
    const DpProblem problem = dp_problem(tree, s, shape, lm, ws.local_of, invariant, invariant_weight, o.max_log2_size);
    forget_local_modes(lm, ws.local_of);
    DpResult r;
    if (!solve(problem, lm, ws, r)) continue;
    ++result.tried;
    if (!r.joins.empty()) {
      tree.replace_subtree(top, s.frontier, r.joins);
      for (int v : shape.inner) {
        ++versions.links[static_cast<size_t>(v)];
        if (v != top) ++versions.tensor[static_cast<size_t>(v)];
      }
      const Shape rewritten = update_invariance(tree, s, ws.position, invariant);
      key = subtree_key(s, rewritten, versions);
      for (int v : rewritten.inner) dirty.mark(v);
      dirty.mark_up(tree, top);
      ++result.improved;
    }
    optimized.insert(std::move(key));
  }
  return result;
}

}  // namespace

bool reconfigure(ContractionTree& tree, const ReconfigureOptions& o, ReconfigureReport* report) {
  ReconfigureReport rep;
  rep.log10_before = rep.log10_after = std::log10(std::max(tree.cost().total_with_reuse(), 1.0));
  if (!tree.complete() || tree.leaves() < 3) {
    if (report) *report = rep;
    return false;
  }
  Workspace ws;
  ws.position.assign(static_cast<size_t>(tree.node_capacity()), -1);
  ws.local_of.assign(static_cast<size_t>(tree.network().modes()), -1);
  Versions versions;
  versions.tensor.assign(static_cast<size_t>(tree.node_capacity()), 0);
  versions.links.assign(static_cast<size_t>(tree.node_capacity()), 0);
  std::vector<char> invariant = tree.slice_invariant();
  std::set<SubtreeKey> optimized;
  DirtySet dirty;
  dirty.now.assign(static_cast<size_t>(tree.node_capacity()), o.only_above.empty() ? 1 : 0);
  dirty.ever = dirty.now;
  for (int v : o.only_above) dirty.mark_up(tree, v);
  bool changed = false;
  Growth growth = Growth::costliest_first;
  bool other_growth_converged = false;
  while (rep.passes < o.max_passes) {
    const PassResult pass = run_pass(tree, o, ws, optimized, versions, invariant, dirty, growth);
    ++rep.passes;
    rep.subtrees_tried += pass.tried;
    rep.subtrees_improved += pass.improved;
    changed = changed || pass.improved > 0;
    if (pass.out_of_time) break;
    if (pass.improved > 0) {
      other_growth_converged = false;
      continue;
    }
    // This growth has converged; stop once the other one has too, with nothing changed since.
    if (other_growth_converged) break;
    other_growth_converged = true;
    growth = growth == Growth::costliest_first ? Growth::breadth_first : Growth::costliest_first;
    dirty.rearm();
  }
  rep.log10_after = std::log10(std::max(tree.cost().total_with_reuse(), 1.0));
  if (report) *report = rep;
  return changed;
}

}  // namespace qstage::tn
