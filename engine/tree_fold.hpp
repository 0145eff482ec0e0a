#pragma once
// Reductions folded in a fixed tree, so a result is bitwise the same for any rank count, batch
// size or resume point, and no rank gathers every partial.
//
// The tree is over the pass's reduction units (tiles, or explicit batches): a node at level l
// and index i covers units [i 2^l, (i + 1) 2^l) and is merge(left child, right child); a node
// whose right child is past the last unit is its left child. Each rank folds its batch's units
// into the largest whole nodes inside the batch (BatchNodes: at most 2 log2 of its units) and
// sends only those; rank 0 pushes them in unit order onto a stack that merges siblings as they
// meet (FoldStack: at most log2 of the pass's units deep), and at the end merges what is left
// from the right. Float sums are pairwise, so they round differently from a left-to-right fold.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/pass.hpp"

namespace qstage::engine {

struct FoldNode {
  std::uint32_t level = 0;
  std::uint64_t index = 0;
  std::unique_ptr<Reduction> value;
};

// The nodes of units [first, first + count), whose partials are at `partials` (partial_bytes
// each, unit order): the largest whole nodes, left to right.
std::vector<FoldNode> batch_nodes(const Reduction& kind, std::uint64_t first, std::uint64_t count,
                                  const std::byte* partials, std::size_t partial_bytes);

// Nodes as bytes, to send to rank 0 or keep in a journal: (level, index, state size, state) each.
void append_nodes(std::string& out, const std::vector<FoldNode>& nodes);
// Reads nodes from `in` starting at `off` until its end.
std::vector<FoldNode> read_nodes(const Reduction& kind, const std::string& in, std::size_t off);

class FoldStack {
 public:
  explicit FoldStack(const Reduction& kind) : kind_(kind) {}
  // Nodes must come in unit order, each starting where the last ended.
  void push(FoldNode node);
  std::string save() const;
  void load(const std::string& state);
  // The whole tree's value (an empty fold if nothing was pushed).
  std::unique_ptr<Reduction> result() const;
  // The same, merging the nodes in place rather than copies of them: the fold is empty after.
  std::unique_ptr<Reduction> take_result();

 private:
  const Reduction& kind_;
  std::vector<FoldNode> stack_;
};

}  // namespace qstage::engine
