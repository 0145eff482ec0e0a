// The backends' pools (backend/memory_pool.hpp): what a pass gives back is handed to the next one,
// idle memory counts against the budget and is freed to make room, the peak is of memory in use.
#include <gtest/gtest.h>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "test_util.hpp"

using namespace qstage;

namespace {

void pools_reuse_and_respect_the_budget(Backend& be) {
  MemoryBudget& budget = be.device_budget();
  const std::uint64_t limit = budget.limit();
  be.release_idle();
  const auto before = be.pool_counts();
  void* first = nullptr;
  {
    Buffer a = be.alloc_device(limit / 2, "a");
    first = a.data();
    EXPECT_EQ(budget.in_use(), limit / 2);
  }
  // Given back: idle, still held, not in use.
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(budget.idle(), limit / 2);
  {
    // As much again: the same memory.
    Buffer b = be.alloc_device(limit / 2, "b");
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(budget.in_use(), limit / 2);
    EXPECT_EQ(budget.idle(), 0u);
  }
  const auto after = be.pool_counts();
  EXPECT_EQ(after.device_taken - before.device_taken, 2u);
  EXPECT_EQ(after.device_reused - before.device_reused, 1u);
  {
    // A little less: new memory, charged exactly (a larger block charged whole would take room a
    // plan that fills its budget counts on), beside the idle block.
    Buffer b = be.alloc_device(limit / 2 - 1000, "b");
    EXPECT_NE(b.data(), first);
    EXPECT_EQ(budget.in_use(), limit / 2 - 1000);
    EXPECT_EQ(budget.idle(), limit / 2);
  }
  EXPECT_EQ(budget.idle(), limit - 1000);
  be.release_idle();
  {
    Buffer a = be.alloc_device(limit / 2, "a");
    first = a.data();
  }
  {
    // Much less: new memory, while the idle block stays for a later user of its size.
    Buffer c = be.alloc_device(limit / 8, "c");
    EXPECT_NE(c.data(), first);
    EXPECT_EQ(budget.idle(), limit / 2);
    // More than fits beside the idle block: the idle block is freed to make room.
    Buffer d = be.alloc_device(limit / 2 + limit / 4, "d");
    EXPECT_EQ(budget.idle(), 0u);
    EXPECT_LE(budget.in_use(), limit);
    // More than the budget at all: refused as before.
    EXPECT_THROW(be.alloc_device(limit / 2, "e"), BudgetExceeded);
  }
  {
    // Memory a user allocates itself, charged to the budget: idle blocks make room for it too.
    be.release_idle();
    { Buffer f = be.alloc_device(limit / 2, "f"); }
    EXPECT_EQ(budget.idle(), limit / 2);
    const std::uint64_t in_use = budget.in_use();
    be.charge_device(limit - in_use, "own");
    EXPECT_EQ(budget.idle(), 0u);
    EXPECT_EQ(budget.in_use(), limit);
    EXPECT_THROW(be.charge_device(1, "more"), BudgetExceeded);
    budget.release(limit - in_use);
    { Buffer f = be.alloc_host(be.host_budget().limit() / 2, "f"); }
    be.charge_host(be.host_budget().limit(), "own");
    EXPECT_EQ(be.host_budget().idle(), 0u);
    be.host_budget().release(be.host_budget().limit());
    { Buffer f = be.alloc_device(limit / 4, "f"); }
  }
  budget.reset_peak();
  EXPECT_GT(budget.idle(), 0u);
  EXPECT_EQ(budget.peak(), 0u);  // idle memory is not in the peak
  // Kept until the step is over.
  be.release_idle();
  EXPECT_EQ(budget.idle(), 0u);
  // Streams: a stream given back is lent again.
  Stream* s1 = nullptr;
  void* native1 = nullptr;
  {
    auto s = be.make_stream(true);
    s1 = s.get();
    native1 = s->native();
  }
  {
    auto s = be.make_stream(true);
    EXPECT_EQ(s->native(), native1);  // (cpu: both null; cuda: the same cudaStream_t)
    if (be.kind() == BackendKind::cuda) EXPECT_NE(s->blas_handle(), nullptr);
  }
  (void)s1;
  be.release_idle();
  EXPECT_EQ(budget.idle(), 0u);
  EXPECT_EQ(be.host_budget().idle(), 0u);
}

}  // namespace

TEST(MemoryPool, ReusesWhatWasGivenBackWithinTheBudget) {
  auto be = detail::make_cpu_backend(64u << 20, 64u << 20);
  pools_reuse_and_respect_the_budget(*be);
}

TEST(MemoryPool, ReusesWhatWasGivenBackWithinTheBudgetOnTheGpu) {
  REQUIRE_GPU();
  auto be = make_backend({"cuda", 256u << 20, 256u << 20});
  pools_reuse_and_respect_the_budget(*be);
}

TEST(MemoryPool, AHoldChargesItsBudgetUntilItGoesAndMovesOnce) {
  auto be = detail::make_cpu_backend(64u << 20, 32u << 20);
  MemoryBudget& host = be->host_budget();
  MemoryBudget& device = be->device_budget();
  {
    BudgetHold a = be->hold_host(1000, "a");
    BudgetHold d = be->hold_device(3000, "d");
    EXPECT_EQ(host.in_use(), 1000u);
    EXPECT_EQ(device.in_use(), 3000u);
    BudgetHold b = std::move(a);  // (released once, by its new holder)
    EXPECT_EQ(a.bytes(), 0u);
    EXPECT_EQ(host.in_use(), 1000u);
    BudgetHold c = be->hold_host(500, "c");
    c = std::move(b);  // (c's own 500 released, b's 1000 kept)
    EXPECT_EQ(host.in_use(), 1000u);
    EXPECT_EQ(c.bytes(), 1000u);
    // more than the budget: refused, nothing held
    EXPECT_THROW((void)be->hold_host(32u << 20, "too much"), BudgetExceeded);
    EXPECT_EQ(host.in_use(), 1000u);
  }
  EXPECT_EQ(host.in_use(), 0u);
  EXPECT_EQ(device.in_use(), 0u);
  EXPECT_EQ(host.peak(), 1500u);
}
