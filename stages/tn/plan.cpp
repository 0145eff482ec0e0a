#include "stages/tn/plan.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <list>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "core/units.hpp"
#include "kernels/linalg/looped_gemm.hpp"
#include "stages/common/kept.hpp"
#include "stages/tn/paths/fusion.hpp"
#include "stages/tn/paths/slicing.hpp"
#include "stages/tn/paths/tree.hpp"

namespace qstage::tn {

using nlohmann::json;

namespace {
// 2: packed steps copy C too; 3: out of core; 4: scratch; 5: block order; 6: invariant steps, persistent
// region, slicing by cost; 7: inputs read where they are resident (no arena space); 8: the rates and
// predicted seconds apart (Plan::prediction_json)
constexpr const char* kPlanFormat = "qstage-plan-9";  // 9: fused_gates
}

namespace {

// 256-byte alignment for blocks that GEMMs read (what cuBLAS prefers), 16 for tiny ones, whose
// padding would otherwise dominate the arena of a circuit's many small tensors.
std::uint64_t align(std::uint64_t x) {
  const std::uint64_t a = x >= 4096 ? 256 : 16;
  return (x + a - 1) / a * a;
}

bool contains(const std::vector<Mode>& v, Mode m) { return std::find(v.begin(), v.end(), m) != v.end(); }

std::vector<Mode> without(const std::vector<Mode>& v, const std::set<Mode>& drop) {
  std::vector<Mode> out;
  for (Mode m : v)
    if (!drop.count(m)) out.push_back(m);
  return out;
}

// First-fit placement of blocks in an arena, freed explicitly.
class Arena {
 public:
  std::uint64_t place(std::uint64_t bytes) {
    bytes = align(std::max<std::uint64_t>(bytes, 1));
    std::uint64_t at = 0;
    for (auto it = used_.begin(); it != used_.end(); ++it) {
      if (it->first >= at + bytes) {
        used_.insert(it, {at, bytes});
        peak_ = std::max(peak_, at + bytes);
        return at;
      }
      at = it->first + it->second;
    }
    used_.push_back({at, bytes});
    peak_ = std::max(peak_, at + bytes);
    return at;
  }
  void free(std::uint64_t at) {
    used_.remove_if([&](const auto& b) { return b.first == at; });
  }
  std::uint64_t in_use() const {
    std::uint64_t s = 0;
    for (const auto& b : used_) s += b.second;
    return s;
  }
  std::uint64_t peak() const { return peak_; }

 private:
  std::list<std::pair<std::uint64_t, std::uint64_t>> used_;  // (offset, bytes), by offset
  std::uint64_t peak_ = 0;
};

}  // namespace

std::int64_t stride_in(const Network& net, const std::vector<Mode>& layout, Mode m) {
  std::int64_t s = 1;
  for (size_t j = layout.size(); j-- > 0;) {
    if (layout[j] == m) return s;
    s *= net.extent.at(layout[j]);
  }
  return 0;  // not in this tensor: the loop index does not move it
}

namespace {

// Each mode's stride in `layout` (row-major: the last mode moves fastest), worked out once per
// layout: a step's loop modes each look up three layouts (stride_in walks the layout per mode).
struct Strides {
  std::vector<std::pair<Mode, std::int64_t>> of;
  Strides(const Network& net, const std::vector<Mode>& layout) {
    std::int64_t s = 1;
    for (size_t j = layout.size(); j-- > 0;) {
      of.emplace_back(layout[j], s);
      s *= net.extent.at(layout[j]);
    }
  }
  std::int64_t operator()(Mode m) const {
    for (const auto& [mode, stride] : of)
      if (mode == m) return stride;
    return 0;  // not in this tensor (as stride_in)
  }
};

}  // namespace

std::vector<LoopGroup> loop_groups(const Network& net, const PlanStep& st) {
  const Strides L(net, st.left_is_b ? st.b_modes : st.a_modes), R(net, st.left_is_b ? st.a_modes : st.b_modes),
      C(net, st.c_modes);
  std::vector<LoopGroup> groups;
  for (auto it = st.loop_modes.rbegin(); it != st.loop_modes.rend(); ++it) {
    const LoopGroup o{net.extent.at(*it), L(*it), R(*it), C(*it)};
    if (!groups.empty()) {
      LoopGroup& in = groups.back();
      if (o.l == in.l * in.extent && o.r == in.r * in.extent && o.c == in.c * in.extent) {
        in.extent *= o.extent;
        continue;
      }
    }
    groups.push_back(o);
  }
  return groups;
}

PackedLayouts packed_layouts(const PlanStep& st) {
  const auto& L = st.left_is_b ? st.b_modes : st.a_modes;
  const auto& R = st.left_is_b ? st.a_modes : st.b_modes;
  PackedLayouts p;
  auto &batch = p.batch, &m_modes = p.m, &n_modes = p.n;
  std::vector<Mode> k_modes;
  for (Mode m : st.c_modes) {
    const bool in_l = contains(L, m), in_r = contains(R, m);
    (in_l && in_r ? batch : in_l ? m_modes : n_modes).push_back(m);
  }
  for (Mode m : L)
    if (!contains(st.c_modes, m)) k_modes.push_back(m);
  auto join = [](std::initializer_list<const std::vector<Mode>*> parts) {
    std::vector<Mode> v;
    for (const auto* x : parts) v.insert(v.end(), x->begin(), x->end());
    return v;
  };
  p.l = join({&batch, &m_modes, &k_modes});
  p.r = join({&batch, &n_modes, &k_modes});
  p.c = join({&batch, &m_modes, &n_modes});
  return p;
}

std::uint64_t moved_bytes(const PlanStep& st) { return st.a_bytes + st.b_bytes + st.c_bytes + 2 * st.transposed_bytes; }

double roofline_seconds(const PlanStep& st, double bandwidth, double gemm_rate) {
  return std::max(static_cast<double>(moved_bytes(st)) / bandwidth, st.flops / gemm_rate);
}

PlanStep block_view(const PlanStep& st) {
  PlanStep v = st;
  if (st.block_modes == 0) return v;
  const std::set<Mode> fixed(st.c_modes.begin(), st.c_modes.begin() + st.block_modes);
  v.a_modes = without(st.a_modes, fixed);
  v.b_modes = without(st.b_modes, fixed);
  v.c_modes = without(st.c_modes, fixed);
  v.block_modes = 0;
  return v;
}

namespace {

// How many times a walk copies in an operand that carries the block modes `own`: once per value
// of the walk's modes up to the innermost of its own.
std::int64_t fetches(const Network& net, const std::vector<Mode>& order, const std::vector<Mode>& own) {
  std::int64_t count = 1, upto = 1;
  for (Mode m : order) {
    upto *= net.extent.at(m);
    if (contains(own, m)) count = upto;
  }
  return count;
}

}  // namespace

BlockWalk block_walk(const Network& net, const PlanStep& st) {
  const std::vector<Mode> fixed(st.c_modes.begin(), st.c_modes.begin() + st.block_modes);
  std::vector<Mode> both, only_a, only_b, neither;
  for (Mode m : fixed) {
    const bool a = st.a_host && contains(st.a_modes, m), b = st.b_host && contains(st.b_modes, m);
    (a && b ? both : a ? only_a : b ? only_b : neither).push_back(m);
  }
  auto walk = [&](const std::vector<Mode>& first, const std::vector<Mode>& second) {
    BlockWalk w;
    for (const auto& part : {both, first, second, neither}) w.order.insert(w.order.end(), part.begin(), part.end());
    w.a_fetches = st.a_host ? fetches(net, w.order, st.a_modes) : 0;
    w.b_fetches = st.b_host ? fetches(net, w.order, st.b_modes) : 0;
    return w;
  };
  auto copied = [&](const BlockWalk& w) {  // bytes copied in, up to a common factor
    auto per_block = [&](const std::vector<Mode>& modes, std::int64_t n) {
      double own = 1;
      for (Mode m : fixed)
        if (contains(modes, m)) own *= static_cast<double>(net.extent.at(m));
      return static_cast<double>(net.size_of(modes)) / own * static_cast<double>(n);
    };
    return per_block(st.a_modes, w.a_fetches) + per_block(st.b_modes, w.b_fetches);
  };
  BlockWalk a_first = walk(only_a, only_b), b_first = walk(only_b, only_a);
  return copied(b_first) < copied(a_first) ? b_first : a_first;
}

namespace {

// Host-side GEMM calls a step needs as strided batches: the product of all but the innermost group.
std::int64_t host_calls(const std::vector<LoopGroup>& groups) {
  std::int64_t calls = 1;
  for (size_t i = 1; i < groups.size(); ++i) calls *= groups[i].extent;
  return calls;
}

// Sets the step's in-place GEMM mapping from its layouts: the trailing [L-run | R-run] block of
// C and the loop modes before it.
void map_step(const Network& net, PlanStep& st) {
  auto origin = [&](Mode m) { return (contains(st.a_modes, m) ? 1 : 0) | (contains(st.b_modes, m) ? 2 : 0); };
  const auto& C = st.c_modes;
  size_t end = C.size(), r_begin = end, l_begin = end;
  st.left_is_b = false;
  if (!C.empty() && origin(C.back()) != 3) {
    const int r_origin = origin(C.back());
    while (r_begin > 0 && origin(C[r_begin - 1]) == r_origin) --r_begin;
    l_begin = r_begin;
    const int l_origin = 3 - r_origin;
    while (l_begin > 0 && origin(C[l_begin - 1]) == l_origin) --l_begin;
    st.left_is_b = r_origin == 1;  // the trailing run comes from A: A is the right operand
  }
  st.loop_modes.assign(C.begin(), C.begin() + static_cast<std::ptrdiff_t>(l_begin));
  st.m = st.n = st.k = st.loops = 1;
  for (size_t i = l_begin; i < r_begin; ++i) st.m *= net.extent.at(C[i]);
  for (size_t i = r_begin; i < end; ++i) st.n *= net.extent.at(C[i]);
  for (Mode m : st.a_modes)
    if (!contains(C, m)) st.k *= net.extent.at(m);
  for (Mode m : st.loop_modes) st.loops *= net.extent.at(m);
}

// A step runs in place when its host loop makes at most this many GEMM calls, or at most
// kMaxBigCalls calls of at least kBigCall multiply-adds each (launches are then negligible).
constexpr std::int64_t kMaxHostCalls = 16, kMaxBigCalls = 1024;
constexpr double kBigCall = 0x1p26;
// Products up to this many multiply-adds (after packing) run looped rather than through copies.
constexpr std::int64_t kTinyProduct = 4096;
// Products this skinny (k and the smaller of m, n at most this), batched or not, run looped too:
// on an H200 cuBLAS ran strided batches of 2 x 2 x 2 products at 1/200 of memory bandwidth, and
// a 2^28 x 2 x 2 product at 1/10.
constexpr std::int64_t kSkinny = 16;
// An operand of at most this many elements stays in the GPU's caches while the looped kernel
// walks the other one (a gate, or a few gates contracted together).
constexpr std::int64_t kGateSized = 4096;
// Products of at most this many result elements (m n once packed: loop modes of one operand only
// join m or n) over long sums (k of kernels::kLoopedBlockSum or more) run looped too, one block per
// element: on an H100 cuBLAS took 0.66 s for a batch of 16 2 x 2 x 2^21 products (256 MiB read)
// that one block per element reads at memory speed, and 87 ms in place for 4 of 8 x 8 x 2^21 (16 x
// 16 packed) that took 2.2 ms looped. (Not m n in place: a 53-qubit slice had a step of 2 x 2 x
// 4096 products over 2^26 loops, in fact four 8192 x 8192 x 4096 GEMMs whose operands' loop modes
// sat apart from i and j; one block per element took 97 s of a 0.17 s compute bound.)
constexpr std::int64_t kFewResults = 256;

// What a block of a spilled step costs beyond its work (launches, copy and stream setup).
constexpr double kBlockSeconds = 20e-6;

// Chooses how step `st` (its in-place GEMM mapping already set) runs: in place (strided batches
// in a host loop), packed, or looped; a packed step's mapping is replaced by the packed one.
void decide_execution(const Network& net, PlanStep& st) {
  const auto groups = loop_groups(net, st);
  PlanStep packed = st;
  packed.execution = Execution::packed;
  // L is the operand of C's first mode outside the batch (either, if there is none).
  packed.left_is_b = false;
  for (Mode m : st.c_modes) {
    const bool in_a = contains(st.a_modes, m), in_b = contains(st.b_modes, m);
    if (in_a != in_b) {
      packed.left_is_b = in_b;
      break;
    }
  }
  const auto pl = packed_layouts(packed);
  packed.loop_modes = pl.batch;
  packed.loops = net.size_of(pl.batch);
  packed.m = net.size_of(pl.m);
  packed.n = net.size_of(pl.n);
  if (packed.m * packed.n <= kFewResults && st.k >= kernels::kLoopedBlockSum &&
      groups.size() <= static_cast<size_t>(kernels::kMaxLoopGroups)) {
    st.execution = Execution::looped;  // a handful of long sums: one block each (cuBLAS runs one CTA per product)
    return;
  }
  // (Longer power-of-two sums are skinny too where the other operand is a gate-sized tensor: the
  // looped kernel reads the large one once, where cuBLAS ran a batch of 512 products of 2 x 262144
  // x 64 at 1/20 of memory bandwidth in a 53-qubit slice. Where both operands are large, batches
  // of 2 x 2 x 32 products ran 5x slower looped than packed: they stay with cuBLAS.)
  const bool power_of_two_sum = (st.k & (st.k - 1)) == 0;
  const bool gate_sized = std::min(net.size_of(st.a_modes), net.size_of(st.b_modes)) <= kGateSized;
  const bool skinny = std::min(st.m, st.n) <= kSkinny &&
                      (st.k <= kSkinny || (power_of_two_sum && gate_sized && st.k <= kernels::kLoopedRowsMaxSum));
  if (skinny && groups.size() <= static_cast<size_t>(kernels::kMaxLoopGroups)) {
    st.execution = Execution::looped;  // one kernel walks the loops (if any), where cuBLAS is slow at such shapes
    return;
  }
  if (st.loop_modes.empty()) return;  // one plain GEMM
  const std::int64_t calls = host_calls(groups);
  const double per_call = static_cast<double>(st.m * st.n * st.k) * static_cast<double>(groups.front().extent);
  // (Batches of tiny products are slow in cuBLAS too: packing may merge them into larger ones.)
  if ((calls <= kMaxHostCalls || (calls <= kMaxBigCalls && per_call >= kBigCall)) && st.m * st.n * st.k > kTinyProduct)
    return;
  const auto& L = packed.left_is_b ? st.b_modes : st.a_modes;
  const auto& R = packed.left_is_b ? st.a_modes : st.b_modes;
  if (packed.m * packed.n * packed.k <= kTinyProduct && groups.size() <= static_cast<size_t>(kernels::kMaxLoopGroups)) {
    st.execution = Execution::looped;  // copies would cost more than the arithmetic: one kernel walks the loops
    return;
  }
  packed.pack_l = L != pl.l;
  packed.pack_r = R != pl.r;
  packed.pack_c = st.c_modes != pl.c;
  st = std::move(packed);
}

// One block of the step, with its execution decided.
PlanStep mapped_block(const Network& net, const PlanStep& st) {
  PlanStep v = block_view(st);
  map_step(net, v);
  decide_execution(net, v);
  return v;
}

}  // namespace

namespace {

// Whether a step not spilled, mapped as mapped_block maps it, runs in a chain.
bool chains(const Network& net, const PlanStep& v) {
  return v.execution == Execution::looped &&
         kernels::LoopedChain::fits(v.m, v.n, v.k, static_cast<std::uint64_t>(v.loops),
                                    static_cast<int>(loop_groups(net, v).size()));
}

}  // namespace

// (`st` needs its tensors only: step_tensors'.)
bool runs_chained(const Network& net, const PlanStep& st) {
  return !st.spilled() && chains(net, mapped_block(net, st));
}

PlanStep local_step(const Network& net, const PlanStep& st, const std::vector<Mode>& fixed, std::uint64_t element_bytes,
                    std::uint64_t& workspace_bytes) {
  const std::set<Mode> drop(fixed.begin(), fixed.end());
  PlanStep v = st;
  v.a_modes = without(st.a_modes, drop);
  v.b_modes = without(st.b_modes, drop);
  v.c_modes = without(st.c_modes, drop);
  v.block_modes = 0;
  v.blocks = 1;
  v.block_order.clear();
  v.a_host = v.b_host = v.c_host = false;
  v.invariant = v.a_persistent = v.b_persistent = v.c_persistent = false;
  v.execution = Execution::in_place;
  v.pack_l = v.pack_r = v.pack_c = false;
  map_step(net, v);
  decide_execution(net, v);
  workspace_bytes = 0;
  if (v.execution == Execution::packed) {
    const auto pl = packed_layouts(v);
    auto place = [&](bool packed, const std::vector<Mode>& modes, std::uint64_t& offset) {
      if (!packed) return;
      offset = workspace_bytes;
      workspace_bytes += align(static_cast<std::uint64_t>(net.size_of(modes)) * element_bytes);
    };
    place(v.pack_l, pl.l, v.pack_l_offset);
    place(v.pack_r, pl.r, v.pack_r_offset);
    place(v.pack_c, pl.c, v.pack_c_offset);
  }
  return v;
}

namespace {

// Device workspace of one block of a spilled step: its host tensors' staging and its packing.
std::uint64_t staging_bytes(const Network& net, const PlanStep& st, const std::vector<Mode>& full,
                            const std::vector<Mode>& in_block, std::uint64_t element_bytes) {
  const int slots = staging_slots(full.size() != in_block.size(), st.blocks);
  return static_cast<std::uint64_t>(slots) * staging_stride(static_cast<std::uint64_t>(net.size_of(in_block)) * element_bytes);
}

std::int64_t block_count(const Network& net, const PlanStep& st) {
  std::int64_t blocks = 1;
  for (int i = 0; i < st.block_modes; ++i) blocks *= net.extent.at(st.c_modes[static_cast<size_t>(i)]);
  return blocks;
}

std::uint64_t block_workspace(const Network& net, PlanStep st, const PlanOptions& o) {
  st.blocks = block_count(net, st);
  const PlanStep v = mapped_block(net, st);
  auto bytes = [&](const std::vector<Mode>& ms) { return static_cast<std::uint64_t>(net.size_of(ms)) * o.element_bytes; };
  std::uint64_t w = (st.a_host ? staging_bytes(net, st, st.a_modes, v.a_modes, o.element_bytes) : 0) +
                    (st.b_host ? staging_bytes(net, st, st.b_modes, v.b_modes, o.element_bytes) : 0) +
                    (st.c_host ? staging_bytes(net, st, st.c_modes, v.c_modes, o.element_bytes) : 0);
  if (v.execution == Execution::packed) {
    const auto pl = packed_layouts(v);
    w += (v.pack_l ? bytes(pl.l) : 0) + (v.pack_r ? bytes(pl.r) : 0) + (v.pack_c ? bytes(pl.c) : 0);
  }
  return w;
}

// How many of C's leading modes a spilled step blocks over: the fewest whose workspace fits what
// the device budget leaves beside the `device_live` bytes; if none do, all of them.
void choose_blocks(const Network& net, PlanStep& st, const PlanOptions& o, std::uint64_t device_live) {
  const std::uint64_t avail = o.budget_bytes > device_live ? o.budget_bytes - device_live : 0;
  const int most = static_cast<int>(st.c_modes.size());
  for (st.block_modes = 0; st.block_modes < most; ++st.block_modes)
    if (block_workspace(net, st, o) <= avail) break;
  st.blocks = block_count(net, st);
}

// Which steps give the same result in every slice: those with no sliced mode in any input tensor
// below them. Steps touching the host arena, and every step above one, count as variant: spilled
// steps are recomputed per slice, which keeps their block-wise execution as it is. So do the
// steps of the intermediates `recomputed` (those whose results would not fit in memory) and
// every step above them.
std::vector<bool> invariant_steps(const Network& net, const Path& p, const std::set<Mode>& sliced,
                                  const std::set<int>& host_ids, const std::set<int>& recomputed) {
  const size_t N = net.tensors.size();
  std::vector<bool> varies(N + p.ssa.size(), false);  // per id: differs between slices
  for (size_t i = 0; i < N; ++i)
    for (Mode m : net.tensors[i].modes) varies[i] = varies[i] || sliced.count(m) > 0;
  std::vector<bool> invariant(p.ssa.size());
  for (size_t s = 0; s < p.ssa.size(); ++s) {
    const auto [a, b] = p.ssa[s];
    const int c = static_cast<int>(N + s);
    varies[N + s] = varies[static_cast<size_t>(a)] || varies[static_cast<size_t>(b)] || host_ids.count(a) ||
                    host_ids.count(b) || host_ids.count(c) || recomputed.count(c);
    invariant[s] = !varies[N + s];
  }
  if (!invariant.empty()) invariant.back() = false;  // the root runs per slice: it is each slice's output
  return invariant;
}

// The device bytes one contraction is charged: its arena and its share of the persistent region.
std::uint64_t device_share(const Plan& p, const PlanOptions& o) {
  return p.arena_bytes + (p.persistent_bytes + o.arenas - 1) / o.arenas;
}

// The layout of every id (inputs, then intermediates; per slice, sliced modes removed) from one
// backward pass: the root's layout is the output order, and every step gives its operands
// [retained modes in C's order | reduced modes, ascending]. Every intermediate has one consumer,
// so no two layouts conflict, and every step is a GEMM reading its operands where they lie.
std::vector<std::vector<Mode>> backward_layouts(const Network& net, const Path& p,
                                                const std::vector<std::vector<Mode>>& modes) {
  const size_t N = net.tensors.size();
  std::vector<std::vector<Mode>> layout(modes.size());
  if (N == 1) {
    layout[0] = net.output;
    return layout;
  }
  layout[modes.size() - 1] = net.output;
  for (size_t s = p.ssa.size(); s-- > 0;) {
    const int a = p.ssa[s].first, b = p.ssa[s].second;
    const auto& C = layout[N + s];
    const auto& A = modes[static_cast<size_t>(a)];
    const auto& B = modes[static_cast<size_t>(b)];
    std::vector<Mode> K;
    for (Mode m : A)
      if (contains(B, m) && !contains(C, m)) K.push_back(m);
    std::sort(K.begin(), K.end());
    for (int id : {a, b}) {
      const auto& X = modes[static_cast<size_t>(id)];
      std::vector<Mode> l;
      for (Mode m : C)
        if (contains(X, m)) l.push_back(m);
      l.insert(l.end(), K.begin(), K.end());
      layout[static_cast<size_t>(id)] = l;
    }
  }
  return layout;
}

// The input tensors' planned layouts. They stay resident outside the arena; the contractor
// permutes those whose planned order differs from the stored one once, when it loads them.
void plan_inputs(Plan& plan, const Network& net, const std::vector<std::vector<Mode>>& layout,
                 const std::set<Mode>& sliced, std::uint64_t element_bytes) {
  for (size_t i = 0; i < net.tensors.size(); ++i) {
    plan.input_layouts.push_back(layout[i]);
    if (layout[i] != without(net.tensors[i].modes, sliced)) ++plan.input_transposes;
    plan.input_bytes += static_cast<std::uint64_t>(net.size_of(net.tensors[i].modes)) * element_bytes;
  }
}

// Reuse across slices: which steps run once per bitstring, and which results stay resident for
// the slices that read them.
struct Reuse {
  std::vector<bool> invariant;   // per step: in the prologue (none unless sliced and reuse_invariant)
  std::vector<bool> persistent;  // per id: an invariant result a variant step reads
};

Reuse find_reuse(const Network& net, const Path& p, const std::set<Mode>& sliced, const Plan& plan,
                 const PlanOptions& o, const std::set<int>& host_ids, const std::set<int>& recomputed) {
  const size_t N = net.tensors.size();
  Reuse r;
  r.invariant = o.reuse_invariant && plan.slices > 1 ? invariant_steps(net, p, sliced, host_ids, recomputed)
                                                     : std::vector<bool>(p.ssa.size(), false);
  auto is_invariant = [&](int id) { return id >= static_cast<int>(N) && r.invariant[static_cast<size_t>(id) - N]; };
  r.persistent.assign(N + p.ssa.size(), false);
  for (size_t s = 0; s < p.ssa.size(); ++s)
    if (!r.invariant[s])
      for (int id : {p.ssa[s].first, p.ssa[s].second}) r.persistent[static_cast<size_t>(id)] = is_invariant(id);
  return r;
}

// The persistent region holds every persistent result at once, placed up front (before the
// arenas), so the slices find them where the prologue left them. Returns its size.
std::uint64_t place_persistent(const Reuse& reuse, const std::vector<std::uint64_t>& bytes,
                               std::vector<std::uint64_t>& offset) {
  Arena region;
  for (size_t id = 0; id < bytes.size(); ++id)
    if (reuse.persistent[id]) offset[id] = region.place(bytes[id]);
  return region.peak();
}

// Step s of the path as the memory plan first sees it: its operands and result, their layouts
// and bytes, and where each lives (host arena, persistent region or the arena).
PlanStep step_tensors(const Path& p, size_t s, size_t N, const std::vector<std::vector<Mode>>& layout,
                      const std::vector<std::uint64_t>& bytes, const std::set<int>& host_ids, const Reuse& reuse) {
  PlanStep st;
  st.a = p.ssa[s].first;
  st.b = p.ssa[s].second;
  st.c = static_cast<int>(N + s);
  const auto a = static_cast<size_t>(st.a), b = static_cast<size_t>(st.b), c = static_cast<size_t>(st.c);
  st.a_modes = layout[a];
  st.b_modes = layout[b];
  st.c_modes = layout[c];
  st.a_bytes = bytes[a];
  st.b_bytes = bytes[b];
  st.c_bytes = bytes[c];
  st.a_host = host_ids.count(st.a) > 0;
  st.b_host = host_ids.count(st.b) > 0;
  st.c_host = host_ids.count(st.c) > 0;
  st.invariant = reuse.invariant[s];
  st.a_persistent = reuse.persistent[a];
  st.b_persistent = reuse.persistent[b];
  st.c_persistent = reuse.persistent[c];
  return st;
}

// Decides how the step runs. A spilled step first chooses its blocks, the fewest whose workspace
// fits beside the `device_live` bytes. The step takes the GEMM mapping and execution of one
// block (of itself, if not spilled) but keeps its full layouts: the contractor derives the
// block's layouts again (block_view). Returns that block, whose layouts size the workspace.
// `mapped`: the step's mapped_block from before its tensors were placed, where it is not spilled
// (the mapping reads modes only), else null.
PlanStep choose_execution(const Network& net, PlanStep& st, const PlanOptions& o, std::uint64_t device_live,
                          const PlanStep* mapped) {
  if (st.spilled()) choose_blocks(net, st, o, device_live);
  PlanStep block = mapped && !st.spilled() ? *mapped : mapped_block(net, st);
  block.a_offset = st.a_offset;
  block.b_offset = st.b_offset;
  block.c_offset = st.c_offset;
  PlanStep full = block;
  full.a_modes = st.a_modes;
  full.b_modes = st.b_modes;
  full.c_modes = st.c_modes;
  full.block_modes = st.block_modes;
  st = std::move(full);
  return block;
}

// Places the step's workspace in `work`: two (or one) staging slots per host tensor's blocks, and
// a packed step's copies of its operands and result. Returns their offsets, to free once the step
// is done (workspace is live during its step only).
std::vector<std::uint64_t> place_workspace(const Network& net, PlanStep& st, const PlanStep& block, Arena& work,
                                           std::uint64_t e) {
  std::vector<std::uint64_t> workspace;
  auto stage = [&](const std::vector<Mode>& full, const std::vector<Mode>& in_block, std::uint64_t& offset) {
    workspace.push_back(offset = work.place(staging_bytes(net, st, full, in_block, e)));
  };
  if (st.a_host) stage(st.a_modes, block.a_modes, st.stage_a_offset);
  if (st.b_host) stage(st.b_modes, block.b_modes, st.stage_b_offset);
  if (st.c_host) stage(st.c_modes, block.c_modes, st.stage_c_offset);
  if (st.execution == Execution::packed) {
    const auto pl = packed_layouts(block);
    auto bytes_of = [&](const std::vector<Mode>& ms) { return static_cast<std::uint64_t>(net.size_of(ms)) * e; };
    const std::uint64_t l = bytes_of(pl.l), r = bytes_of(pl.r), c = bytes_of(pl.c);
    if (st.pack_l) workspace.push_back(st.pack_l_offset = work.place(l));
    if (st.pack_r) workspace.push_back(st.pack_r_offset = work.place(r));
    if (st.pack_c) workspace.push_back(st.pack_c_offset = work.place(c));
    st.transposed_bytes = static_cast<std::uint64_t>(st.blocks) *
                          ((st.pack_l ? l : 0) + (st.pack_r ? r : 0) + (st.pack_c ? c : 0));
  }
  return workspace;
}

// The step's host copies, flops and predicted time (seed 000's eq. 6, plus the host copies over
// PCIe). Each block of a host C is copied out once; A's and B's blocks in as often as the block
// walk copies them. Copies run on their own streams, overlapping the blocks' work; each block
// costs a few launches.
void predict(const Network& net, PlanStep& st, const PlanStep& block, const PlanOptions& o) {
  const BlockWalk walk = block_walk(net, st);
  st.block_order = walk.order;
  auto copied_in = [&](const std::vector<Mode>& modes, std::int64_t n) {
    return static_cast<double>(static_cast<std::uint64_t>(net.size_of(modes)) * o.element_bytes) *
           static_cast<double>(n);
  };
  const double host_in = copied_in(block.a_modes, walk.a_fetches) + copied_in(block.b_modes, walk.b_fetches),
               host_out = static_cast<double>(st.c_host ? st.c_bytes : 0);
  st.host_bytes = static_cast<std::uint64_t>(host_in + host_out);
  const double mnk = static_cast<double>(st.m) * static_cast<double>(st.n) * static_cast<double>(st.k) *
                     static_cast<double>(st.loops) * static_cast<double>(st.blocks);
  st.flops = (o.element_bytes >= 8 ? 8.0 : 2.0) * mnk;
  st.predicted_seconds = std::max({roofline_seconds(st, o.bandwidth, o.gemm_rate), host_in / o.pcie_bandwidth,
                                   host_out / o.pcie_bandwidth}) +
                         (st.spilled() ? kBlockSeconds * static_cast<double>(st.blocks) : 0.0);
}

// Adds a planned step to the plan's totals: the prologue's (once per bitstring) or the slices'.
void tally(Plan& plan, const PlanStep& st) {
  if (st.execution == Execution::packed) {
    ++plan.packed_steps;
    plan.step_transposes += int{st.pack_l} + int{st.pack_r} + int{st.pack_c};
    plan.transposed_bytes += st.transposed_bytes;
  }
  plan.host_copy_bytes += st.host_bytes;
  if (st.invariant) {
    ++plan.invariant_steps;
    plan.invariant_flops += st.flops;
    plan.predicted_prologue_seconds += st.predicted_seconds;
  } else {
    plan.slice_flops += st.flops;
    plan.predicted_seconds += st.predicted_seconds;
  }
}

// Builds the layouts, GEMM mapping, memory plan and predictions for a fixed set of sliced modes,
// with the intermediates `host_ids` in the host arena and, with reuse, the steps of `recomputed`
// (and those above them) run per slice even where invariant.
Plan build(const Network& net, const Path& path, const std::set<Mode>& sliced, const PlanOptions& o,
           const std::set<int>& host_ids, const std::set<int>& recomputed = {}) {
  const size_t N = net.tensors.size();
  Path p = path;
  p.sliced.assign(sliced.begin(), sliced.end());
  Plan plan;
  plan.element_bytes = o.element_bytes;
  plan.sliced = p.sliced;
  for (Mode m : sliced) plan.slices *= net.extent.at(m);
  plan.output = net.output;
  plan.bandwidth = o.bandwidth;
  plan.gemm_rate = o.gemm_rate;
  plan.pcie_bandwidth = o.pcie_bandwidth;
  const auto inter = intermediate_modes(net, p);
  plan.cost = path_cost(net, p, inter);
  plan.spilled = static_cast<int>(host_ids.size());

  std::vector<std::vector<Mode>> modes;  // unordered modes of every id (per slice)
  for (const auto& t : net.tensors) modes.push_back(without(t.modes, sliced));
  modes.insert(modes.end(), inter.begin(), inter.end());
  const auto layout = backward_layouts(net, p, modes);
  std::vector<std::uint64_t> bytes;  // of every id
  for (const auto& l : layout) bytes.push_back(static_cast<std::uint64_t>(net.size_of(l)) * o.element_bytes);
  plan_inputs(plan, net, layout, sliced, o.element_bytes);

  const Reuse reuse = find_reuse(net, p, sliced, plan, o, host_ids, recomputed);
  std::vector<std::uint64_t> offset(modes.size(), 0);  // of every intermediate, in the arena it lives in
  plan.persistent_bytes = place_persistent(reuse, bytes, offset);
  const std::uint64_t persistent_share = (plan.persistent_bytes + o.arenas - 1) / o.arenas;

  // The prologue (invariant steps) and the slices (variant steps) each lay out the arena on
  // their own: the prologue is done with it before the slices use it.
  Arena arena, prologue_arena, host_arena;
  // Chained steps that follow each other and do not read each other's results form a stage
  // (kernels::LoopedChain runs a stage's products at once). Their operands are freed when the
  // stage ends, so that no result of a stage is placed where another product of it reads: the
  // chain then finds the stage's products independent.
  std::vector<std::pair<Arena*, std::uint64_t>> stage_operands;
  std::set<int> stage_results;
  for (size_t s = 0; s < p.ssa.size(); ++s) {
    PlanStep st = step_tensors(p, s, N, layout, bytes, host_ids, reuse);
    Arena& work = st.invariant ? prologue_arena : arena;  // where the step's tensors live, but persistent ones
    std::optional<PlanStep> mapped;  // (mapped once where not spilled: the mapping reads modes only)
    if (!st.spilled()) mapped = mapped_block(net, st);
    const bool chained = mapped && chains(net, *mapped);
    if (!chained || stage_results.count(st.a) || stage_results.count(st.b)) {
      for (auto [in, at] : stage_operands) in->free(at);
      stage_operands.clear();
      stage_results.clear();
    }
    if (chained) stage_results.insert(st.c);
    if (!st.c_persistent)
      offset[static_cast<size_t>(st.c)] = st.c_host ? host_arena.place(st.c_bytes) : work.place(st.c_bytes);
    st.a_offset = offset[static_cast<size_t>(st.a)];
    st.b_offset = offset[static_cast<size_t>(st.b)];
    st.c_offset = offset[static_cast<size_t>(st.c)];
    const PlanStep block = choose_execution(net, st, o, work.in_use() + persistent_share, mapped ? &*mapped : nullptr);
    const auto workspace = place_workspace(net, st, block, work, o.element_bytes);
    st.live_bytes = work.in_use();
    for (std::uint64_t w : workspace) work.free(w);
    // Operands are done once their one consumer ran. (An operand not persistent lives where its
    // consumer works: an invariant step's result read by another invariant step is in the
    // prologue's arena.)
    for (int id : {st.a, st.b})
      if (id >= static_cast<int>(N) && !reuse.persistent[static_cast<size_t>(id)]) {
        Arena& in = host_ids.count(id) ? host_arena : work;
        if (chained)
          stage_operands.emplace_back(&in, offset[static_cast<size_t>(id)]);
        else
          in.free(offset[static_cast<size_t>(id)]);
      }
    predict(net, st, block, o);
    tally(plan, st);
    plan.steps.push_back(std::move(st));
  }
  plan.prologue_arena_bytes = prologue_arena.peak();
  plan.arena_bytes = std::max(arena.peak(), prologue_arena.peak());
  plan.host_arena_bytes = host_arena.peak();
  return plan;
}

// How far a plan is over its budgets (at most 1: it fits).
double overflow(const Plan& p, const PlanOptions& o) {
  const double device = static_cast<double>(device_share(p, o)) / static_cast<double>(o.budget_bytes);
  if (o.scratch) return device;  // what the host budget cannot hold goes to the scratch file
  return std::max(device, static_cast<double>(p.host_arena_bytes) / static_cast<double>(o.host_budget_bytes));
}

// The plan of the smallest count in (lo, hi] that fits the budgets, by bisection, where plans
// grow likelier to fit with the count: make(lo) does not fit, `at_hi` (= make(hi)) does.
template <typename Make>
Plan fewest_that_fit(std::size_t lo, std::size_t hi, Plan at_hi, Make&& make, const PlanOptions& o) {
  while (hi - lo > 1) {
    const std::size_t mid = (lo + hi) / 2;
    Plan t = make(mid);
    if (overflow(t, o) <= 1) {
      hi = mid;
      at_hi = std::move(t);
    } else {
      lo = mid;
    }
  }
  return at_hi;
}

// The plan for `sliced` that fits both budgets with the fewest intermediates in the host arena
// (out of core: the largest go first; found by doubling, then bisection), or if none fits, the
// one closest to fitting.
Plan fit(const Network& net, const Path& path, const std::set<Mode>& sliced, const PlanOptions& o) {
  Plan closest = build(net, path, sliced, o, {});
  if (!o.out_of_core || overflow(closest, o) <= 1 || path.ssa.size() < 2) return closest;
  Path p = path;
  p.sliced.assign(sliced.begin(), sliced.end());
  const auto inter = intermediate_modes(net, p);
  const int N = static_cast<int>(net.tensors.size());
  std::vector<int> order;  // every intermediate but the root, largest first
  for (int i = 0; i + 1 < static_cast<int>(inter.size()); ++i) order.push_back(N + i);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return net.size_of(inter[static_cast<size_t>(x - N)]) > net.size_of(inter[static_cast<size_t>(y - N)]);
  });
  auto spilling = [&](size_t count) {
    Plan t = build(net, path, sliced, o, std::set<int>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count)));
    if (overflow(t, o) < overflow(closest, o)) closest = t;
    return t;
  };
  size_t lo = 0, hi = 1;
  Plan fitting;
  for (;; lo = hi, hi *= 2) {
    hi = std::min(hi, order.size());
    fitting = spilling(hi);
    if (overflow(fitting, o) <= 1) break;
    if (hi == order.size()) return closest;
  }
  fitting = fewest_that_fit(lo, hi, std::move(fitting), spilling, o);
  hi = fitting.spilled;
  // Spilling more leaves more device memory for staging, so fewer and larger blocks: keep
  // doubling while the prediction improves.
  for (size_t more = 2 * hi; more / 2 < order.size(); more *= 2) {
    Plan t = spilling(std::min(more, order.size()));
    if (overflow(t, o) > 1 || t.predicted_seconds >= fitting.predicted_seconds) break;
    fitting = std::move(t);
  }
  return fitting;
}

std::set<int> host_ids_of(const Plan& plan) {
  std::set<int> ids;
  for (const auto& st : plan.steps)
    if (st.c_host) ids.insert(st.c);
  return ids;
}

// `fitted` (a plan without reuse that fits the budgets) with its invariant steps run once per
// bitstring, as many as fit: the persistent results whose region, with the arenas, would not fit
// are recomputed per slice instead, the largest first (the invariant operands of a recomputed
// step become persistent in its place). The fewest recomputed that fit are found by bisection;
// recomputing all of them is `fitted` itself.
Plan with_reuse(const Network& net, const Path& path, const Plan& fitted, const PlanOptions& o) {
  const size_t N = net.tensors.size();
  Path p = path;
  p.sliced = fitted.sliced;
  const std::set<Mode> sliced(fitted.sliced.begin(), fitted.sliced.end());
  const std::set<int> host_ids = host_ids_of(fitted);
  const auto invariant = invariant_steps(net, p, sliced, host_ids, {});
  auto is_invariant = [&](int id) { return id >= static_cast<int>(N) && invariant[static_cast<size_t>(id) - N]; };
  auto larger_first = [&](int x, int y) {  // (a heap's order: its top is the largest, then the lowest id)
    const auto bx = fitted.steps[static_cast<size_t>(x) - N].c_bytes, by = fitted.steps[static_cast<size_t>(y) - N].c_bytes;
    return bx != by ? bx < by : x > y;
  };
  std::vector<int> persistent;  // the frontier: invariant results read by variant steps
  for (size_t s = 0; s < p.ssa.size(); ++s)
    if (!invariant[s])
      for (int id : {p.ssa[s].first, p.ssa[s].second})
        if (is_invariant(id)) persistent.push_back(id);
  std::make_heap(persistent.begin(), persistent.end(), larger_first);
  std::vector<int> order;  // the order to recompute them in
  while (!persistent.empty()) {
    std::pop_heap(persistent.begin(), persistent.end(), larger_first);
    const int id = persistent.back();
    persistent.pop_back();
    order.push_back(id);
    for (int operand : {p.ssa[static_cast<size_t>(id) - N].first, p.ssa[static_cast<size_t>(id) - N].second})
      if (is_invariant(operand)) {
        persistent.push_back(operand);
        std::push_heap(persistent.begin(), persistent.end(), larger_first);
      }
  }
  auto recomputing = [&](size_t count) {
    return build(net, path, sliced, o, host_ids, std::set<int>(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count)));
  };
  Plan best = recomputing(0);
  if (overflow(best, o) <= 1) return best;
  return fewest_that_fit(0, order.size(), fitted, recomputing, o);  // recomputing all is `fitted`
}

// How much larger than the plan's own order's arena chain_waves' may be.
constexpr double kWavesArenaGrowth = 1.0 / 16;

// The path of `plan` (the steps of `path`) reordered so that chained steps (runs_chained) come in
// waves: every chained step whose operands are ready runs before the next step that is not
// chained, all of a wave before any step that reads its results. The steps that are not chained
// keep their order. A circuit's gate subtrees, which the path interleaves with the large steps,
// then run as a few runs of independent products (stages of a chain) instead of hundreds of
// dependent ones. Returns the path renumbered (SSA) in that order.
Path chain_waves(const Network& net, const Plan& plan, const Path& path) {
  const size_t N = net.tensors.size(), S = path.ssa.size();
  std::vector<bool> chained(S);
  for (size_t s = 0; s < S; ++s) chained[s] = runs_chained(net, plan.steps[s]);
  std::vector<int> waiting(S, 0);          // operands not yet computed
  std::vector<size_t> consumer(N + S, S);  // the step that reads each tensor
  for (size_t s = 0; s < S; ++s)
    for (int id : {path.ssa[s].first, path.ssa[s].second})
      if (static_cast<size_t>(id) >= N) {
        ++waiting[s];
        consumer[static_cast<size_t>(id)] = s;
      }
  std::vector<size_t> order, wave;
  std::vector<size_t> unchained;
  for (size_t s = 0; s < S; ++s) {
    if (!chained[s])
      unchained.push_back(s);
    else if (waiting[s] == 0)
      wave.push_back(s);
  }
  auto run = [&](size_t s, std::vector<size_t>& next) {
    order.push_back(s);
    const size_t reader = consumer[N + s];
    if (reader < S && --waiting[reader] == 0 && chained[reader]) next.push_back(reader);
  };
  for (size_t u = 0;; ++u) {
    while (!wave.empty()) {
      std::vector<size_t> next;
      for (size_t s : wave) run(s, next);
      std::sort(next.begin(), next.end());
      wave = std::move(next);
    }
    if (u == unchained.size()) break;
    if (waiting[unchained[u]] != 0) throw std::logic_error("tn.plan: chain waves left a step's operand uncomputed");
    run(unchained[u], wave);
    std::sort(wave.begin(), wave.end());
  }
  if (order.size() != S) throw std::logic_error("tn.plan: chain waves lost a step");
  std::vector<int> renamed(N + S);
  for (size_t i = 0; i < N; ++i) renamed[i] = static_cast<int>(i);
  for (size_t i = 0; i < S; ++i) renamed[N + order[i]] = static_cast<int>(N + i);
  Path waved;
  waved.sliced = path.sliced;
  for (size_t s : order)
    waved.ssa.emplace_back(renamed[static_cast<size_t>(path.ssa[s].first)],
                           renamed[static_cast<size_t>(path.ssa[s].second)]);
  return waved;
}

// The last checks and settings of a plan that fits.
Plan finish(Plan plan, const PlanOptions& o) {
  plan.scratch = o.scratch && plan.host_arena_bytes > o.host_budget_bytes;
  if (static_cast<double>(plan.slices) > o.max_slices)  // e.g. an imported path that slices many modes
    throw InputError(fmt::format("the plan has {:.3g} slices ({} modes sliced), more than max_slices {:.3g}; expected a "
                                 "path that slices fewer modes or a larger max_slices",
                                 static_cast<double>(plan.slices), plan.sliced.size(), o.max_slices));
  return plan;
}

// The plan (every step in every slice) that fits the budgets, and the path it runs: `path` with its
// own sliced modes if that fits (out of core: after spilling), else the path sliced anew by cost
// (paths/slicing.hpp: the modes that minimize the total flops for a cap on the largest tensor,
// with the tree reconfigured between them). The arena holds several tensors at once, so the cap
// comes down until the arena fits. Throws InputError if no slicing fits.
std::pair<Plan, Path> slice_to_fit(const Network& net, const Path& path, const PlanOptions& o) {
  const std::set<Mode> given(path.sliced.begin(), path.sliced.end());
  Plan plan = fit(net, path, given, o);
  if (overflow(plan, o) <= 1) return {std::move(plan), path};
  const SearchNetwork search = SearchNetwork::from(net);
  const ContractionTree start = ContractionTree::from_path(search, path);  // with the path's own sliced modes
  const double element = static_cast<double>(o.element_bytes);
  // In core every tensor must fit the budget, so the cap starts below it. Out of core, tensors
  // larger than the device budget live in host memory: the cap comes down from the largest.
  double target = start.cost().log2_largest_intermediate() - 1.0;
  if (!o.out_of_core)
    target = std::min(target, std::floor(std::log2(std::max(static_cast<double>(o.budget_bytes) / element, 1.0))) - 1.0);
  // The output is never sliced: no cap below its size can be reached, so that cap is the last try.
  const double lowest = std::log2(std::max(static_cast<double>(net.size_of(net.output)), 1.0));
  for (bool last = false;; target -= std::max(1.0, std::ceil(std::log2(overflow(plan, o))))) {
    if (last)
      throw InputError(fmt::format("device memory budget {} is too small even with slicing: one slice still needs {} "
                                   "({} modes sliced); expected a larger budget or a better path",
                                   format_bytes(static_cast<double>(o.budget_bytes)),
                                   format_bytes(static_cast<double>(plan.arena_bytes)), plan.sliced.size()));
    if (target <= lowest) {
      target = lowest;
      last = true;
    }
    ContractionTree tree = start;
    SliceOptions so;
    so.target_log2_size = target;
    so.count_inputs = false;  // inputs stay resident, outside the arena
    so.reconfigure = o.reconfigure;
    so.subtree_size = o.subtree_size;
    const SliceReport report = slice_tree(tree, so);
    const Path sliced_path = tree.to_path();
    if (static_cast<double>(tree.cost().slices) > o.max_slices)
      throw InputError(fmt::format("device memory budget {} is too small even with slicing: it would need {:.3g} "
                                   "slices (more than {:.3g}); expected a larger budget, a larger max_slices or a path with "
                                   "smaller intermediates",
                                   format_bytes(static_cast<double>(o.budget_bytes)), tree.cost().slices, o.max_slices));
    plan = fit(net, sliced_path, std::set<Mode>(sliced_path.sliced.begin(), sliced_path.sliced.end()), o);
    spdlog::debug("tn.plan: slicing to 2^{} elements: {} modes, {} slices, overhead {:.3g}, arena {} (budget {})", target,
                  sliced_path.sliced.size(), plan.slices, report.overhead_without_reuse,
                  format_bytes(static_cast<double>(plan.arena_bytes)), format_bytes(static_cast<double>(o.budget_bytes)));
    plan.slicing_overhead = report.overhead_without_reuse;
    plan.path_reconfigured = sliced_path.ssa != path.ssa;
    if (overflow(plan, o) <= 1) return {std::move(plan), sliced_path};
    if (!report.fits)
      throw InputError(fmt::format("device memory budget {} is too small even with slicing: no closed mode is left to "
                                   "slice and one slice still needs {}; expected a larger budget or a better path",
                                   format_bytes(static_cast<double>(o.budget_bytes)),
                                   format_bytes(static_cast<double>(plan.arena_bytes))));
  }
}

}  // namespace

Path Plan::path() const {
  Path p;
  p.sliced = sliced;
  for (const PlanStep& st : steps) p.ssa.emplace_back(st.a, st.b);
  return p;
}

namespace {

// A plan and the path it runs (the same contraction as the path it came from).
struct PlanAndPath {
  Plan plan;
  Path path;
};

// The plan of `path` with its gate chains fused (paths/fusion.hpp), if it has any and the fused
// plan fits the budgets. (The fused path's steps hold no more than the chains' did, but the
// first-fit arena or the spilling may still come out larger: then the path that fits stays.)
std::optional<PlanAndPath> with_fused_gates(const Network& net, const Path& path, const PlanOptions& o) {
  const SearchNetwork search = SearchNetwork::from(net);
  ContractionTree tree = ContractionTree::from_path(search, path);
  const FuseReport fused = fuse_gate_chains(tree);
  if (!fused.fused) return std::nullopt;
  const Path fused_path = tree.to_path();
  Plan t = fit(net, fused_path, std::set<Mode>(fused_path.sliced.begin(), fused_path.sliced.end()), o);
  if (overflow(t, o) > 1) return std::nullopt;
  spdlog::debug(
      "tn.plan: {} gate chain step(s) fused: {:.4g} -> {:.4g} elements moved per slice, {:.4g} -> {:.4g} "
      "multiply-adds",
      fused.fused, fused.moved_before, fused.moved_after, fused.multiply_adds_before, fused.multiply_adds_after);
  t.fused_gates = fused.fused;
  return PlanAndPath{std::move(t), fused_path};
}

// The plan of `path` (which `plan` runs) with its chained steps in waves (chain_waves), where that
// changes the order and keeps the arena within kWavesArenaGrowth of the plan's (a network of large
// tensors grows by its small results: a few hundred KB of GBs, 1-2 % of a 20-qubit circuit's
// slice; one of small tensors alone by a tenth or more: it keeps its order, whatever the budget).
std::optional<PlanAndPath> in_waves(const Network& net, const Plan& plan, const Path& path, const PlanOptions& o) {
  Path waved = chain_waves(net, plan, path);
  if (waved.ssa == path.ssa) return std::nullopt;
  Plan t = fit(net, waved, std::set<Mode>(waved.sliced.begin(), waved.sliced.end()), o);
  if (static_cast<double>(t.arena_bytes) > static_cast<double>(plan.arena_bytes) * (1 + kWavesArenaGrowth) ||
      t.host_arena_bytes > plan.host_arena_bytes || overflow(t, o) > 1)
    return std::nullopt;
  return PlanAndPath{std::move(t), std::move(waved)};
}

// What fusion and waves make of the unsliced path, worked out beside the check that it fits
// unsliced: where it does (the usual case) the plan is ready when that check ends.
struct Ahead {
  std::optional<PlanAndPath> fused, waved;  // waved: of `fused`
  bool failed = false;                      // it threw: the plan is worked out in turn instead
};

}  // namespace

Plan make_plan(const Network& net, const Path& path, const PlanOptions& o) {
  for (Mode m : path.sliced)
    if (std::count(net.output.begin(), net.output.end(), m))
      throw InputError(fmt::format("mode {} is an output mode and cannot be sliced", m));
  // Slicing and spilling compare plans that run every step per slice (their memory is what any
  // reuse can fall back to); reuse is added to the plan that fits.
  PlanOptions every_slice = o;
  every_slice.reuse_invariant = false;
  // Fusion and waves each build the plan again: for the unsliced path they run on a second thread
  // while the path's own plan is built (they give the same plans as in turn, where it fits).
  std::future<Ahead> ahead;
  if (o.fuse_gates)
    ahead = std::async(std::launch::async, [&] {
      Ahead a;
      try {
        a.fused = with_fused_gates(net, path, every_slice);
        if (a.fused) a.waved = in_waves(net, a.fused->plan, a.fused->path, every_slice);
      } catch (...) {
        a.failed = true;
      }
      return a;
    });
  auto fitted = slice_to_fit(net, path, every_slice);
  Plan plan = std::move(fitted.first);
  Path sliced_path = std::move(fitted.second);
  // Replaces the plan by `t`, built on `p` (the same contraction), keeping what the plan reported
  // of the slicing and fusion that came before.
  auto adopt = [&](Plan t, const Path& p) {
    t.slicing_overhead = plan.slicing_overhead;
    t.path_reconfigured = plan.path_reconfigured;
    if (!t.fused_gates) t.fused_gates = plan.fused_gates;
    plan = std::move(t);
    sliced_path = p;
  };
  std::optional<Ahead> worked_out;
  if (ahead.valid()) {
    Ahead a = ahead.get();
    if (!a.failed && sliced_path.ssa == path.ssa && sliced_path.sliced == path.sliced) worked_out = std::move(a);
  }
  std::optional<PlanAndPath> fused;
  if (o.fuse_gates) fused = worked_out ? std::move(worked_out->fused) : with_fused_gates(net, sliced_path, every_slice);
  if (fused) adopt(std::move(fused->plan), fused->path);
  std::optional<PlanAndPath> waved =
      worked_out && fused ? std::move(worked_out->waved) : in_waves(net, plan, sliced_path, every_slice);
  if (waved) adopt(std::move(waved->plan), waved->path);
  if (o.reuse_invariant && plan.slices > 1) adopt(with_reuse(net, sliced_path, plan, o), Path(sliced_path));
  return finish(std::move(plan), o);
}

namespace {

// The plan's JSON fields, one list for writing and reading so the two cannot drift apart.
// io(key, field) is one JSON value; io(key, x, y, z) a JSON array of three; io.prediction(key,
// field) one value of the prediction (Plan::prediction_json), kept apart from the schedule.
template <typename Step, typename Io>
void step_fields(Step& s, Io&& io) {
  io("a", s.a);
  io("b", s.b);
  io("c", s.c);
  io("a_modes", s.a_modes);
  io("b_modes", s.b_modes);
  io("c_modes", s.c_modes);
  io("left_is_b", s.left_is_b);
  io("loop_modes", s.loop_modes);
  io("m", s.m);
  io("n", s.n);
  io("k", s.k);
  io("loops", s.loops);
  io("offsets", s.a_offset, s.b_offset, s.c_offset);
  io("bytes", s.a_bytes, s.b_bytes, s.c_bytes);
  io("flops", s.flops);
  io.prediction("predicted_seconds", s.predicted_seconds);
  io("live_bytes", s.live_bytes);
  io.flag("packed", s.execution, Execution::packed);
  io("pack", s.pack_l, s.pack_r, s.pack_c);
  io("pack_offsets", s.pack_l_offset, s.pack_r_offset, s.pack_c_offset);
  io("transposed_bytes", s.transposed_bytes);
  io.flag("looped", s.execution, Execution::looped);
  io("host", s.a_host, s.b_host, s.c_host);
  io("block_modes", s.block_modes);
  io("blocks", s.blocks);
  io("block_order", s.block_order);
  io("stage_offsets", s.stage_a_offset, s.stage_b_offset, s.stage_c_offset);
  io("host_bytes", s.host_bytes);
  io("invariant", s.invariant);
  io("persistent", s.a_persistent, s.b_persistent, s.c_persistent);
}

template <typename P, typename Io>
void plan_fields(P& p, Io&& io) {
  io("input_layouts", p.input_layouts);
  io("input_transposes", p.input_transposes);
  io("packed_steps", p.packed_steps);
  io("step_transposes", p.step_transposes);
  io("transposed_bytes", p.transposed_bytes);
  io("host_arena_bytes", p.host_arena_bytes);
  io("spilled", p.spilled);
  io("host_copy_bytes", p.host_copy_bytes);
  io("scratch", p.scratch);
  io.prediction("pcie_bandwidth", p.pcie_bandwidth);
  io("sliced", p.sliced);
  io("slices", p.slices);
  io("output", p.output);
  io("element_bytes", p.element_bytes);
  io("arena_bytes", p.arena_bytes);
  io("input_bytes", p.input_bytes);
  io.prediction("bandwidth", p.bandwidth);
  io.prediction("gemm_rate", p.gemm_rate);
  io.prediction("predicted_seconds_per_slice", p.predicted_seconds);
  io("slicing_overhead", p.slicing_overhead);
  io("path_reconfigured", p.path_reconfigured);
  io("fused_gates", p.fused_gates);
  io("prologue_arena_bytes", p.prologue_arena_bytes);
  io("persistent_bytes", p.persistent_bytes);
  io("invariant_steps", p.invariant_steps);
  io("invariant_flops", p.invariant_flops);
  io("slice_flops", p.slice_flops);
  io.prediction("predicted_prologue_seconds", p.predicted_prologue_seconds);
}

// Writes the schedule's fields (to_json) or the prediction's (prediction_json).
struct JsonWriter {
  json& j;
  bool of_prediction = false;  // the prediction's fields, else the schedule's
  template <typename T>
  void operator()(const char* key, const T& v) const {
    if (!of_prediction) j[key] = v;
  }
  template <typename T>
  void operator()(const char* key, const T& x, const T& y, const T& z) const {
    if (!of_prediction) j[key] = json::array({x, y, z});
  }
  // The execution is stored as one bool per choice other than in place ("packed", "looped").
  void flag(const char* key, Execution e, Execution choice) const {
    if (!of_prediction) j[key] = e == choice;
  }
  template <typename T>
  void prediction(const char* key, const T& v) const {
    if (of_prediction) j[key] = v;
  }
};

// Reads the schedule's fields from `j`, the prediction's from `predicted` (none: left 0).
struct JsonReader {
  const json& j;
  const json* predicted = nullptr;
  template <typename T>
  void operator()(const char* key, T& v) const {
    j.at(key).get_to(v);
  }
  template <typename T>
  void operator()(const char* key, T& x, T& y, T& z) const {
    const json& v = j.at(key);
    v.at(0).get_to(x);
    v.at(1).get_to(y);
    v.at(2).get_to(z);
  }
  void flag(const char* key, Execution& e, Execution choice) const {
    if (j.at(key).get<bool>()) e = choice;
  }
  template <typename T>
  void prediction(const char* key, T& v) const {
    if (predicted) predicted->at(key).get_to(v);
  }
};

}  // namespace

json Plan::to_json() const {
  json out = {{"format", kPlanFormat}, {"steps", json::array()}, {"cost", cost.to_json(element_bytes >= 8)}};
  plan_fields(*this, JsonWriter{out});
  for (const auto& s : steps) {
    json step = json::object();
    step_fields(s, JsonWriter{step});
    out["steps"].push_back(std::move(step));
  }
  return out;
}

json Plan::prediction_json() const {
  json out = {{"steps", json::array()}};
  plan_fields(*this, JsonWriter{out, true});
  for (const auto& s : steps) {
    json step = json::object();
    step_fields(s, JsonWriter{step, true});
    out["steps"].push_back(std::move(step));
  }
  return out;
}

Plan Plan::from_json(const json& j, const json& prediction) {
  const std::string format = j.value("format", "");
  if (format != kPlanFormat)
    throw InputError(format.rfind("qstage-plan-", 0) == 0
                         ? fmt::format("plan format {} is from another qstage version (expected {}); rerun tn.plan",
                                       format, kPlanFormat)
                         : fmt::format("not a qstage plan (format {} expected)", kPlanFormat));
  Plan p;
  const bool predicted = !prediction.is_null();
  if (predicted && prediction.at("steps").size() != j.at("steps").size())
    throw InputError(fmt::format("the plan's prediction has {} steps and the plan {}; expected the two of one tn.plan output",
                                 prediction.at("steps").size(), j.at("steps").size()));
  plan_fields(p, JsonReader{j, predicted ? &prediction : nullptr});
  for (std::size_t s = 0; s < j.at("steps").size(); ++s) {
    PlanStep st;
    step_fields(st, JsonReader{j.at("steps")[s], predicted ? &prediction.at("steps")[s] : nullptr});
    p.steps.push_back(std::move(st));
  }
  return p;
}

namespace {
stages::Kept<PlanOutput> kept_plan_output;
}  // namespace

std::shared_ptr<const PlanOutput> read_plan_output(const h5::File& file) {
  if (auto kept = kept_plan_output.find(file)) return kept;
  auto o = std::make_shared<PlanOutput>(PlanOutput{read_json_dataset(file, "plan"), nullptr});
  if (file.exists("/prediction")) o->prediction = read_json_dataset(file, "prediction");
  keep_plan_output(stages::step_key_of(file), o);
  return o;
}

void keep_plan_output(const std::string& step_key, std::shared_ptr<const PlanOutput> output) {
  kept_plan_output.keep(step_key, std::move(output));
}

}  // namespace qstage::tn
