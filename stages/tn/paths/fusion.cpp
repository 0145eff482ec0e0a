#include "stages/tn/paths/fusion.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace qstage::tn {

namespace {

Legs intersection(const Legs& a, const Legs& b) {
  Legs out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

Legs difference(const Legs& a, const Legs& b) {
  Legs out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// Per slice: elements read and written, and multiply-adds, of every step.
void totals(const ContractionTree& t, double& moved, double& multiply_adds) {
  moved = multiply_adds = 0;
  for (int v : t.post_order()) {
    if (t.is_leaf(v)) continue;
    moved += std::exp2(t.log2_size(t.left(v))) + std::exp2(t.log2_size(t.right(v))) + std::exp2(t.log2_size(v));
    multiply_adds += std::exp2(t.log2_cost(v));
  }
}

bool small(const ContractionTree& t, int v, const FuseOptions& o) { return t.log2_size(v) <= o.max_gate_log2; }

// Rotates v = (y . h) . g into v = y . (h . g) if the rotation is kept (fusion.hpp), trying g as
// either child of v and h as either child of the other.
bool fuse_at(ContractionTree& t, int v, const FuseOptions& o) {
  if (t.is_leaf(v)) return false;
  const SearchNetwork& net = t.network();
  for (int side = 0; side < 2; ++side) {
    const int x = side ? t.left(v) : t.right(v), g = side ? t.right(v) : t.left(v);
    if (t.is_leaf(x) || !small(t, g, o)) continue;
    for (int inner = 0; inner < 2; ++inner) {
      const int y = inner ? t.right(x) : t.left(x), h = inner ? t.left(x) : t.right(x);
      if (!small(t, h, o)) continue;
      Legs fused;
      Holdings fused_holdings;
      join_legs(net, t.legs(h), t.holdings(h), t.legs(g), t.holdings(g), fused, fused_holdings);
      const double ly = t.log2_size(y), lx = t.log2_size(x), lv = t.log2_size(v), lf = t.log2_size_of(fused);
      if (lf > o.max_gate_log2 || ly < o.min_large_log2 || ly <= lf) continue;
      // The pass y . fused -> v: its sum (shared modes that v does not keep) and the results it
      // adds per value read (the fused gate's modes that y lacks).
      const Legs shared = intersection(t.legs(y), fused);
      const double sum = t.log2_size_of(shared) - t.log2_size_of(intersection(shared, t.legs(v)));
      const double added = t.log2_size_of(difference(fused, t.legs(y)));
      if (sum > o.max_sum_log2 || added > o.max_sum_log2) continue;
      if (std::min(ly, lv) > lx) continue;  // the pass would hold more than the chain's steps
      if (lx <= lf) continue;               // nothing saved
      t.replace_subtree(v, {y, h, g}, {{1, 2}, {0, 3}});
      return true;
    }
  }
  return false;
}

}  // namespace

FuseReport fuse_gate_chains(ContractionTree& tree, const FuseOptions& o) {
  FuseReport r;
  totals(tree, r.moved_before, r.multiply_adds_before);
  // A kept rotation leaves v's ancestors and the nodes after v in the post-order as they were, and
  // reuses the freed node (x) for the fused gate, which is below v: one walk sees every chain.
  for (int v : tree.post_order())
    while (fuse_at(tree, v, o)) ++r.fused;
  totals(tree, r.moved_after, r.multiply_adds_after);
  return r;
}

}  // namespace qstage::tn
