#pragma once
// What a backend keeps for reuse between passes: device memory, pinned host memory and streams
// (AMReX's The_Pinned_Arena and The_Device_Arena, in one mechanism).
//
// A stage of several passes (sci.solve's Davidson products, keys.dedup's sample sort) allocates
// the same slot buffers, resident data and streams for every pass. Fresh, each costs what the
// driver charges: pinning host memory runs at 1-2 GB/s, cudaFree waits for the whole device, a
// stream's cuBLAS handle takes milliseconds. The pools keep what a pass gave back and hand it to
// the next one that asks for about as much.
//
// Budgets: idle memory is real memory, so it counts against the budget (MemoryBudget::idle): an
// allocation that would not fit frees idle blocks first, largest first. The peak a budget
// reports is of memory in use, what the work needed; idle blocks are never in it.
// Lifetime: a step. What its passes give back stays idle for its next passes (sci.solve's
// iterations run the same five passes a few percent larger each time; pinning their buffers
// afresh took 0.2 s an iteration on an H200), and release_idle() frees it all (the runner, before
// every step). Idle memory never stands in the way: it is freed, largest first, for whatever
// would not fit beside it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"

namespace qstage::detail {

// Counters for a benchmark or a test: how often a request was served from idle memory.
struct PoolCounters {
  std::uint64_t taken = 0, reused = 0;
};

// One kind of memory: blocks from `allocate` (a backend's raw allocation: a Buffer charged to no
// budget that frees itself), charged to `budget` while in use and counted as its idle memory
// while pooled.
class MemoryPool {
 public:
  using Allocate = std::function<Buffer(std::size_t bytes, std::string_view what)>;
  // `quiesce` runs before a block given back is handed out again (cuda: the device's work is
  // done, as cudaFree would have waited for it).
  MemoryPool(MemoryBudget& budget, Allocate allocate, std::function<void()> quiesce = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // `bytes` for `what`: an idle block of exactly that size, else a new one (charged exactly, so a
  // plan that fills its budget fits). Throws BudgetExceeded (idle memory freed first) or
  // RuntimeFailure.
  Buffer take(std::size_t bytes, std::string_view what);
  // Frees idle blocks (the largest first) until `bytes` more fit the budget: for memory charged
  // to it outside the pool (Backend::charge_device, charge_host).
  void make_room(std::size_t bytes);
  void release_idle();
  PoolCounters counters() const;

 private:
  struct Block {
    std::shared_ptr<Buffer> memory;  // the raw allocation
  };
  struct State;  // the Buffers it handed out find it through a weak pointer (they may outlive it)
  void free_idle_until_fits(std::size_t bytes);  // (mutex held)
  void free_block(std::multimap<std::size_t, Block>::iterator it);  // (mutex held)
  std::shared_ptr<State> state_;
};

// Streams kept for reuse (with or without a BLAS handle): a returned stream's queued work stays
// ordered before whatever its next user enqueues. `lend` runs on a stream as it is handed out
// and `keep` as it comes back (cuda: a BLAS stream's workspace is taken from the device pool for
// each user and given back with the stream, so an idle stream holds no budgeted memory).
class StreamPool {
 public:
  using Make = std::function<std::unique_ptr<Stream>(bool with_blas)>;
  using Hook = std::function<void(Stream&, bool with_blas)>;
  StreamPool(Make make, Hook lend = {}, Hook keep = {});
  ~StreamPool();
  std::unique_ptr<Stream> take(bool with_blas);
  void release_idle();
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace qstage::detail
