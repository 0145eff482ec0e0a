#include "engine/tree_fold.hpp"

#include <cstring>
#include <stdexcept>

namespace qstage::engine {

namespace {

std::unique_ptr<Reduction> fold_node(const Reduction& kind, std::uint32_t level, std::uint64_t first,
                                     std::uint64_t batch_first, const std::byte* partials, std::size_t partial_bytes) {
  if (level == 0) {
    auto leaf = kind.empty();
    leaf->fold(first, partials + (first - batch_first) * partial_bytes);
    return leaf;
  }
  auto left = fold_node(kind, level - 1, first, batch_first, partials, partial_bytes);
  const auto right = fold_node(kind, level - 1, first + (std::uint64_t{1} << (level - 1)), batch_first, partials, partial_bytes);
  left->merge(*right);
  return left;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T get(const std::string& in, std::size_t& off) {
  if (off + sizeof(T) > in.size()) throw std::runtime_error("a reduction's saved tree is truncated");
  T v;
  std::memcpy(&v, in.data() + off, sizeof v);
  off += sizeof v;
  return v;
}

}  // namespace

std::vector<FoldNode> batch_nodes(const Reduction& kind, std::uint64_t first, std::uint64_t count,
                                  const std::byte* partials, std::size_t partial_bytes) {
  std::vector<FoldNode> nodes;
  const std::uint64_t end = first + count;
  for (std::uint64_t at = first; at < end;) {
    std::uint32_t level = 0;  // the largest aligned node at `at` that ends inside the batch
    while (level < 63 && at % (std::uint64_t{2} << level) == 0 && at + (std::uint64_t{2} << level) <= end) ++level;
    nodes.push_back({level, at >> level, fold_node(kind, level, at, first, partials, partial_bytes)});
    at += std::uint64_t{1} << level;
  }
  return nodes;
}

void append_nodes(std::string& out, const std::vector<FoldNode>& nodes) {
  for (const auto& n : nodes) {
    const std::string state = n.value->save();
    put<std::uint64_t>(out, n.level);
    put<std::uint64_t>(out, n.index);
    put<std::uint64_t>(out, state.size());
    out += state;
  }
}

std::vector<FoldNode> read_nodes(const Reduction& kind, const std::string& in, std::size_t off) {
  std::vector<FoldNode> nodes;
  while (off < in.size()) {
    FoldNode n;
    n.level = static_cast<std::uint32_t>(get<std::uint64_t>(in, off));
    n.index = get<std::uint64_t>(in, off);
    const auto size = get<std::uint64_t>(in, off);
    if (off + size > in.size()) throw std::runtime_error("a reduction's saved tree is truncated");
    n.value = kind.empty();
    n.value->load(in.substr(off, size));
    off += size;
    nodes.push_back(std::move(n));
  }
  return nodes;
}

void FoldStack::push(FoldNode node) {
  // A right child meets its left sibling on top: they become their parent (and so on up).
  while (!stack_.empty() && stack_.back().level == node.level && node.index % 2 == 1 &&
         stack_.back().index == node.index - 1) {
    FoldNode left = std::move(stack_.back());
    stack_.pop_back();
    left.value->merge(*node.value);
    node = {left.level + 1, left.index / 2, std::move(left.value)};
  }
  stack_.push_back(std::move(node));
}

std::string FoldStack::save() const {
  std::string out;
  append_nodes(out, stack_);
  return out;
}

void FoldStack::load(const std::string& state) {
  stack_.clear();
  for (auto& n : read_nodes(kind_, state, 0)) stack_.push_back(std::move(n));
}

// What is left are whole nodes of falling size; each lower one is the left part of a node whose
// right part (the rest of the pass) is everything above it.
std::unique_ptr<Reduction> FoldStack::take_result() {
  if (stack_.empty()) return kind_.empty();
  std::unique_ptr<Reduction> acc = std::move(stack_.back().value);
  for (std::size_t i = stack_.size() - 1; i-- > 0;) {
    std::unique_ptr<Reduction> left = std::move(stack_[i].value);
    left->merge(*acc);
    acc = std::move(left);
  }
  stack_.clear();
  return acc;
}

std::unique_ptr<Reduction> FoldStack::result() const {
  FoldStack copy(kind_);
  copy.load(save());
  return copy.take_result();
}

}  // namespace qstage::engine
