#pragma once
// Gate fusion: chains of small tensors applied one after another to one large tensor become one
// pass over it. A circuit's path applies its gates to a large intermediate one step at a time,
// T1 = T0 . g1, T2 = T1 . g2, ..., and each of those steps reads and writes the whole of it: they
// are memory-bound, and their time is the bytes they move. Rotating the tree to T2 = T0 . (g1 . g2)
// gives the same tensor through a small step (the fused gate) and one pass over the large tensor:
// the bytes of T1, written and read again, are saved, for a few more flops per value.
//
// A rotation is kept when (sizes with sliced modes at extent 1):
//  - both small operands, and their fusion, have at most 2^max_gate_log2 values (a gate-sized
//    tensor, which the pass reads from cache beside the large tensor's rows);
//  - the pass sums at most 2^max_sum_log2 values per result and adds at most 2^max_sum_log2
//    results per value read: each value read costs at most 2^(2 max_sum_log2) multiply-adds, 256 at
//    the defaults, so the step stays memory-bound (8 real flops per multiply-add on 16 bytes read and
//    written per complex64 value: 8 flops a byte at the defaults, below any GPU's ridge point) and
//    stays within what tn.contract's looped kernel runs at the copy rate (sums of 32 and more are
//    bound by instruction issue there);
//  - the large operand is at least 2^min_large_log2 values (small steps are launch-bound: nothing
//    to save) and larger than the fused gate;
//  - no step holds more than before: the pass holds T0 and T2 where the chain held T0 and T1,
//    then T1 and T2 (min(|T0|, |T2|) <= |T1|). (The arena's first-fit layout may still come out
//    a few percent larger; tn.plan keeps the fused path only where its plan fits the budgets.)
//  - the bytes moved fall: 2 |T1| saved against 2 |g1 . g2| added.
// Each kept rotation is applied at the same node again, so a chain of any length folds into one
// pass with a fused gate that grows until a bound stops it. Deterministic: the tree's post-order,
// no rates and no timing (a plan's schedule must not depend on rates measured at planning time).
#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

struct FuseOptions {
  double max_gate_log2 = 8;   // the fused gate: at most 2^this values (256: a 4-qubit gate)
  double max_sum_log2 = 4;    // the pass: sums of at most 16 values, at most 16 results per value read
  double min_large_log2 = 12; // the large operand: at least 4096 values
};

struct FuseReport {
  int fused = 0;                           // rotations kept: passes over a large tensor saved
  double moved_before = 0, moved_after = 0;  // sum over steps of |A| + |B| + |C| (elements, per slice)
  double multiply_adds_before = 0, multiply_adds_after = 0;  // per slice
};

// Fuses the gate chains of `tree` in place (see above). The tree's leaves, legs of every node
// that was there before and sliced modes are unchanged: only the order of the joins moves.
FuseReport fuse_gate_chains(ContractionTree& tree, const FuseOptions& o = {});

}  // namespace qstage::tn
