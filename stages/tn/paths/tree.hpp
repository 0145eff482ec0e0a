#pragma once
// Contraction trees: what the path search builds, scores, reconfigures and slices.
//
// The search works on a compact view of a network (SearchNetwork): modes renumbered 0..M-1 with
// their log2 extents, each tensor's modes as a sorted list of those numbers. A mode held by two
// tensors (a bond) is contracted where they meet, so the modes ("legs") of the tensor a subtree
// contracts to are the bonds its leaves hold once, plus the output modes among them: legs(parent)
// = (legs(l) XOR legs(r)) + output modes of either. A hyperindex (a mode held by three tensors or
// more: a copy tensor's legs fused into one mode) stays a leg until the last of its holders joins,
// so every node also counts, per hyperindex among its legs, the leaves below it that hold it.
//
// A ContractionTree is a binary tree over the N input tensors (leaves 0..N-1). Internal nodes get
// ids from N on, but ids carry no order: reconfiguration replaces subtrees in place. to_path()
// numbers the steps in a post-order walk (left child first), which is deterministic for a given
// tree shape.
//
// Costs follow path.hpp (seed 000 II-B): a step's cost is the product of the extents of all modes
// of its two operands (multiply-adds), a tensor's size the product of its modes' extents. Sliced
// modes count with extent 1; the number of slices is the product of their extents. A node is
// slice-invariant when none of its leaves holds a sliced mode: its tensor is the same in every
// slice, so executing the sliced tree needs it once, not once per slice.
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"

namespace qstage::tn {

using Legs = std::vector<int>;  // sorted mode numbers

// Per node: (hyperindex, how many leaves below the node hold it) for the hyperindices among its
// legs, sorted by mode number; empty in networks without hyperindices.
using Holdings = std::vector<std::pair<int, int>>;

struct SearchNetwork {
  int tensors = 0;
  std::vector<Mode> labels;           // mode number -> the Network's mode
  std::vector<double> log2_extent;    // per mode number
  std::vector<Legs> inputs;           // per tensor
  std::vector<char> output;           // per mode number: 1 if an output mode
  std::vector<int> appearances;       // per mode number: the tensors holding it
  std::vector<int> holder_start;      // per mode number k: holder_list[holder_start[k] .. holder_start[k + 1])
  std::vector<int> holder_list;       //   are the tensors holding it, ascending
  bool has_hyperindices = false;

  static SearchNetwork from(const Network& n);
  int modes() const { return static_cast<int>(labels.size()); }
  int number_of(Mode m) const;        // -1 if not a mode of the network
  bool hyper(int k) const { return appearances[static_cast<size_t>(k)] > 2; }
  std::span<const int> holders(int k) const {
    return {holder_list.data() + holder_start[static_cast<size_t>(k)],
            static_cast<size_t>(holder_start[static_cast<size_t>(k) + 1] - holder_start[static_cast<size_t>(k)])};
  }
};

// The legs of the tensor a . b makes, and their hyperindex holdings (see above).
void join_legs(const SearchNetwork& net, const Legs& a, const Holdings& ha, const Legs& b, const Holdings& hb, Legs& out,
               Holdings& out_holdings);
// The modes of a and b together (sorted union): what the step a . b loops over.
Legs union_legs(const Legs& a, const Legs& b);

// The holders of each mode among a changing set of parentless nodes, numbered as the caller
// numbers them (tree ids or local numbers), for the searches: at most two per bond, any number per
// hyperindex. prepare() clears only what the last use touched, so a thread can reuse one across
// many small groups of a large network.
class ModeHolders {
 public:
  void prepare(const SearchNetwork& net);
  void add(int mode, int holder);
  // a and b were joined into c, which keeps `mode` as a leg.
  void replace(int mode, int a, int b, int c);
  template <class F>
  void for_each(int mode, F&& f) const {
    if (net_->hyper(mode)) {
      for (int h : many_[static_cast<size_t>(mode)]) f(h);
    } else {
      for (int h : two_[static_cast<size_t>(mode)])
        if (h >= 0) f(h);
    }
  }

 private:
  const SearchNetwork* net_ = nullptr;
  std::vector<std::array<int, 2>> two_;
  std::vector<std::vector<int>> many_;
  std::vector<int> touched_;
};

// Totals of a tree (per slice unless said otherwise).
struct TreeCost {
  double multiply_adds = 0;      // C_t per slice: sum of all steps
  double largest = 0;            // C_s: the largest tensor, inputs included (elements)
  double largest_intermediate = 0;  // the largest tensor a step makes (elements)
  double slices = 1;
  double invariant_multiply_adds = 0;  // the part of C_t in slice-invariant steps
  // Multiply-adds of the whole sliced contraction: every slice runs every step.
  double total() const { return multiply_adds * slices; }
  // ... and when slice-invariant steps run once.
  double total_with_reuse() const { return invariant_multiply_adds + (multiply_adds - invariant_multiply_adds) * slices; }
  double log10_total() const;
  double log2_largest() const;
  double log2_largest_intermediate() const;
};

class ContractionTree {
 public:
  ContractionTree() = default;
  explicit ContractionTree(const SearchNetwork& net);  // the N leaves, not joined yet
  // The tree of an SSA path (and its sliced modes). Throws InputError if the path does not fit.
  static ContractionTree from_path(const SearchNetwork& net, const Path& path);
  // SSA steps in post-order (left child first) and the sliced modes as Network modes.
  Path to_path() const;

  const SearchNetwork& network() const { return *net_; }
  int leaves() const { return net_->tensors; }
  int root() const { return root_; }
  bool complete() const { return root_ >= 0; }
  bool is_leaf(int v) const { return v < leaves(); }
  int left(int v) const { return left_[static_cast<size_t>(v)]; }
  int right(int v) const { return right_[static_cast<size_t>(v)]; }
  int parent(int v) const { return parent_[static_cast<size_t>(v)]; }
  const Legs& legs(int v) const { return legs_[static_cast<size_t>(v)]; }
  const Holdings& holdings(int v) const { return holdings_[static_cast<size_t>(v)]; }
  // How many leaves below v hold the hyperindex k, a leg of v.
  int holdings(int v, int k) const;
  // log2 of what a join of a and b saves in size through a mode both hold: its extent twice if the
  // join contracts it, once if it stays (an output mode, or a hyperindex with holders elsewhere).
  double log2_saved(int k, int a, int b) const;
  int node_capacity() const { return static_cast<int>(left_.size()); }

  // Joins two parentless nodes into a new one and returns its id; once one node is left without
  // a parent it is the root. Building a tree is N-1 joins.
  int join(int a, int b);

  // Sliced modes (by mode number). Slicing does not change the tree's shape.
  bool sliced(int mode) const { return sliced_[static_cast<size_t>(mode)] != 0; }
  void set_sliced(int mode, bool on) { sliced_[static_cast<size_t>(mode)] = on ? 1 : 0; }
  std::vector<int> sliced_modes() const;
  double log2_slices() const;

  // Per node, with the sliced modes at extent 1: log2 of its tensor's size, and log2 of the
  // multiply-adds of the step that makes it (-infinity for leaves).
  double log2_size(int v) const;
  double log2_cost(int v) const;
  double log2_size_of(const Legs& legs) const;  // any leg set, sliced modes at extent 1

  TreeCost cost() const;
  // Whether no leaf below v holds a sliced mode (per node; index by id).
  std::vector<char> slice_invariant() const;

  // Nodes in post-order from the root (children before parents, left first).
  std::vector<int> post_order() const;
  // The leaves below v.
  std::vector<int> leaves_below(int v) const;

  // Replaces what lies between `top` and the nodes `frontier` (all below top, none below another,
  // together covering top's leaves) by a new shape: `joins` lists pairs over positions, where
  // 0..F-1 are the frontier nodes in the given order and F + j is the result of joins[j]; the
  // last join makes top's tensor again. top keeps its id and legs; the nodes in between are
  // reused for the new joins. Checks nothing beyond sizes: the caller guarantees a valid shape.
  void replace_subtree(int top, const std::vector<int>& frontier, const std::vector<std::pair<int, int>>& joins);

  // Checks the invariants (every node's legs and links, one root, every leaf reached once);
  // throws std::logic_error naming what is wrong. For tests.
  void check() const;

 private:
  const SearchNetwork* net_ = nullptr;
  std::vector<int> left_, right_, parent_;
  std::vector<Legs> legs_;
  std::vector<Holdings> holdings_;
  std::vector<char> sliced_;
  std::vector<int> free_;  // internal ids not in use (after replace_subtree)
  int parentless_ = 0;
  int root_ = -1;
  int new_node(int a, int b);
  void set_legs(int v);  // from v's children
};

}  // namespace qstage::tn
