#pragma once
// Executes a Plan on a backend. Inputs stay resident in the compute precision, permuted once at
// upload into their planned layout with their sliced modes outermost, so every step reads its
// input operands where they are (a slice of one is a contiguous block; a projection is the vector
// for its bit): per work item (a slice, and for amplitude networks a bitstring) only the steps'
// GEMMs run, into the arena offsets the plan assigned (copying operands per work item cost a
// kernel launch for about every second step of a circuit). Deterministic: fixed shapes, fixed
// order, no atomics.
//
// A plan with invariant steps (plan.hpp) runs them, the prologue, once per bitstring: into the
// persistent region this contractor owns, whenever a work item's bitstring is not the one whose
// results it holds (only the bits of projections the prologue reads count). Work items may run
// on several streams at once (the engine's slots): before the region changes, the new prologue
// waits for every slice queued so far that reads it, and slices wait for the prologue they read.
// Items grouped by bitstring (tn.contract's rows are bitstring-major) run each prologue once.
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "engine/spill_store.hpp"
#include "codec/codec.hpp"
#include "kernels/linalg/gemm.hpp"
#include "kernels/linalg/looped_gemm.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/plan.hpp"

namespace qstage::tn {

class Contractor {
 public:
  // dtype: complex64 or complex128 (the compute precision). compute: the arithmetic of complex64's
  // compute-bound products (reduced_step); other steps, and complex128, run in full precision.
  // Out-of-core steps keep their spilled intermediates in a spill store (engine/spill_store.hpp):
  // the plan's host arena in pinned memory, or with plan.scratch in a scratch file in
  // `scratch_dir`. compress_spilled: as codec streams in host memory instead (the store's coded
  // tier; complex64 only).
  Contractor(const Network& net, const Plan& plan, h5::DType dtype, kernels::Compute compute,
             std::filesystem::path scratch_dir = std::filesystem::temp_directory_path(),
             std::optional<codec::Settings> compress_spilled = std::nullopt);
  ~Contractor();

  std::uint64_t resident_bytes() const { return resident_bytes_; }  // device memory of the resident inputs
  // Device memory one work item needs (contract's `arena`): the plan's arena, then the staging
  // of the reduced-precision products (kernels/linalg/reduced_gemm.hpp; none in full precision).
  std::uint64_t work_bytes() const { return aligned(plan_.arena_bytes) + staging_bytes_; }
  std::uint64_t staging_bytes() const { return staging_bytes_; }
  // Staging of at most `bytes` (never below the products' minimum): they tile finer to fit.
  void limit_staging(std::uint64_t bytes);
  // Whether step st runs in the reduced mode: complex64, a BLAS step, and compute-bound enough
  // (m n k / (m k + n k + m n) >= 32, about where FP32 stops being memory-bound) for tensor
  // cores to pay; the memory-bound steps gain nothing and keep FP32's error.
  bool reduced_step(const PlanStep& st) const;
  kernels::Compute compute() const { return compute_; }
  // Device memory of the persistent region (the invariant steps' results the slices read), once
  // per contractor beside the arenas.
  std::uint64_t persistent_bytes() const { return plan_.persistent_bytes; }
  std::uint64_t result_elements() const { return result_elements_; }
  std::uint64_t element_bytes() const { return h5::dtype_size(dtype_); }
  // Device memory the spill store takes on top of the arena (its coded tier's workspace: 0
  // without compress_spilled or spilled steps).
  std::uint64_t spill_device_bytes(BackendKind kind) const;
  // Bytes of spilled blocks coded so far, and of their streams (0 without compress_spilled).
  std::uint64_t spilled_raw_bytes() const;
  std::uint64_t spilled_stored_bytes() const;
  // Prologues run so far (0 for plans without invariant steps).
  std::uint64_t prologue_runs() const { return prologue_runs_; }

  // Uploads the inputs and allocates the persistent region (on the I/O thread, before the pass).
  void upload(Backend& backend, Stream& stream);
  // Contracts slice `slice` with the projections set to `bits` (amplitude networks; else empty)
  // into `out` (device memory, result_elements values in the plan's output order). `arena` is
  // work_bytes() of device memory. Runs the prologue first (in `arena`, on `stream`) if the
  // persistent region holds another bitstring's, then the variant steps. If `step_seconds` is
  // given, synchronizes after every step and records the time of each (0 for steps not run).
  // Not thread-safe: one thread queues all work items.
  void contract(Stream& stream, std::uint64_t slice, const std::vector<std::uint8_t>& bits, void* arena, void* out,
                std::vector<double>* step_seconds);

 // For an executor that runs the plan's steps its own way (DistributedContractor): input tensor
  // `id` of slice `slice` with the projections set to `bits`, on the device in its planned layout
  // (after upload); and one step (local_step's, in core) on operands at a and b into c, with its
  // packing workspace at `workspace` and staging_for(local) bytes of staging at `staging`.
  const char* input(int id, std::uint64_t slice, const std::vector<std::uint8_t>& bits) {
    return input_data(id, slice, bits);
  }
  void run_local_step(Stream& stream, const PlanStep& local, const char* a, const char* b, char* c, char* workspace,
                      char* staging) {
    staging_ = staging;
    staging_size_ = staging_for(local);
    run_step_at(stream, local, a, b, c, workspace, nullptr);
  }
  // The staging step st's reduced products use (0 when it runs in full precision).
  std::uint64_t staging_for(const PlanStep& st) const;
  // x (device memory, layout `from`) copied into dst in layout `to`, whose modes are all in
  // `from` (fewer where x points at the block with the others fixed): one gather kernel.
  void relayout(Stream& stream, const std::vector<Mode>& from, const char* x, const std::vector<Mode>& to,
                char* dst) const;

 private:
  // An input tensor on the device: its sliced modes (in plan.sliced's order), then its planned
  // layout, so that each slice of it is a contiguous block in the layout its step reads.
  struct ResidentLayout {
    std::vector<Mode> modes;
    std::vector<std::pair<std::size_t, std::int64_t>> sliced;  // (index in plan.sliced, stride in `modes`)
  };
  std::vector<cd> permuted(const NetTensor& t, const std::vector<Mode>& layout) const;
  void run_prologue(Stream& stream, const std::vector<std::uint8_t>& bits, char* arena, std::vector<double>* step_seconds);
  void run_steps(Stream& stream, bool invariant, std::uint64_t slice, const std::vector<std::uint8_t>& bits, char* arena,
                 std::vector<double>* step_seconds);
  char* input_data(int id, std::uint64_t slice, const std::vector<std::uint8_t>& bits);
  char* tensor_at(int id, bool persistent, std::uint64_t offset, char* arena, std::uint64_t slice,
                  const std::vector<std::uint8_t>& bits);
  void copy_out(Stream& stream, const char* result, void* out) const;
  std::vector<std::uint8_t> prologue_key(const std::vector<std::uint8_t>& bits) const;
  // A step's products; its looped ones go through `chain` where one is given (small ones then
  // wait there to run together, kernels::LoopedChain), which runs what waits before any other
  // kernel of the step.
  void run_step(Stream& stream, const PlanStep& st, char* arena, std::uint64_t slice,
                const std::vector<std::uint8_t>& bits, kernels::LoopedChain* chain);
  void run_spilled(Stream& stream, const PlanStep& st, char* arena, std::uint64_t slice,
                   const std::vector<std::uint8_t>& bits);
  engine::SpillStore::Options spill_options() const;
  void run_step_at(Stream& stream, const PlanStep& st, const char* a, const char* b, char* c, char* arena,
                   kernels::LoopedChain* chain);
  kernels::Gemm step_gemm(const PlanStep& st) const;
  bool tropical() const { return net_.semiring == "tropical"; }
  void multiply(Stream& stream, const kernels::Gemm& g) const;
  void run_looped(Stream& stream, const PlanStep& st, const char* L, const char* R, char* c,
                  kernels::LoopedChain* chain);
  // st's loop groups: the plan's own steps' computed once (loop_groups() walks the network's
  // mode maps, host time that a circuit's hundreds of small steps paid on every run), a block
  // view's into `scratch`.
  const std::vector<LoopGroup>& groups_of(const PlanStep& st, std::vector<LoopGroup>& scratch) const;
  void run_packed(Stream& stream, const PlanStep& st, char* arena, const std::vector<Mode>& L_modes,
                  const std::vector<Mode>& R_modes, const char* L, const char* R, char* c);

  const Network& net_;
  const Plan& plan_;
  std::vector<std::vector<LoopGroup>> step_groups_;  // plan_.steps[s]'s loop groups
  h5::DType dtype_;
  static std::uint64_t aligned(std::uint64_t bytes) { return (bytes + 255) / 256 * 256; }
  kernels::Compute compute_;
  std::uint64_t staging_bytes_ = 0;
  char* staging_ = nullptr;  // the current work item's staging (set as it is queued), and its size
  std::uint64_t staging_size_ = 0;
  std::uint64_t result_elements_ = 1;
  std::vector<ResidentLayout> resident_layout_;  // per input tensor
  // Every input in one device region, uploaded in a few copies: one allocation and one copy per
  // tensor cost a circuit of 800 gates some 800 driver calls and waits per step.
  Buffer inputs_;
  std::vector<std::array<std::uint64_t, 2>>
      input_offset_;  // per input tensor: its place in inputs_ (projections: <0| and <1|)
  std::uint64_t resident_bytes_ = 0;  // inputs_'s size
  std::vector<std::int64_t> slice_radix_;
  std::vector<std::uint64_t> slice_place_;  // per sliced mode: the slice numbers one of its steps spans
  Backend* backend_ = nullptr;
  std::filesystem::path scratch_dir_;
  std::optional<codec::Settings> compress_spilled_;
  std::unique_ptr<engine::SpillStore> spill_;    // the plan's host arena (spilled intermediates)
  Buffer persistent_;                             // the invariant steps' results the slices read
  std::vector<int> prologue_qubits_;              // the qubits whose projections invariant steps read
  std::optional<std::vector<std::uint8_t>> prologue_key_;  // their bits in the prologue the region holds
  Stream::Point prologue_done_;                   // the end of that prologue, on the stream that ran it
  std::map<const Stream*, Stream::Point> persistent_readers_;  // per stream, its last slice since then
  std::uint64_t prologue_runs_ = 0;
};

}  // namespace qstage::tn
