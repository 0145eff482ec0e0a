#pragma once
// Simplifying a network before the path search, with rules that keep its value exactly (quimb's
// diagonal, column, rank and split simplifications; Gray and Kourtis, Quantum 5, 410 (2021), sec. 4):
//
//   diagonal  a tensor that is zero wherever two of its legs (of one extent) differ is replaced
//             by its diagonal, and the two modes become one everywhere: a copy tensor's legs fuse
//             into one hyperindex, a diagonal gate (CZ) joins its wires;
//   column    a tensor that is zero on a closed leg except at one index v fixes that mode to v in
//             every tensor holding it (an initial |0> fixes the first gate's input);
//   rank      a tensor is contracted into the neighbour that gives the smallest result, when that
//             result is no larger than the larger of the two (vectors and matrices vanish into
//             their neighbours); scalars are multiplied into a tensor;
//   split     a tensor is split in two through an SVD across the bipartition of its legs that
//             makes the two smallest, when they hold fewer values than it (singular values below
//             1e-13 of the largest dropped: exact to the rounding of a double contraction).
//
// The rules run in turn until none applies. Projection tensors (the <x| of amplitude networks,
// whose data follows the bitstring) are never changed, moved or used to fix a mode; only their
// mode labels may be renamed. Output modes keep their labels and are never fixed. Tropical
// networks simplify in their semiring (zero: count 0), without the split rule. Every rule makes
// the sum of the tensors' sizes smaller, so the loop ends.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/tn/network.hpp"

namespace qstage::tn {

struct SimplifyOptions {
  bool diagonal = true;
  bool column = true;
  bool rank = true;
  bool split = true;
  // "true", "false", or a list of rule names; InputError naming `what` otherwise.
  static SimplifyOptions from_json(const nlohmann::json& j, const std::string& what);
  bool any() const { return diagonal || column || rank || split; }
};

struct SimplifyReport {
  std::size_t tensors_before = 0, tensors_after = 0;
  std::size_t modes_before = 0, modes_after = 0;
  std::size_t hyperindices = 0;  // modes held by three tensors or more, afterwards
  int fused = 0;                 // diagonal: pairs of modes made one
  int fixed = 0;                 // column: modes fixed to one index
  int absorbed = 0;              // rank: tensors contracted into a neighbour (scalars included)
  int split = 0;                 // split: tensors split in two
  double seconds = 0;
  nlohmann::json to_json() const;
};

// Simplifies n in place (tensors keep their relative order; removed ones leave no gap).
SimplifyReport simplify(Network& n, const SimplifyOptions& o);

}  // namespace qstage::tn
