#pragma once
// Contraction paths: the order of pairwise contractions, as an SSA list (inputs are 0..N-1 and
// step s makes id N+s), plus the modes to slice.
//
// Costs follow seed 000 section II-B. For a step A x B -> C over the modes of A and B:
//   C_t (time)   = sum over steps of the product of the extents of all modes of A and B
//                  (multiply-adds; real flops are 8x that for complex data, 2x for real),
//   C_s (space)  = the largest tensor anywhere along the path, inputs included (elements),
//   C_m (memory) = sum over steps of |A| + |B| + |C| (elements read and written).
// Sliced modes are fixed per slice: the costs are per slice, and `slices` says how many.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "stages/tn/network.hpp"

namespace qstage::tn {

struct Path {
  std::vector<std::pair<int, int>> ssa;  // step s contracts ids (first, second) into id N + s
  std::vector<Mode> sliced;              // modes fixed per slice
};

struct PathCost {
  double multiply_adds = 0;  // C_t per slice
  double largest = 0;        // C_s (elements)
  double moved = 0;          // C_m per slice (elements)
  double slices = 1;
  double total_flops(bool complex) const { return (complex ? 8.0 : 2.0) * multiply_adds * slices; }
  nlohmann::json to_json(bool complex) const;
};

// The modes of every intermediate: result[s] are the modes of id N + s (in the order the modes
// first appear in its operands, A's first). Throws InputError if the path does not fit the
// network (ids out of range or used twice, or not a full contraction).
std::vector<std::vector<Mode>> intermediate_modes(const Network& n, const Path& p);

PathCost path_cost(const Network& n, const Path& p);
// The same, given the path's intermediate_modes (a caller that has them).
PathCost path_cost(const Network& n, const Path& p, const std::vector<std::vector<Mode>>& inter);

// Imports. opt_einsum's linear path: each step lists positions in the current operand list;
// those operands are removed and the result appended (steps of more than two operands are
// split into pairs, left to right). SSA: inputs 0..N-1, each result the next number.
// cotengra: {"path": [...] (linear), "sliced": [labels]} with the network's labels.
Path path_from_linear(const nlohmann::json& steps, std::size_t inputs, const std::string& what);
Path path_from_ssa(const nlohmann::json& steps, std::size_t inputs, const std::string& what);

}  // namespace qstage::tn
