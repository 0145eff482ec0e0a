#include "stages/tn/paths/greedy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <optional>
#include <queue>
#include <tuple>

#include "core/error.hpp"
#include "kernels/common.hpp"

namespace qstage::tn {
namespace {

// A reproducible uniform stream on (0, 1): the same numbers on every machine and standard library.
struct UniformStream {
  std::uint64_t state;
  double next() {
    state += kernels::kGolden;
    return (static_cast<double>(kernels::splitmix64(state) >> 11) + 0.5) * 0x1p-53;
  }
  // Single precision is plenty for noise, and logf costs a third of log.
  double gumbel() { return -std::log(-std::log(static_cast<float>(next()))); }
};

// A pair of live nodes that share a leg, as local numbers (see GreedyJoin) with a < b; smaller
// keys are joined first. Each pair is made once, so (key, a, b) orders candidates totally and the
// order never depends on how the heap stores equal keys.
struct Candidate {
  double key;
  int a, b;
};

bool goes_before(const Candidate& x, const Candidate& y) {
  if (x.key != y.key) return x.key < y.key;
  if (x.a != y.a) return x.a < y.a;
  return x.b < y.b;
}
bool goes_after(const Candidate& x, const Candidate& y) { return goes_before(y, x); }

// A 4-ary min-heap (four children of 16 bytes share a cache line): the nodes' best candidates.
class CandidateHeap {
 public:
  bool empty() const { return items_.empty(); }

  void push(const Candidate& c) {
    size_t i = items_.size();
    items_.push_back(c);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!goes_before(c, items_[parent])) break;
      items_[i] = items_[parent];
      i = parent;
    }
    items_[i] = c;
  }

  Candidate pop() {
    const Candidate top = items_.front();
    const Candidate last = items_.back();
    items_.pop_back();
    const size_t n = items_.size();
    if (n == 0) return top;
    size_t i = 0;
    while (true) {
      const size_t first = 4 * i + 1;
      if (first >= n) break;
      size_t best = first;
      const size_t end = std::min(first + 4, n);
      for (size_t j = first + 1; j < end; ++j)
        if (goes_before(items_[j], items_[best])) best = j;
      if (!goes_before(items_[best], last)) break;
      items_[i] = items_[best];
      i = best;
    }
    items_[i] = last;
    return top;
  }

 private:
  std::vector<Candidate> items_;
};

// Per-mode state reused across calls on one thread: the network's mode count can be thousands
// and the partitioner calls greedy_join on many small groups, so clearing only what the last call
// touched keeps each call proportional to its group, not to the network.
thread_local ModeHolders scratch;

// sign(x) * log(1 + |x|) for x = inner * 2^scale without overflow: the temperature's scale. Unlike
// sign(x) log|x| it is monotone through |x| < 1, so with little noise the order stays the score's.
// Past 2^40 the 1 is below double precision, and plain log is cheaper than log1p.
double signed_log(double inner, double scale) {
  if (inner == 0) return 0;
  const double magnitude = std::abs(inner);
  double log_abs;
  if (scale > 1000) {
    log_abs = std::log(magnitude) + scale * std::numbers::ln2;
  } else {
    const double x = magnitude * std::exp2(scale);
    log_abs = x > 0x1p40 ? std::log(x) : std::log1p(x);
  }
  return inner > 0 ? log_abs : -log_abs;
}

// Throws unless v is a node of the tree in use and without a parent.
void check_parentless(const ContractionTree& tree, int v, const char* who) {
  if (v < 0 || v >= tree.node_capacity() || tree.parent(v) >= 0 || (!tree.is_leaf(v) && tree.left(v) < 0))
    throw InputError(fmt::format("{}: node {} is not a parentless node of the tree", who, v));
}

class GreedyJoin {
 public:
  GreedyJoin(ContractionTree& tree, const GreedyParams& p, std::uint64_t seed)
      : tree_(tree), net_(tree.network()), params_(p), noise_{kernels::splitmix64(seed)} {}

  int run(const std::vector<int>& nodes) {
    adopt(nodes);
    make_initial_lists();
    while (live_ > 1) {
      const auto pair = next_connected_pair();
      if (!pair) break;
      join(pair->first, pair->second, /*find_neighbours=*/true);
    }
    join_disconnected_by_size();
    return tree_id_[static_cast<size_t>(last_)];
  }

 private:
  ContractionTree& tree_;
  const SearchNetwork& net_;
  GreedyParams params_;
  UniformStream noise_;

  // Local numbers: the given nodes are 0..k-1, the joins make k, k+1, ...
  std::vector<int> tree_id_;
  std::vector<double> log2_size_;
  std::vector<char> alive_;
  int live_ = 0;
  int last_ = -1;
  // Candidates live in per-node lists: a node's list holds its pairs with the nodes that were live
  // when it was made (older ones), as a min-heap, and only its front is in the global heap. A join
  // makes a node of many legs (tens, deep in a circuit) that is usually joined again soon: its list
  // is dropped unread, where one global heap of all pairs would push and pop every entry (most of
  // them stale). Either way the live pair with the smallest (key, a, b) goes next.
  std::vector<Candidate> lists_;            // all lists, one after another
  std::vector<int> list_begin_, list_end_;  // per node: its list in lists_ (the front at begin)
  CandidateHeap fronts_;
  // Neighbour accumulation: the log2 size that joining with a neighbour removes.
  std::vector<int> seen_by_;
  std::vector<double> removed_log2_;
  std::vector<int> neighbours_;

  double effective_log2_extent(int mode) const {
    return tree_.sliced(mode) ? 0.0 : net_.log2_extent[static_cast<size_t>(mode)];
  }

  int add_local(int tree_id) {
    const int local = static_cast<int>(tree_id_.size());
    tree_id_.push_back(tree_id);
    log2_size_.push_back(tree_.log2_size(tree_id));
    alive_.push_back(1);
    seen_by_.push_back(-1);
    removed_log2_.push_back(0);
    list_begin_.push_back(0);
    list_end_.push_back(0);
    ++live_;
    last_ = local;
    return local;
  }

  void adopt(const std::vector<int>& nodes) {
    if (nodes.empty()) throw InputError("greedy_join: no nodes to join");
    std::vector<int> sorted(nodes);
    std::sort(sorted.begin(), sorted.end());
    if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end())
      throw InputError(fmt::format("greedy_join: node {} is listed twice", *twice));
    const size_t k = nodes.size();
    for (auto* v : {&tree_id_, &seen_by_, &neighbours_, &list_begin_, &list_end_}) v->reserve(2 * k);
    lists_.reserve(8 * k);
    log2_size_.reserve(2 * k);
    removed_log2_.reserve(2 * k);
    alive_.reserve(2 * k);
    scratch.prepare(net_);
    for (int v : nodes) {
      check_parentless(tree_, v, "greedy_join");
      const int local = add_local(v);
      for (int m : tree_.legs(v)) scratch.add(m, local);
    }
  }

  // Collects the live nodes sharing a leg with `u` into neighbours_, each once, with the log2 size a
  // join removes: twice a contracted leg (from both operands), once a leg that stays.
  void collect_neighbours(int u) {
    neighbours_.clear();
    const int tu = tree_id_[static_cast<size_t>(u)];
    for (int m : tree_.legs(tu)) {
      scratch.for_each(m, [&](int other) {
        if (other == u || !alive_[static_cast<size_t>(other)]) return;
        const double removed = tree_.log2_saved(m, tu, tree_id_[static_cast<size_t>(other)]);
        if (seen_by_[static_cast<size_t>(other)] != u) {
          seen_by_[static_cast<size_t>(other)] = u;
          removed_log2_[static_cast<size_t>(other)] = 0;
          neighbours_.push_back(other);
        }
        removed_log2_[static_cast<size_t>(other)] += removed;
      });
    }
  }

  // cotengra's greedy score |a.b| / costmod - (|a| + |b|) * costmod, in elements; lower goes first.
  // With a temperature it is taken to a log scale and Gumbel noise is subtracted.
  double key(int a, int b, double removed_log2) {
    const double la = log2_size_[static_cast<size_t>(a)], lb = log2_size_[static_cast<size_t>(b)];
    const double lc = la + lb - removed_log2;
    const double scale = std::max({la, lb, lc});
    const double inner = std::exp2(lc - scale) / params_.costmod -
                         (std::exp2(la - scale) + std::exp2(lb - scale)) * params_.costmod;
    if (params_.temperature <= 0) return inner == 0 ? 0.0 : inner * std::exp2(scale);  // +-inf past 2^1024: still ordered
    return signed_log(inner, scale) - params_.temperature * noise_.gumbel();
  }

  // Makes the list of `owner` from neighbours_ (those older than it) and offers its front.
  void make_list(int owner) {
    const size_t begin = lists_.size();
    for (int x : neighbours_)
      if (x < owner) lists_.push_back({key(x, owner, removed_log2_[static_cast<size_t>(x)]), x, owner});
    std::make_heap(lists_.begin() + static_cast<std::ptrdiff_t>(begin), lists_.end(), goes_after);
    list_begin_[static_cast<size_t>(owner)] = static_cast<int>(begin);
    list_end_[static_cast<size_t>(owner)] = static_cast<int>(lists_.size());
    if (begin < lists_.size()) fronts_.push(lists_[begin]);
  }

  void make_initial_lists() {
    const int k = static_cast<int>(tree_id_.size());
    for (int u = 0; u < k; ++u) {
      collect_neighbours(u);
      make_list(u);
    }
  }

  std::optional<std::pair<int, int>> next_connected_pair() {
    while (!fronts_.empty()) {
      const Candidate c = fronts_.pop();  // the front of c.b's list
      if (!alive_[static_cast<size_t>(c.b)]) continue;
      if (alive_[static_cast<size_t>(c.a)]) return std::pair{c.a, c.b};
      // The partner is gone: drop fronts until one with a live partner comes up.
      const int begin = list_begin_[static_cast<size_t>(c.b)];
      int& end = list_end_[static_cast<size_t>(c.b)];
      do {
        std::pop_heap(lists_.begin() + begin, lists_.begin() + end, goes_after);
        --end;
      } while (end > begin && !alive_[static_cast<size_t>(lists_[static_cast<size_t>(begin)].a)]);
      if (end > begin) fronts_.push(lists_[static_cast<size_t>(begin)]);
    }
    return std::nullopt;
  }

  int join(int a, int b, bool find_neighbours) {
    const int v = tree_.join(tree_id_[static_cast<size_t>(a)], tree_id_[static_cast<size_t>(b)]);
    alive_[static_cast<size_t>(a)] = alive_[static_cast<size_t>(b)] = 0;
    live_ -= 2;
    const int c = add_local(v);
    for (int m : tree_.legs(v)) scratch.replace(m, a, b, c);  // the surviving legs now belong to c
    if (find_neighbours) {
      collect_neighbours(c);
      make_list(c);
    }
    return c;
  }

  // What is left shares no legs: outer products, smallest first (ties by tree id), which keeps the
  // growing products as small as they can be.
  void join_disconnected_by_size() {
    if (live_ <= 1) return;
    using Entry = std::tuple<double, int, int>;  // (log2 size, tree id, local number)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> by_size;
    for (size_t u = 0; u < tree_id_.size(); ++u)
      if (alive_[u]) by_size.push({log2_size_[u], tree_id_[u], static_cast<int>(u)});
    while (by_size.size() > 1) {
      const int a = std::get<2>(by_size.top());
      by_size.pop();
      const int b = std::get<2>(by_size.top());
      by_size.pop();
      const int c = join(a, b, /*find_neighbours=*/false);
      by_size.push({log2_size_[static_cast<size_t>(c)], tree_id_[static_cast<size_t>(c)], c});
    }
  }
};

// The log2 size each neighbour of u would lose in a join with u (contracted legs twice, output
// legs once), for the absorption pass: mode -> holders as tree ids, per-node state by tree id.
struct AbsorptionState {
  const ContractionTree& tree;
  ModeHolders holders;
  std::vector<double> log2_size, removed_with;
  std::vector<int> seen_by, neighbours;

  void collect_neighbours(int u) {
    neighbours.clear();
    for (int m : tree.legs(u)) {
      holders.for_each(m, [&](int v) {
        if (v == u || tree.parent(v) >= 0) return;
        if (seen_by[static_cast<size_t>(v)] != u) {
          seen_by[static_cast<size_t>(v)] = u;
          removed_with[static_cast<size_t>(v)] = 0;
          neighbours.push_back(v);
        }
        removed_with[static_cast<size_t>(v)] += tree.log2_saved(m, u, v);
      });
    }
  }

  // The neighbour whose join with u is smallest and no larger than the larger of the two; -1: none.
  int host_for(int u) const {
    int host = -1;
    double best = 0;
    for (int v : neighbours) {
      const double su = log2_size[static_cast<size_t>(u)], sv = log2_size[static_cast<size_t>(v)];
      const double joined = su + sv - removed_with[static_cast<size_t>(v)];
      if (joined > std::max(su, sv) + 1e-9) continue;
      if (host < 0 || joined < best || (joined == best && v < host)) {
        host = v;
        best = joined;
      }
    }
    return host;
  }
};

void check_params(const GreedyParams& p) {
  if (!(p.costmod > 0) || !std::isfinite(p.costmod))
    throw InputError(fmt::format("greedy: costmod is {}; expected a positive number", p.costmod));
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    throw InputError(fmt::format("greedy: temperature is {}; expected a number >= 0", p.temperature));
}

}  // namespace

int greedy_join(ContractionTree& tree, const std::vector<int>& nodes, const GreedyParams& p, std::uint64_t seed) {
  check_params(p);
  if (nodes.size() == 1) {
    check_parentless(tree, nodes[0], "greedy_join");
    return nodes[0];
  }
  return GreedyJoin(tree, p, seed).run(nodes);
}

std::vector<int> absorb_small_tensors(ContractionTree& tree, const std::vector<int>& nodes) {
  const size_t capacity = static_cast<size_t>(tree.node_capacity());
  AbsorptionState state{tree, {}, {}, {}, {}, {}};
  state.holders.prepare(tree.network());
  state.log2_size.assign(capacity, 0);
  state.removed_with.assign(capacity, 0);
  state.seen_by.assign(capacity, -1);
  std::vector<char> given(capacity, 0);
  for (int v : nodes) {
    check_parentless(tree, v, "absorb_small_tensors");
    if (given[static_cast<size_t>(v)]++) throw InputError(fmt::format("absorb_small_tensors: node {} is listed twice", v));
    state.log2_size[static_cast<size_t>(v)] = tree.log2_size(v);
    for (int m : tree.legs(v)) state.holders.add(m, v);
  }
  // Each node is examined once when it appears; a join's result is examined again, since it may
  // take in the next gate along a wire. Pairs of older nodes do not change, so nothing else can.
  std::vector<int> queue(nodes);
  for (size_t next = 0; next < queue.size(); ++next) {
    const int u = queue[next];
    if (tree.parent(u) >= 0) continue;
    state.collect_neighbours(u);
    const int host = state.host_for(u);
    if (host < 0) continue;
    const int c = tree.join(host, u);
    state.log2_size[static_cast<size_t>(c)] = tree.log2_size(c);
    for (int m : tree.legs(c)) state.holders.replace(m, u, host, c);
    queue.push_back(c);
  }
  std::vector<int> remaining;
  for (int v : queue)
    if (tree.parent(v) < 0) remaining.push_back(v);
  std::sort(remaining.begin(), remaining.end());
  return remaining;
}

ContractionTree greedy_tree(const SearchNetwork& net, const GreedyParams& p, std::uint64_t seed) {
  if (net.tensors == 0) throw InputError("greedy: the network has no tensors");
  check_params(p);
  ContractionTree tree(net);
  std::vector<int> leaves(static_cast<size_t>(net.tensors));
  for (int i = 0; i < net.tensors; ++i) leaves[static_cast<size_t>(i)] = i;
  greedy_join(tree, absorb_small_tensors(tree, leaves), p, seed);
  return tree;
}

}  // namespace qstage::tn
