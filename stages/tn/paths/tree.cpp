#include "stages/tn/paths/tree.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/error.hpp"

namespace qstage::tn {

SearchNetwork SearchNetwork::from(const Network& n) {
  SearchNetwork s;
  s.tensors = static_cast<int>(n.tensors.size());
  std::map<Mode, int> number;
  for (const auto& [m, e] : n.extent) {  // by mode label: the same numbering on every machine
    number[m] = static_cast<int>(s.labels.size());
    s.labels.push_back(m);
    s.log2_extent.push_back(std::log2(static_cast<double>(e)));
  }
  const size_t M = s.labels.size();
  s.output.assign(M, 0);
  for (Mode m : n.output) s.output[static_cast<size_t>(number.at(m))] = 1;
  s.appearances.assign(M, 0);
  for (int t = 0; t < s.tensors; ++t) {
    Legs legs;
    for (Mode m : n.tensors[static_cast<size_t>(t)].modes) {
      const int k = number.at(m);
      legs.push_back(k);
      ++s.appearances[static_cast<size_t>(k)];
    }
    std::sort(legs.begin(), legs.end());
    if (std::adjacent_find(legs.begin(), legs.end()) != legs.end())
      throw InputError(fmt::format("tensor {} holds a mode twice; expected traces to be taken first", t));
    s.inputs.push_back(std::move(legs));
  }
  s.holder_start.assign(M + 1, 0);
  for (size_t k = 0; k < M; ++k) {
    s.holder_start[k + 1] = s.holder_start[k] + s.appearances[k];
    s.has_hyperindices = s.has_hyperindices || s.appearances[k] > 2;
  }
  s.holder_list.resize(static_cast<size_t>(s.holder_start[M]));
  std::vector<int> fill(s.holder_start.begin(), s.holder_start.end() - 1);
  for (int t = 0; t < s.tensors; ++t)
    for (int k : s.inputs[static_cast<size_t>(t)]) s.holder_list[static_cast<size_t>(fill[static_cast<size_t>(k)]++)] = t;
  return s;
}

int SearchNetwork::number_of(Mode m) const {
  const auto it = std::lower_bound(labels.begin(), labels.end(), m);
  return it != labels.end() && *it == m ? static_cast<int>(it - labels.begin()) : -1;
}

namespace {

// The holding of hyperindex k in a sorted Holdings list that has it.
int holding_of(const Holdings& h, int k) {
  const auto it = std::lower_bound(h.begin(), h.end(), std::pair{k, 0});
  return it->second;
}

}  // namespace

void join_legs(const SearchNetwork& net, const Legs& a, const Holdings& ha, const Legs& b, const Holdings& hb, Legs& out,
               Holdings& out_holdings) {
  out.clear();
  out_holdings.clear();
  out.reserve(a.size() + b.size());
  size_t i = 0, j = 0;
  if (!net.has_hyperindices) {
    while (i < a.size() || j < b.size()) {
      if (j == b.size() || (i < a.size() && a[i] < b[j])) {
        out.push_back(a[i++]);
      } else if (i == a.size() || b[j] < a[i]) {
        out.push_back(b[j++]);
      } else {  // in both: contracted, unless it is an output mode
        if (net.output[static_cast<size_t>(a[i])]) out.push_back(a[i]);
        ++i;
        ++j;
      }
    }
    return;
  }
  // Holdings are sorted like the legs, so one cursor per side walks them along.
  size_t p = 0, q = 0;
  auto take = [&](int k, int held) {
    out.push_back(k);
    if (net.hyper(k)) out_holdings.push_back({k, held});
  };
  auto held_in = [&](const Holdings& h, size_t& cursor, int k) {
    if (!net.hyper(k)) return 1;
    while (h[cursor].first < k) ++cursor;
    return h[cursor].second;
  };
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i] < b[j])) {
      const int k = a[i++];
      take(k, held_in(ha, p, k));
    } else if (i == a.size() || b[j] < a[i]) {
      const int k = b[j++];
      take(k, held_in(hb, q, k));
    } else {  // in both: contracted once no holder is left elsewhere, unless it is an output mode
      const int k = a[i];
      const int held = held_in(ha, p, k) + held_in(hb, q, k);
      if (net.output[static_cast<size_t>(k)] || held < net.appearances[static_cast<size_t>(k)]) take(k, held);
      ++i;
      ++j;
    }
  }
}

void ModeHolders::prepare(const SearchNetwork& net) {
  for (int m : touched_) {  // whatever network they belonged to: the vectors only grow
    two_[static_cast<size_t>(m)] = {-1, -1};
    if (static_cast<size_t>(m) < many_.size()) many_[static_cast<size_t>(m)].clear();
  }
  touched_.clear();
  net_ = &net;
  if (two_.size() < static_cast<size_t>(net.modes())) two_.resize(static_cast<size_t>(net.modes()), {-1, -1});
  if (net.has_hyperindices && many_.size() < static_cast<size_t>(net.modes())) many_.resize(static_cast<size_t>(net.modes()));
}

void ModeHolders::add(int mode, int holder) {
  const size_t m = static_cast<size_t>(mode);
  if (net_->hyper(mode)) {
    if (many_[m].empty()) touched_.push_back(mode);
    many_[m].push_back(holder);
    return;
  }
  auto& h = two_[m];
  if (h[0] < 0) {
    h[0] = holder;
    touched_.push_back(mode);
  } else {
    h[1] = holder;
  }
}

void ModeHolders::replace(int mode, int a, int b, int c) {
  const size_t m = static_cast<size_t>(mode);
  if (net_->hyper(mode)) {
    auto& h = many_[m];
    std::erase_if(h, [&](int x) { return x == a || x == b; });
    h.push_back(c);
    return;
  }
  auto& h = two_[m];
  for (int& x : h)
    if (x == a || x == b) x = c;
  if (h[0] == c && h[1] == c) h[1] = -1;  // an output leg both held
}

Legs union_legs(const Legs& a, const Legs& b) {
  Legs out;
  out.reserve(a.size() + b.size());
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

double TreeCost::log10_total() const { return std::log10(std::max(total(), 1.0)); }
double TreeCost::log2_largest() const { return std::log2(std::max(largest, 1.0)); }
double TreeCost::log2_largest_intermediate() const { return std::log2(std::max(largest_intermediate, 1.0)); }

ContractionTree::ContractionTree(const SearchNetwork& net) : net_(&net) {
  const size_t N = static_cast<size_t>(net.tensors);
  const size_t capacity = N > 0 ? 2 * N - 1 : 0;
  left_.assign(capacity, -1);
  right_.assign(capacity, -1);
  parent_.assign(capacity, -1);
  legs_.resize(capacity);
  holdings_.resize(capacity);
  for (size_t t = 0; t < N; ++t) {
    legs_[t] = net.inputs[t];
    for (int k : legs_[t])
      if (net.hyper(k)) holdings_[t].push_back({k, 1});
  }
  sliced_.assign(net.labels.size(), 0);
  for (size_t v = capacity; v-- > N;) free_.push_back(static_cast<int>(v));  // lowest id first
  parentless_ = static_cast<int>(N);
  root_ = N == 1 ? 0 : -1;
}

int ContractionTree::new_node(int a, int b) {
  const int v = free_.back();
  free_.pop_back();
  left_[static_cast<size_t>(v)] = a;
  right_[static_cast<size_t>(v)] = b;
  parent_[static_cast<size_t>(v)] = -1;
  parent_[static_cast<size_t>(a)] = v;
  parent_[static_cast<size_t>(b)] = v;
  set_legs(v);
  return v;
}

void ContractionTree::set_legs(int v) {
  const size_t i = static_cast<size_t>(v);
  join_legs(*net_, legs(left(v)), holdings(left(v)), legs(right(v)), holdings(right(v)), legs_[i], holdings_[i]);
}

int ContractionTree::holdings(int v, int k) const { return holding_of(holdings(v), k); }

double ContractionTree::log2_saved(int k, int a, int b) const {
  if (sliced(k)) return 0.0;
  const size_t i = static_cast<size_t>(k);
  const bool stays = net_->output[i] || (net_->hyper(k) && holdings(a, k) + holdings(b, k) < net_->appearances[i]);
  return (stays ? 1.0 : 2.0) * net_->log2_extent[i];
}

int ContractionTree::join(int a, int b) {
  if (a == b || parent(a) >= 0 || parent(b) >= 0 || free_.empty())
    throw std::logic_error(fmt::format("tree: cannot join nodes {} and {}", a, b));
  const int v = new_node(a, b);
  if (--parentless_ == 1) root_ = v;
  return v;
}

ContractionTree ContractionTree::from_path(const SearchNetwork& net, const Path& path) {
  ContractionTree t(net);
  const int N = net.tensors;
  if (N == 0) throw InputError("the network has no tensors");
  if (static_cast<int>(path.ssa.size()) != N - 1)
    throw InputError(fmt::format("the path has {} steps; a network of {} tensors needs {}", path.ssa.size(), N, N - 1));
  std::vector<int> node;  // SSA id -> tree node
  for (int i = 0; i < N; ++i) node.push_back(i);
  std::vector<char> used(static_cast<size_t>(2 * N), 0);
  for (size_t s = 0; s < path.ssa.size(); ++s) {
    const auto [a, b] = path.ssa[s];
    const int limit = N + static_cast<int>(s);
    for (int id : {a, b})
      if (id < 0 || id >= limit || used[static_cast<size_t>(id)])
        throw InputError(fmt::format("path step {} uses id {}, which is {}", s, id,
                                     id < 0 || id >= limit ? "not defined yet" : "already consumed"));
    if (a == b) throw InputError(fmt::format("path step {} contracts id {} with itself", s, a));
    used[static_cast<size_t>(a)] = used[static_cast<size_t>(b)] = 1;
    node.push_back(t.join(node[static_cast<size_t>(a)], node[static_cast<size_t>(b)]));
  }
  for (Mode m : path.sliced) {
    const int k = net.number_of(m);
    if (k < 0) throw InputError(fmt::format("sliced mode {} is not a mode of the network", m));
    t.set_sliced(k, true);
  }
  return t;
}

std::vector<int> ContractionTree::post_order() const {
  std::vector<int> order;
  if (root_ < 0) return order;
  std::vector<std::pair<int, bool>> stack{{root_, false}};
  while (!stack.empty()) {
    auto [v, expanded] = stack.back();
    stack.pop_back();
    if (expanded || is_leaf(v)) {
      order.push_back(v);
      continue;
    }
    stack.push_back({v, true});
    stack.push_back({right(v), false});
    stack.push_back({left(v), false});
  }
  return order;
}

std::vector<int> ContractionTree::leaves_below(int v) const {
  std::vector<int> out, stack{v};
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (is_leaf(x)) {
      out.push_back(x);
    } else {
      stack.push_back(right(x));
      stack.push_back(left(x));
    }
  }
  return out;
}

Path ContractionTree::to_path() const {
  Path p;
  const int N = leaves();
  std::vector<int> ssa(static_cast<size_t>(node_capacity()), -1);
  for (int i = 0; i < N; ++i) ssa[static_cast<size_t>(i)] = i;
  int next = N;
  for (int v : post_order()) {
    if (is_leaf(v)) continue;
    p.ssa.push_back({ssa[static_cast<size_t>(left(v))], ssa[static_cast<size_t>(right(v))]});
    ssa[static_cast<size_t>(v)] = next++;
  }
  for (int k : sliced_modes()) p.sliced.push_back(net_->labels[static_cast<size_t>(k)]);
  return p;
}

std::vector<int> ContractionTree::sliced_modes() const {
  std::vector<int> out;
  for (size_t k = 0; k < sliced_.size(); ++k)
    if (sliced_[k]) out.push_back(static_cast<int>(k));
  return out;
}

double ContractionTree::log2_slices() const {
  double s = 0;
  for (size_t k = 0; k < sliced_.size(); ++k)
    if (sliced_[k]) s += net_->log2_extent[k];
  return s;
}

double ContractionTree::log2_size_of(const Legs& legs) const {
  double s = 0;
  for (int k : legs)
    if (!sliced_[static_cast<size_t>(k)]) s += net_->log2_extent[static_cast<size_t>(k)];
  return s;
}

double ContractionTree::log2_size(int v) const { return log2_size_of(legs(v)); }

double ContractionTree::log2_cost(int v) const {
  if (is_leaf(v)) return -std::numeric_limits<double>::infinity();
  // |l ∪ r| = |l| + |r| - |l ∩ r|, over unsliced modes.
  const Legs& a = legs(left(v));
  const Legs& b = legs(right(v));
  double s = log2_size_of(a) + log2_size_of(b);
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      if (!sliced_[static_cast<size_t>(a[i])]) s -= net_->log2_extent[static_cast<size_t>(a[i])];
      ++i;
      ++j;
    }
  }
  return s;
}

std::vector<char> ContractionTree::slice_invariant() const {
  std::vector<char> inv(static_cast<size_t>(node_capacity()), 1);
  for (int v : post_order()) {
    if (is_leaf(v)) {
      for (int k : legs(v))
        if (sliced_[static_cast<size_t>(k)]) inv[static_cast<size_t>(v)] = 0;
    } else {
      inv[static_cast<size_t>(v)] = inv[static_cast<size_t>(left(v))] && inv[static_cast<size_t>(right(v))];
    }
  }
  return inv;
}

TreeCost ContractionTree::cost() const {
  TreeCost c;
  c.slices = std::exp2(log2_slices());
  const auto inv = slice_invariant();
  for (int v : post_order()) {
    c.largest = std::max(c.largest, std::exp2(log2_size(v)));
    if (is_leaf(v)) continue;
    c.largest_intermediate = std::max(c.largest_intermediate, std::exp2(log2_size(v)));
    const double x = std::exp2(log2_cost(v));
    c.multiply_adds += x;
    if (inv[static_cast<size_t>(v)]) c.invariant_multiply_adds += x;
  }
  return c;
}

void ContractionTree::replace_subtree(int top, const std::vector<int>& frontier,
                                      const std::vector<std::pair<int, int>>& joins) {
  const size_t F = frontier.size();
  if (F < 2 || joins.size() != F - 1) throw std::logic_error("tree: replace_subtree needs F-1 joins over F >= 2 nodes");
  // The nodes strictly between top and the frontier are freed and reused.
  std::vector<char> is_frontier(static_cast<size_t>(node_capacity()), 0);
  for (int f : frontier) is_frontier[static_cast<size_t>(f)] = 1;
  std::vector<int> inner, stack{left(top), right(top)};
  while (!stack.empty()) {
    const int x = stack.back();
    stack.pop_back();
    if (is_frontier[static_cast<size_t>(x)]) continue;
    if (is_leaf(x)) throw std::logic_error("tree: replace_subtree's frontier does not cover the subtree");
    inner.push_back(x);
    stack.push_back(left(x));
    stack.push_back(right(x));
  }
  if (inner.size() != F - 2) throw std::logic_error("tree: replace_subtree's frontier does not match the subtree");
  std::sort(inner.begin(), inner.end(), std::greater<>());  // reuse in ascending id order (pop_back)
  const int top_parent = parent(top);
  std::vector<int> at(frontier);
  for (size_t j = 0; j < joins.size(); ++j) {
    const int a = at[static_cast<size_t>(joins[j].first)], b = at[static_cast<size_t>(joins[j].second)];
    int v;
    if (j + 1 == joins.size()) {
      v = top;
    } else {
      v = inner.back();
      inner.pop_back();
    }
    left_[static_cast<size_t>(v)] = a;
    right_[static_cast<size_t>(v)] = b;
    parent_[static_cast<size_t>(a)] = v;
    parent_[static_cast<size_t>(b)] = v;
    if (v != top) set_legs(v);
    at.push_back(v);
  }
  parent_[static_cast<size_t>(top)] = top_parent;
}

void ContractionTree::check() const {
  if (root_ < 0) throw std::logic_error("tree: not complete");
  std::vector<int> seen(static_cast<size_t>(node_capacity()), 0);
  int reached_leaves = 0;
  for (int v : post_order()) {
    if (seen[static_cast<size_t>(v)]++) throw std::logic_error(fmt::format("tree: node {} reached twice", v));
    if (is_leaf(v)) {
      ++reached_leaves;
      if (legs(v) != net_->inputs[static_cast<size_t>(v)]) throw std::logic_error(fmt::format("tree: leaf {} legs", v));
      continue;
    }
    if (parent(left(v)) != v || parent(right(v)) != v)
      throw std::logic_error(fmt::format("tree: node {}'s children do not point back", v));
    Legs legs_now;
    Holdings holdings_now;
    join_legs(*net_, legs(left(v)), holdings(left(v)), legs(right(v)), holdings(right(v)), legs_now, holdings_now);
    if (legs(v) != legs_now || holdings(v) != holdings_now)
      throw std::logic_error(fmt::format("tree: node {}'s legs are stale", v));
  }
  if (reached_leaves != leaves()) throw std::logic_error("tree: not every leaf is below the root");
  if (parent(root_) != -1) throw std::logic_error("tree: the root has a parent");
  Legs out;
  for (size_t k = 0; k < net_->output.size(); ++k)
    if (net_->output[k]) out.push_back(static_cast<int>(k));
  if (legs(root_) != out) throw std::logic_error("tree: the root's legs are not the output modes");
}

}  // namespace qstage::tn
