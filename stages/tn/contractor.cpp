#include "stages/tn/contractor.hpp"

#include <chrono>
#include <complex>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"

#include "kernels/linalg/gemm.hpp"
#include "kernels/linalg/looped_gemm.hpp"
#include "kernels/linalg/reduced_gemm.hpp"
#include "kernels/linalg/permute.hpp"

namespace qstage::tn {

namespace {

// Input data in the compute precision.
std::vector<char> converted(const std::vector<cd>& data, h5::DType dtype) {
  std::vector<char> out(data.size() * h5::dtype_size(dtype));
  if (dtype == h5::DType::complex128) {
    std::memcpy(out.data(), data.data(), out.size());
  } else {
    auto* f = reinterpret_cast<std::complex<float>*>(out.data());
    for (size_t i = 0; i < data.size(); ++i) f[i] = std::complex<float>(data[i]);
  }
  return out;
}

}  // namespace

Contractor::Contractor(const Network& net, const Plan& plan, h5::DType dtype, kernels::Compute compute,
                       std::filesystem::path scratch_dir, std::optional<codec::Settings> compress_spilled)
    : net_(net), plan_(plan), dtype_(dtype), compute_(compute), scratch_dir_(std::move(scratch_dir)),
      compress_spilled_(compress_spilled) {
  if (compress_spilled_ && dtype_ != h5::DType::complex64)
    throw InputError("compress_spilled needs a complex64 plan (the codec's type); expected tn.plan's precision "
                     "complex64");
  if (tropical() && (dtype_ != h5::DType::complex128 || compute_ != kernels::Compute::full || compress_spilled_))
    throw InputError("a tropical network contracts in complex128 (an exponent and a count in each entry), in full "
                     "precision without compressed spills; expected tn.plan's precision complex128 and compute full");
  if (compute_ != kernels::Compute::full && dtype_ != h5::DType::complex64)
    throw InputError(fmt::format("compute {} needs a complex64 plan (complex128 always runs in full precision); "
                                 "expected tn.plan's precision complex64 or compute full",
                                 kernels::compute_name(compute_)));
  step_groups_.reserve(plan_.steps.size());
  for (const PlanStep& st : plan_.steps)
    step_groups_.push_back(st.loop_modes.empty() ? std::vector<LoopGroup>{} : loop_groups(net_, st));
  for (const PlanStep& st : plan_.steps) staging_bytes_ = std::max(staging_bytes_, staging_for(st));
  for (Mode m : plan.output) result_elements_ *= static_cast<std::uint64_t>(net.extent.at(m));
  for (Mode m : plan.sliced) slice_radix_.push_back(net.extent.at(m));
  slice_place_.assign(slice_radix_.size(), 1);
  for (size_t j = slice_radix_.size(); j-- > 1;)
    slice_place_[j - 1] = slice_place_[j] * static_cast<std::uint64_t>(slice_radix_[j]);
  for (size_t i = 0; i < net.tensors.size(); ++i) {
    const auto& stored = net.tensors[i].modes;
    ResidentLayout r;
    for (size_t j = 0; j < plan.sliced.size(); ++j)
      if (std::count(stored.begin(), stored.end(), plan.sliced[j])) r.modes.push_back(plan.sliced[j]);
    r.modes.insert(r.modes.end(), plan.input_layouts[i].begin(), plan.input_layouts[i].end());
    for (size_t j = 0; j < plan.sliced.size(); ++j)
      if (const std::int64_t stride = stride_in(net, r.modes, plan.sliced[j])) r.sliced.push_back({j, stride});
    resident_layout_.push_back(std::move(r));
  }
  for (const PlanStep& st : plan.steps)
    if (st.invariant)
      for (int id : {st.a, st.b})
        if (id < static_cast<int>(net.tensors.size()) && net.tensors[static_cast<size_t>(id)].projects_qubit >= 0)
          prologue_qubits_.push_back(net.tensors[static_cast<size_t>(id)].projects_qubit);
  // The inputs' places in the one device region, each aligned (a projection holds <0| and <1|).
  for (const NetTensor& t : net.tensors) {
    const std::uint64_t bytes = aligned(static_cast<std::uint64_t>(net.size_of(t.modes)) * element_bytes());
    std::array<std::uint64_t, 2> offset{resident_bytes_, 0};
    resident_bytes_ += bytes;
    if (t.projects_qubit >= 0) {
      offset[1] = resident_bytes_;
      resident_bytes_ += bytes;
    }
    input_offset_.push_back(offset);
  }
}

// The spill store of the plan's host arena: the blocks its spilled steps copy out and in, and
// the tier the plan chose (pinned memory, or with plan.scratch a scratch file), unless
// compress_spilled codes them.
engine::SpillStore::Options Contractor::spill_options() const {
  engine::SpillStore::Options o;
  o.owner = "tn.contract";
  o.space_bytes = plan_.host_arena_bytes;
  auto block_bytes = [&](const std::vector<Mode>& modes) {
    return static_cast<std::uint64_t>(net_.size_of(modes)) * element_bytes();
  };
  for (const PlanStep& st : plan_.steps) {
    if (!st.spilled()) continue;
    const PlanStep block = block_view(st);
    if (st.c_host) o.largest_store_bytes = std::max(o.largest_store_bytes, block_bytes(block.c_modes));
    if (st.a_host) o.largest_fetch_bytes = std::max(o.largest_fetch_bytes, block_bytes(block.a_modes));
    if (st.b_host) o.largest_fetch_bytes = std::max(o.largest_fetch_bytes, block_bytes(block.b_modes));
  }
  o.host_share = plan_.scratch ? 0 : plan_.host_arena_bytes;
  if (plan_.scratch) o.scratch_dir = scratch_dir_;
  o.coded = compress_spilled_;
  return o;
}

std::uint64_t Contractor::spill_device_bytes(BackendKind kind) const {
  return plan_.host_arena_bytes ? engine::SpillStore::device_bytes(kind, spill_options()) : 0;
}
std::uint64_t Contractor::spilled_raw_bytes() const {
  return spill_ && spill_->tier() == engine::SpillStore::Tier::coded ? spill_->stored_raw_bytes() : 0;
}
std::uint64_t Contractor::spilled_stored_bytes() const {
  return spill_ && spill_->tier() == engine::SpillStore::Tier::coded ? spill_->stored_kept_bytes() : 0;
}

void Contractor::upload(Backend& backend, Stream& stream) {
  backend_ = &backend;
  if (plan_.host_arena_bytes) spill_ = std::make_unique<engine::SpillStore>(backend, spill_options());
  if (plan_.persistent_bytes)
    persistent_ = backend.alloc_device(plan_.persistent_bytes, "tn: persistent region (invariant steps' results)");
  inputs_ = backend.alloc_device(std::max<std::uint64_t>(resident_bytes_, 1), "tn: input tensors");
  // The tensors are packed as they lie in the region into a pageable chunk, which goes over in one
  // copy when the next would not fit it.
  constexpr std::uint64_t kChunk = 64u << 20;
  std::vector<char> chunk;
  std::uint64_t chunk_at = 0;  // the region's offset of the chunk's first byte
  auto flush = [&] {
    if (chunk.empty()) return;
    backend.copy_to_device(static_cast<char*>(inputs_.data()) + chunk_at, chunk.data(), chunk.size(), stream);
    stream.synchronize();  // (the chunk is pageable and is refilled next)
    chunk.clear();
  };
  auto place = [&](std::uint64_t at, const std::vector<char>& data) {
    if (data.size() > kChunk) {  // goes over alone, from where it lies
      flush();
      backend.copy_to_device(static_cast<char*>(inputs_.data()) + at, data.data(), data.size(), stream);
      stream.synchronize();
      return;
    }
    if (!chunk.empty() && at + data.size() - chunk_at > kChunk) flush();
    if (chunk.empty()) chunk_at = at;
    chunk.resize(at - chunk_at);  // (the alignment gap)
    chunk.insert(chunk.end(), data.begin(), data.end());
  };
  for (size_t i = 0; i < net_.tensors.size(); ++i) {
    const NetTensor& t = net_.tensors[i];
    if (t.projects_qubit >= 0) {
      for (int bit = 0; bit < 2; ++bit)
        place(input_offset_[i][static_cast<size_t>(bit)], converted({bit ? 0.0 : 1.0, bit ? 1.0 : 0.0}, dtype_));
    } else {
      place(input_offset_[i][0], converted(permuted(t, resident_layout_[i].modes), dtype_));
    }
  }
  flush();
}

// The input's values in its resident layout (host, complex128), from its stored mode order.
std::vector<cd> Contractor::permuted(const NetTensor& t, const std::vector<Mode>& layout) const {
  if (layout == t.modes) return t.data;
  std::vector<cd> out(t.data.size());
  kernels::GatherPermute g;
  g.dtype = h5::DType::complex128;
  g.in = t.data.data();
  g.out = out.data();
  g.rank = static_cast<int>(layout.size());
  for (int j = 0; j < g.rank; ++j) {
    g.dims[j] = net_.extent.at(layout[static_cast<size_t>(j)]);
    g.strides[j] = stride_in(net_, t.modes, layout[static_cast<size_t>(j)]);
  }
  kernels::gather_permute_cpu(g);
  return out;
}

// Input tensor `id` of slice `slice` on the device, in its planned layout: the resident tensor (or
// the projection for its bit) from the slice's first element on. Sliced modes are the outermost
// of the resident layout, so the slice is the contiguous block that starts there.
char* Contractor::input_data(int id, std::uint64_t slice, const std::vector<std::uint8_t>& bits) {
  const auto& t = net_.tensors[static_cast<size_t>(id)];
  const std::uint64_t at =
      input_offset_[static_cast<size_t>(id)]
                   [t.projects_qubit >= 0 && bits.at(static_cast<size_t>(t.projects_qubit)) ? 1 : 0];
  // The slice number's mixed-radix digit of each sliced mode the input holds (the first sliced
  // mode is the most significant).
  std::int64_t offset = 0;
  for (auto [j, stride] : resident_layout_[static_cast<size_t>(id)].sliced) {
    const auto radix = static_cast<std::uint64_t>(slice_radix_[j]);
    offset += static_cast<std::int64_t>(slice / slice_place_[j] % radix) * stride;
  }
  return static_cast<char*>(inputs_.data()) + at + static_cast<std::uint64_t>(offset) * element_bytes();
}

// The step's block product C[L-run, R-run] = L[L-run, K] . R[R-run, K]^T, operands not yet set.
kernels::Gemm Contractor::step_gemm(const PlanStep& st) const {
  kernels::Gemm g;
  g.dtype = dtype_;
  g.m = st.m;
  g.n = st.n;
  g.k = st.k;
  g.lda = st.k;
  g.ldb = st.k;
  g.ldc = st.n;
  g.b_transposed = true;
  if (reduced_step(st)) {
    g.compute = compute_;
    g.workspace = staging_;
    g.workspace_bytes = static_cast<std::int64_t>(staging_size_);
  }
  return g;
}

bool Contractor::reduced_step(const PlanStep& st) const {
  if (compute_ == kernels::Compute::full || tropical() || st.execution == Execution::looped) return false;
  const double m = static_cast<double>(st.m), n = static_cast<double>(st.n), k = static_cast<double>(st.k);
  return m * n * k >= 32 * (m * k + n * k + m * n);
}

void Contractor::limit_staging(std::uint64_t bytes) {
  if (staging_bytes_ == 0) return;
  staging_bytes_ = std::min(staging_bytes_, std::max(bytes, static_cast<std::uint64_t>(kernels::kReducedGemmMinWorkspace)));
}

// What the step's products need to run in one piece, at most 1 GiB (larger products are tiled
// to fit: kernels/linalg/reduced_gemm.hpp; the slot's budget may cut it further). 3xTF32 holds
// its three products of C's tile beside the staged operands: a 4096^3 complex product needs 384
// MiB in one tile, and ran at 1.82x FP32 within 256 MiB against 2.02x in one tile (H100).
std::uint64_t Contractor::staging_for(const PlanStep& st) const {
  constexpr std::uint64_t kMaxStaging = std::uint64_t{1} << 30;
  if (!reduced_step(st)) return 0;
  kernels::Gemm g = step_gemm(st);
  g.compute = compute_;
  std::vector<LoopGroup> scratch;
  g.batch = st.execution == Execution::packed ? st.loops
            : st.loop_modes.empty()           ? 1
                                              : groups_of(st, scratch).front().extent;
  return std::min(static_cast<std::uint64_t>(kernels::reduced_gemm_workspace(g)), kMaxStaging);
}

// Copies `x` (laid out as `from`) into `to`'s layout at `dst`: both hold the same modes.
void Contractor::relayout(Stream& stream, const std::vector<Mode>& from, const char* x, const std::vector<Mode>& to,
                          char* dst) const {
  if (to.size() > static_cast<size_t>(kernels::kMaxRank))
    throw std::runtime_error("tn: a packed tensor has more modes than the gather kernel supports");
  kernels::GatherPermute g;
  g.dtype = dtype_;
  g.in = x;
  g.out = dst;
  g.rank = static_cast<int>(to.size());
  for (int j = 0; j < g.rank; ++j) {
    g.dims[j] = net_.extent.at(to[static_cast<size_t>(j)]);
    g.strides[j] = stride_in(net_, from, to[static_cast<size_t>(j)]);
  }
  kernels::gather_permute(stream, g);
}

// [batch | M | N] = [batch | M | K] . [batch | N | K]^T as one strided-batched GEMM, through the
// step's workspace wherever an operand's or the result's layout differs from those.
void Contractor::run_packed(Stream& stream, const PlanStep& st, char* arena, const std::vector<Mode>& L_modes,
                            const std::vector<Mode>& R_modes, const char* L, const char* R, char* c) {
  const auto layouts = packed_layouts(st);
  if (st.pack_l) {
    relayout(stream, L_modes, L, layouts.l, arena + st.pack_l_offset);
    L = arena + st.pack_l_offset;
  }
  if (st.pack_r) {
    relayout(stream, R_modes, R, layouts.r, arena + st.pack_r_offset);
    R = arena + st.pack_r_offset;
  }
  kernels::Gemm g = step_gemm(st);
  g.a = L;
  g.b = R;
  g.c = st.pack_c ? arena + st.pack_c_offset : c;
  g.batch = st.loops;
  g.stride_a = st.m * st.k;
  g.stride_b = st.n * st.k;
  g.stride_c = st.m * st.n;
  multiply(stream, g);
  if (st.pack_c) relayout(stream, layouts.c, arena + st.pack_c_offset, st.c_modes, c);
}

// All of the step's products in one kernel that walks the loop groups (none for a plain product).
const std::vector<LoopGroup>& Contractor::groups_of(const PlanStep& st, std::vector<LoopGroup>& scratch) const {
  const PlanStep* steps = plan_.steps.data();
  if (&st >= steps && &st < steps + plan_.steps.size()) return step_groups_[static_cast<size_t>(&st - steps)];
  scratch = loop_groups(net_, st);
  return scratch;
}

void Contractor::run_looped(Stream& stream, const PlanStep& st, const char* L, const char* R, char* c,
                            kernels::LoopedChain* chain) {
  std::vector<LoopGroup> scratch;
  const auto& groups = groups_of(st, scratch);
  kernels::LoopedGemm lg;
  lg.dtype = dtype_;
  lg.semiring = tropical() ? kernels::Semiring::tropical : kernels::Semiring::standard;
  lg.m = st.m;
  lg.n = st.n;
  lg.k = st.k;
  lg.a = L;
  lg.b = R;
  lg.c = c;
  lg.groups = static_cast<int>(groups.size());
  for (int d = 0; d < lg.groups; ++d) {
    const LoopGroup& o = groups[groups.size() - 1 - static_cast<size_t>(d)];  // outermost first
    lg.extent[d] = o.extent;
    lg.stride_a[d] = o.l;
    lg.stride_b[d] = o.r;
    lg.stride_c[d] = o.c;
  }
  if (chain)
    chain->push(lg);
  else
    kernels::looped_gemm(stream, lg);
}

// A product step_gemm made (with a strided batch, perhaps): BLAS, or in the tropical semiring the
// looped kernel with the batch as its one loop group.
void Contractor::multiply(Stream& stream, const kernels::Gemm& g) const {
  if (!tropical()) return kernels::gemm(stream, g);
  kernels::LoopedGemm lg;
  lg.dtype = dtype_;
  lg.semiring = kernels::Semiring::tropical;
  lg.m = g.m, lg.n = g.n, lg.k = g.k;
  lg.a = g.a, lg.b = g.b, lg.c = g.c;
  lg.groups = g.batch > 1 ? 1 : 0;
  lg.extent[0] = g.batch, lg.stride_a[0] = g.stride_a, lg.stride_b[0] = g.stride_b, lg.stride_c[0] = g.stride_c;
  kernels::looped_gemm(stream, lg);
}

Contractor::~Contractor() = default;

// A step with a tensor in the host arena, block by block over C's first block_modes modes, in
// the plan's block order: each block of a host operand is copied into its staging when it
// differs from the previous block's (an operand without block modes once), the block runs as a
// step of its own, and a host result's block is copied back. Blocks are contiguous ranges of
// every tensor (plan.hpp), so each copy is one transfer. Copies in and out run on the spill
// store's streams, ordered by recorded points: the next block comes in and the previous one goes
// out while a block computes, each in its own staging slot.
void Contractor::run_spilled(Stream& stream, const PlanStep& st, char* arena, std::uint64_t slice,
                             const std::vector<std::uint8_t>& bits) {
  const std::uint64_t e = element_bytes();
  const PlanStep block = block_view(st);
  struct Operand {
    const std::vector<Mode>& full;
    bool on_host, blocked;
    std::uint64_t offset;  // in the host arena (host tensors)
    char* device;          // the whole tensor (device tensors)
    char* stage;           // slot 0 of its staging (host tensors)
    std::uint64_t block_bytes, stride;
    int slots;
    std::int64_t fetched = 0;             // blocks copied in so far
    std::uint64_t last = ~std::uint64_t{0};  // the offset of the block copied in last
  };
  auto tensor = [&](const std::vector<Mode>& full, const std::vector<Mode>& in_block, bool on_host, int id,
                    bool persistent, std::uint64_t offset, std::uint64_t stage) {
    const bool blocked = full.size() != in_block.size();
    const auto bytes = static_cast<std::uint64_t>(net_.size_of(in_block)) * e;
    return Operand{full,  on_host, blocked, offset, tensor_at(id, persistent, offset, arena, slice, bits), arena + stage,
                   bytes, staging_stride(bytes), staging_slots(blocked, st.blocks)};
  };
  Operand a = tensor(st.a_modes, block.a_modes, st.a_host, st.a, st.a_persistent, st.a_offset, st.stage_a_offset);
  Operand b = tensor(st.b_modes, block.b_modes, st.b_host, st.b, st.b_persistent, st.b_offset, st.stage_b_offset);
  Operand c = tensor(st.c_modes, block.c_modes, st.c_host, st.c, st.c_persistent, st.c_offset, st.stage_c_offset);
  auto block_offset = [&](const Operand& x, std::int64_t blk) {  // bytes from x's start; the last mode runs fastest
    std::int64_t off = 0;
    for (size_t j = st.block_order.size(); j-- > 0;) {
      const std::int64_t extent = net_.extent.at(st.block_order[j]);
      off += (blk % extent) * stride_in(net_, x.full, st.block_order[j]);
      blk /= extent;
    }
    return static_cast<std::uint64_t>(off) * e;
  };
  auto slot = [](const Operand& x, std::int64_t n) { return x.stage + static_cast<std::uint64_t>(n % x.slots) * x.stride; };
  // Earlier steps' copies and results come first.
  spill_->fetches_wait(stream.record());
  std::vector<Stream::Point> computed(static_cast<size_t>(st.blocks)), copied_out(static_cast<size_t>(st.blocks));
  for (std::int64_t blk = 0; blk < st.blocks; ++blk) {
    // In: into a slot whose last block (blk - 2 at the latest) has been computed.
    if (blk >= 2) spill_->fetches_wait(computed[static_cast<size_t>(blk - 2)]);
    for (Operand* x : {&a, &b}) {
      const std::uint64_t at = block_offset(*x, blk);
      if (!x->on_host || at == x->last) continue;
      spill_->fetch(slot(*x, x->fetched++), x->offset + at, x->block_bytes);
      x->last = at;
    }
    stream.wait(spill_->fetched());
    // Compute: into a result slot whose block (blk - 2) has been copied out.
    if (c.on_host && blk >= 2) stream.wait(copied_out[static_cast<size_t>(blk - 2)]);
    auto operand = [&](const Operand& x) -> const char* {
      return x.on_host ? slot(x, x.fetched - 1) : x.device + block_offset(x, blk);
    };
    run_step_at(stream, block, operand(a), operand(b), c.on_host ? slot(c, blk) : c.device + block_offset(c, blk),
                arena, nullptr);
    computed[static_cast<size_t>(blk)] = stream.record();
    // Out.
    if (c.on_host) {
      spill_->stores_wait(computed[static_cast<size_t>(blk)]);
      spill_->store(c.offset + block_offset(c, blk), slot(c, blk), c.block_bytes);
      copied_out[static_cast<size_t>(blk)] = spill_->stored();
    }
  }
  stream.wait(spill_->stored());  // later steps read the result
}

// A device tensor of a step, tensor `id`: an input (where it is resident), or an intermediate at
// `offset` in the persistent region or in the arena.
char* Contractor::tensor_at(int id, bool persistent, std::uint64_t offset, char* arena, std::uint64_t slice,
                            const std::vector<std::uint8_t>& bits) {
  if (id < static_cast<int>(net_.tensors.size())) return input_data(id, slice, bits);
  return (persistent ? static_cast<char*>(persistent_.data()) : arena) + offset;
}

void Contractor::run_step(Stream& stream, const PlanStep& st, char* arena, std::uint64_t slice,
                          const std::vector<std::uint8_t>& bits, kernels::LoopedChain* chain) {
  if (st.spilled()) {
    if (chain) chain->flush();
    return run_spilled(stream, st, arena, slice, bits);
  }
  run_step_at(stream, st, tensor_at(st.a, st.a_persistent, st.a_offset, arena, slice, bits),
              tensor_at(st.b, st.b_persistent, st.b_offset, arena, slice, bits),
              tensor_at(st.c, st.c_persistent, st.c_offset, arena, slice, bits), arena, chain);
}

// Runs the step's products on operands at a and b into c; `arena` holds its packing workspace.
void Contractor::run_step_at(Stream& stream, const PlanStep& st, const char* a, const char* b, char* c, char* arena,
                             kernels::LoopedChain* chain) {
  const size_t e = element_bytes();
  const auto& L_modes = st.left_is_b ? st.b_modes : st.a_modes;
  const auto& R_modes = st.left_is_b ? st.a_modes : st.b_modes;
  const char* L = st.left_is_b ? b : a;
  const char* R = st.left_is_b ? a : b;
  // (Looped steps run in full single precision also under TF32. The tropical semiring has no
  // BLAS: its every product is a looped one, loops or not.)
  const bool looped = st.execution == Execution::looped || (tropical() && st.execution != Execution::packed);
  if (looped) return run_looped(stream, st, L, R, c, chain);
  if (chain) chain->flush();  // (what waits there may be this step's input)
  if (st.execution == Execution::packed) return run_packed(stream, st, arena, L_modes, R_modes, L, R, c);
  kernels::Gemm g = step_gemm(st);
  if (st.loop_modes.empty()) {
    g.a = L;
    g.b = R;
    g.c = c;
    kernels::gemm(stream, g);
    return;
  }
  // Loops over C's leading modes, merged into groups where their strides line up (innermost
  // first): the innermost group is a strided batch, a host loop runs over the others.
  std::vector<LoopGroup> scratch;
  const auto& groups = groups_of(st, scratch);
  using Loop = LoopGroup;
  g.batch = groups.front().extent;
  g.stride_a = groups.front().l;
  g.stride_b = groups.front().r;
  g.stride_c = groups.front().c;
  const std::vector<Loop> outer(groups.rbegin(), groups.rend() - 1);  // outermost first
  std::int64_t count = 1;
  for (const Loop& o : outer) count *= o.extent;
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t rest = i, off_l = 0, off_r = 0, off_c = 0;
    for (size_t j = outer.size(); j-- > 0;) {
      const std::int64_t idx = rest % outer[j].extent;
      rest /= outer[j].extent;
      off_l += idx * outer[j].l;
      off_r += idx * outer[j].r;
      off_c += idx * outer[j].c;
    }
    kernels::Gemm one = g;
    one.a = L + off_l * static_cast<std::int64_t>(e);
    one.b = R + off_r * static_cast<std::int64_t>(e);
    one.c = c + off_c * static_cast<std::int64_t>(e);
    kernels::gemm(stream, one);
  }
}

// Runs the steps that are invariant (the prologue) or those that are not (one slice), in the
// plan's order.
void Contractor::run_steps(Stream& stream, bool invariant, std::uint64_t slice, const std::vector<std::uint8_t>& bits,
                           char* arena, std::vector<double>* step_seconds) {
  // Small looped steps run chained, many a launch (kernels::LoopedChain); timed steps one by one.
  kernels::LoopedChain chain(stream);
  for (size_t s = 0; s < plan_.steps.size(); ++s) {
    const PlanStep& st = plan_.steps[s];
    if (st.invariant != invariant) continue;
    const auto start = std::chrono::steady_clock::now();
    run_step(stream, st, arena, slice, bits, step_seconds ? nullptr : &chain);
    if (step_seconds) {
      stream.synchronize();
      (*step_seconds)[s] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  chain.flush();
}

// What of a bitstring the prologue reads: the bits of the projections of invariant steps.
std::vector<std::uint8_t> Contractor::prologue_key(const std::vector<std::uint8_t>& bits) const {
  std::vector<std::uint8_t> key;
  for (int q : prologue_qubits_) key.push_back(bits.at(static_cast<size_t>(q)));
  return key;
}

// The invariant steps for `bits`, writing their persistent results. Slices queued on any stream
// still read the previous ones: the prologue waits for them.
void Contractor::run_prologue(Stream& stream, const std::vector<std::uint8_t>& bits, char* arena,
                              std::vector<double>* step_seconds) {
  for (const auto& [reader, last_slice] : persistent_readers_) stream.wait(last_slice);
  persistent_readers_.clear();
  // (Inputs of invariant steps hold no sliced mode: any slice number stages them alike.)
  run_steps(stream, true, 0, bits, arena, step_seconds);
  prologue_done_ = stream.record();
  prologue_key_ = prologue_key(bits);
  ++prologue_runs_;
}

// Copies the result (result_elements values at `result`) to the caller's buffer.
void Contractor::copy_out(Stream& stream, const char* result, void* out) const {
  kernels::GatherPermute copy;
  copy.dtype = dtype_;
  copy.in = result;
  copy.out = out;
  copy.rank = 1;
  copy.dims[0] = static_cast<std::int64_t>(result_elements_);
  copy.strides[0] = 1;
  kernels::gather_permute(stream, copy);
}

void Contractor::contract(Stream& stream, std::uint64_t slice, const std::vector<std::uint8_t>& bits, void* arena_ptr,
                          void* out, std::vector<double>* step_seconds) {
  char* arena = static_cast<char*>(arena_ptr);
  staging_ = arena + aligned(plan_.arena_bytes);
  staging_size_ = staging_bytes_;
  if (plan_.steps.empty()) {  // a single tensor: the result is that tensor, resident in output order
    copy_out(stream, input_data(0, slice, bits), out);
    return;
  }
  if (step_seconds) step_seconds->assign(plan_.steps.size(), 0.0);
  if (plan_.invariant_steps) {
    if (prologue_key_ != prologue_key(bits)) run_prologue(stream, bits, arena, step_seconds);
    stream.wait(prologue_done_);  // (it may have run on another slot's stream)
  }
  run_steps(stream, false, slice, bits, arena, step_seconds);
  if (plan_.persistent_bytes) persistent_readers_[&stream] = stream.record();
  copy_out(stream, arena + plan_.steps.back().c_offset, out);  // the root is in the arena
  // The host arena is shared by all work items: the next one may start only after this one.
  if (plan_.host_arena_bytes) stream.synchronize();
}

}  // namespace qstage::tn
