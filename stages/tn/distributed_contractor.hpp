#pragma once
// Executes a plan with its distribution (seed 000 section IV-B; stages/tn/distribution.hpp) on P
// ranks at once: every rank runs every step, on its shard of the large intermediates.
//
// A tensor is either replicated (every rank holds all of it) or sharded over its distributed
// modes D: their values, flattened row-major in D's order, number E_D >= P *combos*, and rank r
// holds combos [E_D r / P, E_D (r + 1) / P) - one each when E_D = P. A rank keeps its combos one
// after the other, each in the tensor's layout with D left out (a slice of the tensor).
//
// A step of a use-chain computes its result sharded: for each combo the rank holds, the step
// with D fixed (plan.hpp's local_step), reading the chain's operand's slot for that combo and
// the replicated operand with D's values fixed (a contiguous block where D leads its layout, as
// the backward pass makes it at an activation; a gathered copy otherwise). activate shards over
// the leading prefix of the result's layout whose extents reach P, keep inherits D, redistribute
// reshards the result after the step to the prefix of its own layout, and after a chain's last
// step the result is gathered (replicated). Steps outside chains run replicated on every rank.
//
// Resharding is one all-to-all per round (a round per combo a rank receives: one when E_D = P):
// a sender's block for a destination combo is its slot with the new modes' values fixed - a
// contiguous range, because the new modes lead the layout (or are none, for a gather) - and
// the receiver's blocks, in sender order, form the tensor [old modes not kept | the rest], from
// which one gather writes the new slot. On cuda the all-to-all is NCCL's, on cpu MPI's
// (comm/communicator.hpp).
//
// The plan's invariant steps (plan.hpp: their results are the same in every slice) run once per
// bitstring: the results of theirs that variant steps read are kept, shard or replicated, while
// the slices of one bitstring run. The plan's arena offsets are not used: each tensor gets device memory of its own (its shard's) when it is made and gives it
// back when its step has read it, to a cache of buffers by power-of-two size that every later
// step and slice draws from (all work is on one stream, so a buffer given back may be reused by
// the next launch without waiting; cudaMalloc per tensor made a slice 10x slower). The device
// budget counts what the cache holds: the peak is the live shards and replicated tensors, each
// rounded up to a power of two, and the buffers of sizes not live at that moment.
//
// Out of core (a plan made with out_of_core: its distribution has a slot limit, so each rank holds
// several slots of a large tensor, each at most that size): a shard that does not fit what the
// device budget leaves (beside room for a few slots) is held in pinned host memory, and the ranks
// stream it through the device a slot at a time: a step copies the operand's slot in and its
// result's slot out; resharding copies the blocks it sends in and each received slot out. The
// copies are queued on the one stream, in order with the work (not overlapped with it). The
// plan's own host arena (tn.plan's spilling of the plan for P) is not used: the shards are what
// spills.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "stages/tn/contractor.hpp"
#include "stages/tn/distribution.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/plan.hpp"

namespace qstage::tn {

// How a tensor lies over the ranks.
struct Sharding {
  std::vector<Mode> modes;  // distributed modes, their combined index row-major in this order; empty: replicated
  std::int64_t combos = 1;  // product of their extents
  // The first combo rank r holds (r = P: the end).
  std::int64_t first(int rank, int ranks) const { return combos * rank / ranks; }
  bool replicated() const { return modes.empty(); }
};

// The distribution as the executor reads it from the plan file: per step its transition and
// distributed modes, and the last step of each chain (after which the result is gathered).
struct DistributedSchedule {
  int ranks = 1;
  std::uint64_t slot_bytes = ~std::uint64_t{0};  // DistributionOptions::slot_bytes (out of core)
  std::vector<Transition> transition;            // per step
  std::vector<std::vector<Mode>> distributed;    // per step: the result's distributed modes after it
  std::vector<bool> gathered;                    // per step: the last of a chain
  static DistributedSchedule from_json(const nlohmann::json& distribution);
};

// Measured per step (synchronised; one work item): its GEMMs, and its all-to-alls
// (redistribution and gather) with the bytes this rank sent.
struct StepTimes {
  std::vector<double> compute, comm;
  std::vector<std::uint64_t> sent_bytes;
  std::vector<std::uint8_t> on_host;  // per step: its result's shard held in host memory (out of core)
};

class DistributedContractor {
 public:
  // `plan`: the plan for P ranks (its steps and slices); `comm`: P ranks, this one among them.
  // Throws InputError for plans it cannot run (no steps, another rank count).
  DistributedContractor(const Network& net, Plan plan, DistributedSchedule schedule, h5::DType dtype, kernels::Compute compute,
                        comm::Communicator& comm);

  std::uint64_t result_elements() const { return contractor_->result_elements(); }
  std::uint64_t element_bytes() const { return contractor_->element_bytes(); }
  const Plan& plan() const { return plan_; }

  void upload(Backend& backend, Stream& stream);
  // Contracts slice `slice` for `bits` (collective: every rank calls it with the same arguments)
  // and returns the result on every rank (result_elements values, complex128, the plan's output
  // order). With `times`, synchronises around every step and all-to-all and records them.
  std::vector<cd> contract(Stream& stream, std::uint64_t slice, const std::vector<std::uint8_t>& bits, StepTimes* times);

 private:
  // Device buffers by power-of-two size, reused (above).
  class BufferCache {
   public:
    explicit BufferCache(bool host = false) : host_(host) {}  // host: pinned host memory (pinning per tensor cost seconds)
    Buffer take(Backend& backend, std::uint64_t bytes, const char* what);
    void give(Buffer buffer);
    std::uint64_t bytes() const;  // held (free) buffers' bytes
    static std::uint64_t rounded(std::uint64_t bytes);  // the size of the buffer take() gives for `bytes`
    void clear() { free_.clear(); }
   private:
    bool host_;
    std::multimap<std::uint64_t, Buffer> free_;
  };
  struct Held {               // a tensor as this rank holds it
    Buffer buffer;            // empty for an input (resident in the contractor)
    const char* data = nullptr;
    std::vector<Mode> layout;  // the whole tensor's layout
    Sharding sharding;
    bool on_host = false;      // a shard in pinned host memory (out of core)
  };
  Sharding sharded_over(const std::vector<Mode>& modes) const;
  std::map<Mode, std::int64_t> values_of(const Sharding& s, std::int64_t combo) const;
  Held reshard(Stream& stream, Held from, const Sharding& to, std::uint64_t& sent);
  const char* operand_for(Stream& stream, const Held& t, const Sharding& s, std::int64_t combo, Buffer& scratch);
  void ensure(Buffer& buffer, std::uint64_t bytes, const char* what);
  // Memory for `slots` slots of `slot` bytes: on the device, or (out of core, a shard that does
  // not fit what the device budget leaves) in pinned host memory; sets `on_host`.
  Buffer hold(std::int64_t slots, std::uint64_t slot, bool may_spill, const char* what, bool& on_host);
  void release(Held& t, Stream& stream);  // a tensor's memory back to its cache
  std::uint64_t bytes_of(const std::vector<Mode>& modes) const;

  const Network& net_;
  Plan plan_;
  DistributedSchedule schedule_;
  h5::DType dtype_;
  comm::Communicator& comm_;
  int rank_ = 0, ranks_ = 1;
  std::unique_ptr<Contractor> contractor_;
  Backend* backend_ = nullptr;
  BufferCache cache_, host_cache_{true};  // device buffers; pinned host memory of the shards held there
  std::vector<bool> invariant_;  // per step: the plan's invariant flag
  std::vector<bool> kept_;       // per step: invariant, and a variant step reads its result
  std::map<int, Held> kept_results_;  // those results (by tensor id), for the bitstring kept_bits_
  std::optional<std::vector<std::uint8_t>> kept_bits_;
  std::vector<std::optional<std::pair<PlanStep, std::uint64_t>>> local_;  // per step: local_step and its workspace bytes
  Buffer scratch_a_, scratch_b_, workspace_;  // gathered operands, packing workspace (grown as needed)
  Buffer staging_;                            // reduced-precision products' staging (grown as needed)
  Buffer stage_;  // a host-held result slot on its way out (out of core)
};

}  // namespace qstage::tn
