#pragma once
// An executable contraction schedule (seed 000, section IV-A).
//
// Mode reordering: one backward pass from the root, whose order is the network's output order.
// Each step rewrites its operands as [retained modes in the output's order | reduced modes], and
// gives that layout to the producer of the operand. Every intermediate has exactly one consumer,
// so no two layouts ever conflict. Every step is then a GEMM - or a batch of GEMMs over C's
// leading modes - reading its operands where they lie. Input tensors are permuted once, when
// they are loaded (sliced modes outermost, so a slice is a contiguous block), and read where they
// are resident: the arena holds only intermediates and workspace.
//
// GEMM mapping of a step with layouts A = [ret_A | K], B = [ret_B | K] and C: the trailing run of
// C's modes that come from one operand (R) and the run before it from the other (L) form the
// GEMM block C[L-run, R-run] = L[L-run, K] . R[R-run, K]^T. C's modes before the block are
// loops: a batch of GEMMs. Neighbouring loop modes whose strides line up in L, R and C merge;
// the innermost group is one strided-batched GEMM, a host loop runs over the others.
//
// Where C's layout interleaves modes of both operands, that would be many small GEMMs. Such a
// step is *packed*, as torch's einsum does it: batch = C's modes in both operands, M = C's modes
// only in L, N = those only in R; L is gathered into [batch | M | K], R into [batch | N | K] (each
// only where its layout differs), one strided-batched GEMM writes [batch | M | N], which is then
// permuted into C's layout (if it differs). The copies are workspace the memory plan counts, and
// the plan reports every one (step_transposes, transposed_bytes). Batches of skinny products
// (k and min(m, n) at most 16: a circuit's gates) and products still tiny after packing run in
// one looped kernel over the scattered offsets instead (no workspace): cuBLAS is slow at those.
//
// Memory: every intermediate gets an offset in one device arena (first fit, by lifetime); the
// arena's size is the plan's exact peak. Slicing fixes closed modes until the arena fits the
// budget. Predicted time per step is seed 000's eq. 6: max(bytes / bandwidth, flops / rate).
//
// Out of core (PlanOptions::out_of_core): before slicing, the largest intermediates move to a
// pinned host arena until the device arena fits. A step touching one runs in blocks over the
// leading modes of its result: those are the leading modes of both operands too (the backward
// pass puts C's modes first), so every block of every tensor is one contiguous range. Host
// operands' blocks are copied into staging in the device arena, the step runs on the block as a
// smaller step, and a host result's block is copied back; copies run on their own streams, so
// block i+1 comes in and block i-1 goes out while block i computes (two staging slots each). Slicing then only adds what the host
// budget cannot hold, or with `scratch`, the spilled intermediates live in an HDF5 scratch file
// instead of pinned memory (blocks then pass through pinned bounce buffers, synchronously; the
// contractor keeps the host arena in a spill store, engine/spill_store.hpp).
// The prediction adds host copies over the PCIe rate.
//
// Reuse across slices (PlanOptions::reuse_invariant): a step none of whose input tensors below
// it in the tree holds a sliced mode computes the same result in every slice. Such *invariant*
// steps form the prologue, which runs once per bitstring (projections depend on it), before the
// slices; only the other (*variant*) steps run per slice. An invariant result that a variant
// step reads is *persistent*: it lives in a region of its own (persistent_bytes, offsets into
// it) that stays resident across slices. The prologue's other tensors live in the per-slot
// arena, laid out on their own (prologue_arena_bytes): the prologue is done with the arena
// before the slices use it. Steps touching the host arena count as variant (they are
// recomputed per slice), and so does every step above one. The slicing is chosen as without
// reuse; where the persistent region does not fit beside the arena, its largest results are
// recomputed per slice too. Each step still computes exactly what it computed before, so
// results are bitwise the same; only repeats are left out.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"

namespace qstage::tn {

// How a step's products run (see above): in place (one GEMM, or strided batches of GEMMs in a host
// loop, reading the operands where they lie), packed (operands copied into [batch | M | K] and
// [batch | N | K] workspace, one strided-batched GEMM), or looped (one kernel walks the products
// at their scattered offsets: tiny or skinny products, where cuBLAS is slow). One choice per
// step; the plan file keeps its two bools "packed" and "looped".
enum class Execution { in_place, packed, looped };

struct PlanStep {
  int a = 0, b = 0, c = 0;                 // operand and result ids
  std::vector<Mode> a_modes, b_modes, c_modes;  // layouts (row-major orders)
  bool left_is_b = false;                  // the GEMM's left operand is B (C's block is [B-run | A-run])
  std::vector<Mode> loop_modes;            // C's leading modes outside the GEMM block
  std::int64_t m = 1, n = 1, k = 1, loops = 1;
  std::uint64_t a_offset = 0, b_offset = 0, c_offset = 0;  // in the arena (bytes); inputs: their staging offset
  std::uint64_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
  double flops = 0;                        // real flops (8 per complex multiply-add)
  double predicted_seconds = 0;
  std::uint64_t live_bytes = 0;            // arena bytes in use during this step
  Execution execution = Execution::in_place;
  // Packed: [batch | M | N] = [batch | M | K] . [batch | N | K]^T; which of the three are copied
  // (to or from workspace: one already in that layout is read where it lies).
  bool pack_l = false, pack_r = false, pack_c = false;
  std::uint64_t pack_l_offset = 0, pack_r_offset = 0, pack_c_offset = 0;  // the workspace (arena bytes)
  std::uint64_t transposed_bytes = 0;      // bytes the packing copies
  // Out of core: which of A, B, C live in the host arena (their offsets are host-arena offsets).
  // The step then runs in `blocks` blocks over C's first `block_modes` modes, and the mapping
  // above (loop_modes, m, n, k, loops, execution, packing) describes one block: the step with
  // those modes removed from its layouts (block_view). Host tensors' blocks are staged in the
  // device arena at stage_offsets.
  bool a_host = false, b_host = false, c_host = false;
  int block_modes = 0;
  std::int64_t blocks = 1;
  std::vector<Mode> block_order;           // C's block modes in the order blocks are walked, outermost first
  std::uint64_t stage_a_offset = 0, stage_b_offset = 0, stage_c_offset = 0;
  std::uint64_t host_bytes = 0;            // bytes copied between host and device
  bool spilled() const { return a_host || b_host || c_host; }
  // Reuse: an invariant step runs once per bitstring, in the prologue. Which of A, B, C live in
  // the persistent region (their offsets are persistent-region offsets): an invariant step's
  // result that a variant step reads.
  bool invariant = false;
  bool a_persistent = false, b_persistent = false, c_persistent = false;
};

// The step as one of its blocks runs it: C's first block_modes modes removed from the layouts.
PlanStep block_view(const PlanStep& st);

// A step's roofline (seed 000's eq. 6): the device bytes it moves (its operands, its result and
// a packed step's transposes, read and written) at `bandwidth`, or its flops at `gemm_rate`,
// whichever takes longer. The plan's prediction is this plus host copies and block launches;
// tn.contract's step profile sets each measured step beside it.
std::uint64_t moved_bytes(const PlanStep& st);
double roofline_seconds(const PlanStep& st, double bandwidth, double gemm_rate);

// The step with the modes `fixed` removed from its layouts (each value of them computed apart,
// as a rank of a distributed contraction computes its shard), its GEMM mapping and execution
// decided anew, in core, and a packed step's workspace placed from offset 0: `workspace_bytes`
// gets its size. (The modes removed from an operand are the operand's own; a mode absent from a
// layout is ignored.)
PlanStep local_step(const Network& net, const PlanStep& st, const std::vector<Mode>& fixed, std::uint64_t element_bytes,
                    std::uint64_t& workspace_bytes);

// The order a spilled step walks its blocks: C's block modes, outermost first. A host operand's
// block is copied in again only when one of its own block modes changes, so the modes both host
// operands carry go outermost, then those of one operand, then those of the other (whichever
// order copies fewer bytes), then those of neither. Every block is still a contiguous range of
// each tensor; only the order of the blocks changes.
struct BlockWalk {
  std::vector<Mode> order;
  std::int64_t a_fetches = 1, b_fetches = 1;  // blocks of A and of B copied in (host operands)
};
BlockWalk block_walk(const Network& net, const PlanStep& st);

// Staging of a host tensor's blocks: two slots (block i+1 is copied while block i computes), or
// one when the tensor has a single block. Slots lie `staging_stride(block bytes)` apart.
inline int staging_slots(bool has_block_modes, std::int64_t blocks) { return has_block_modes && blocks > 1 ? 2 : 1; }
inline std::uint64_t staging_stride(std::uint64_t block_bytes) { return (block_bytes + 255) / 256 * 256; }

// Whether the contractor runs the step in a chain (kernels::LoopedChain): a small looped product
// on device tensors. tn.plan orders such steps in waves and frees a stage's operands when the
// stage ends (make_plan).
bool runs_chained(const Network& net, const PlanStep& st);

// A group of neighbouring loop modes with one stride each in L, R and C (elements).
struct LoopGroup {
  std::int64_t extent, l, r, c;
};
// A step's loop modes merged into groups, innermost first.
std::vector<LoopGroup> loop_groups(const Network& net, const PlanStep& st);
std::int64_t stride_in(const Network& net, const std::vector<Mode>& layout, Mode m);  // 0 if absent

// The layouts a packed step's GEMM uses: L as [batch | M | K], R as [batch | N | K], C as [batch | M | N].
struct PackedLayouts {
  std::vector<Mode> l, r, c;
  std::vector<Mode> batch, m, n;  // C's modes in both operands, only in L, only in R (C's order)
};
PackedLayouts packed_layouts(const PlanStep& st);

struct Plan {
  std::vector<std::vector<Mode>> input_layouts;  // the order each input tensor is loaded in
  int input_transposes = 0;                      // inputs whose planned order differs from the stored one
  int packed_steps = 0;                          // steps that run through workspace ([batch | M | N] GEMMs)
  int step_transposes = 0;                       // copies those steps make (operands in, results out)
  std::uint64_t transposed_bytes = 0;            // bytes they copy (every step once)
  std::vector<PlanStep> steps;
  std::vector<Mode> sliced;
  std::int64_t slices = 1;
  std::vector<Mode> output;                      // the result's modes (the network's output order)
  std::uint64_t element_bytes = 8;               // complex64: 8, complex128: 16
  std::uint64_t arena_bytes = 0;                 // device memory of one contraction (per slot): the larger of
                                                 // the slices' arena and the prologue's
  std::uint64_t prologue_arena_bytes = 0;        // what of it the prologue uses (0 without invariant steps)
  std::uint64_t persistent_bytes = 0;            // the invariant results the slices read (resident, once)
  int invariant_steps = 0;                       // steps of the prologue (once per bitstring)
  double invariant_flops = 0;                    // their flops, once per bitstring
  double slice_flops = 0;                        // the other steps' flops, per slice
  std::uint64_t input_bytes = 0;                 // all input tensors (resident)
  std::uint64_t host_arena_bytes = 0;            // pinned host memory of the spilled intermediates (per slice)
  bool scratch = false;                          // the host arena is an HDF5 scratch file instead (beyond host_budget)
  int spilled = 0;                               // intermediates in the host arena
  std::uint64_t host_copy_bytes = 0;             // host <-> device copies per slice
  // The prediction (eq. 6 per step; its JSON apart from the schedule's: prediction_json).
  double bandwidth = 0, gemm_rate = 0;           // what the prediction used (bytes/s, flop/s)
  double pcie_bandwidth = 0;                     // for host copies (bytes/s)
  double predicted_seconds = 0;                  // per slice (the variant steps)
  double predicted_prologue_seconds = 0;         // once per bitstring (the invariant steps)
  double slicing_overhead = 1;                   // total flops of all slices / the unsliced path's (slicing added here)
  bool path_reconfigured = false;                // slicing reshaped the path (steps differ from tn.path's)
  int fused_gates = 0;                           // passes over large tensors saved by gate fusion (paths/fusion.hpp)
  PathCost cost;                                 // of the path, every step run in every slice

  // Flops of one bitstring (or of the value): the prologue once and every slice's variant steps.
  double flops_per_bitstring() const { return invariant_flops + slice_flops * static_cast<double>(slices); }
  // What they would be with every step in every slice (reuse_invariant: false).
  double flops_per_bitstring_without_reuse() const {
    return (invariant_flops + slice_flops) * static_cast<double>(slices);
  }
  double predicted_seconds_per_bitstring() const {
    return predicted_prologue_seconds + predicted_seconds * static_cast<double>(slices);
  }

  // The path the plan runs (its steps' operands, which differ from tn.path's where slicing
  // reconfigured the tree) with its sliced modes.
  Path path() const;

  // The schedule (what tn.contract runs) and the prediction (the rates and the predicted seconds
  // of every step: PlanStep::predicted_seconds and the fields above) as two JSON documents, so
  // that rates measured on the device at hand stay out of the schedule (tn.plan writes them to
  // its datasets `plan` and `prediction`). Read without a prediction, a plan's rates and
  // predicted seconds are 0.
  nlohmann::json to_json() const;
  nlohmann::json prediction_json() const;
  static Plan from_json(const nlohmann::json& schedule, const nlohmann::json& prediction = nullptr);
};

struct PlanOptions {
  std::uint64_t element_bytes = 8;
  // For one contraction: its arena and its share of the persistent region, which `arenas`
  // arenas running at once (tn.contract's slots, each within its own budget_bytes) share.
  std::uint64_t budget_bytes = ~std::uint64_t{0};
  double bandwidth = 1e12, gemm_rate = 1e13;       // for eq. 6
  double max_slices = 0x1p24;                      // refuse plans that would need more (one batch per slice)
  bool out_of_core = false;                        // spill intermediates to host memory before slicing
  std::uint64_t host_budget_bytes = ~std::uint64_t{0};  // for the host arena of one slice
  bool scratch = false;                            // out of core: beyond host_budget, an HDF5 scratch file
  double pcie_bandwidth = 25e9;                    // host <-> device (bytes/s)
  bool reconfigure = true;                         // reshape the path between sliced modes
  int subtree_size = 8;                            // frontier size of that reconfiguration
  bool reuse_invariant = true;                     // sliced: run the invariant steps once per bitstring
  bool fuse_gates = true;                          // fold chains of gates on one large tensor into one pass each
  std::uint64_t arenas = 1;                        // arenas sharing one persistent region (see budget_bytes)
};

// Plans `path`. If the path with its own sliced modes (if any) does not fit the budgets (out of
// core: after spilling), it is sliced anew by cost (paths/slicing.hpp: the modes that minimize
// total flops under a cap on the largest tensor, reconfiguring the tree between them), the cap
// lowered until the arena fits. With fuse_gates, the chains of gates on one large tensor of the
// path that fits are then folded into one pass each (paths/fusion.hpp), where the plan of the
// fused path still fits. With reuse_invariant, the invariant steps of the sliced plan then
// run once per bitstring, as many as the persistent region leaves room for (the others are
// recomputed per slice), so reuse never needs more slices or flops than without. Throws
// InputError if even slicing every closed mode does not fit the budget.
Plan make_plan(const Network& n, const Path& path, const PlanOptions& options);

// tn.plan's output as JSON: the schedule (dataset "plan") and its prediction (null in a file that
// has none), read from its file or taken from what this process kept of it
// (stages/common/kept.hpp; tn.plan keeps what it writes).
struct PlanOutput {
  nlohmann::json plan, prediction;
};
std::shared_ptr<const PlanOutput> read_plan_output(const h5::File& file);
void keep_plan_output(const std::string& step_key, std::shared_ptr<const PlanOutput> output);

}  // namespace qstage::tn
