// The spill store (engine/spill_store.hpp) under tiny budgets, on the cpu backend: each tier
// gives back the bytes it was given (the coded tier exactly when lossless, else within the
// codec's bound), also when fetches cut the space into other ranges than the stores; a host
// budget too small for the space puts it in a scratch file; what a tier takes is charged to the
// budgets and released with the store; wrong use is a clear error. On a GPU the same round trips
// run through the store's own streams, ordered against the caller's by recorded points.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "engine/spill_store.hpp"
#include "codec/block_math.hpp"
#include "test_util.hpp"

namespace qstage::engine {
namespace {

using Tier = SpillStore::Tier;

constexpr std::uint64_t kBlock = 4096;  // bytes: 512 complex64 values

// Complex64 values in [-1, 1), as bytes (`bytes` a multiple of 8).
std::vector<char> random_values(std::uint64_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::complex<float>> values(bytes / 8);
  for (auto& v : values) v = {uniform(rng), uniform(rng)};
  std::vector<char> out(bytes);
  std::memcpy(out.data(), values.data(), bytes);
  return out;
}

SpillStore::Options options(std::uint64_t space, std::uint64_t block = kBlock) {
  SpillStore::Options o;
  o.owner = "test";
  o.space_bytes = space;
  o.largest_store_bytes = block;
  o.largest_fetch_bytes = 2 * block;
  return o;
}

// Moves host data through device memory, as a stage would: the caller's stream computes (here:
// uploads), the store copies out and in on its own streams, ordered by recorded points.
struct Device {
  Backend& backend;
  Stream& stream;
  Buffer staging;

  Device(Backend& b, Stream& s) : backend(b), stream(s), staging(b.alloc_device(2 * kBlock, "test: staging")) {}
  void store(SpillStore& store, std::uint64_t offset, const std::vector<char>& data, std::uint64_t from,
             std::uint64_t bytes) {
    backend.copy_to_device(staging.data(), data.data() + from, bytes, stream);
    store.stores_wait(stream.record());
    store.store(offset, staging.data(), bytes);
    stream.wait(store.stored());  // staging is reused
    stream.synchronize();
  }
  std::vector<char> fetch(SpillStore& store, std::uint64_t offset, std::uint64_t bytes) {
    store.fetches_wait(stream.record());
    store.fetch(staging.data(), offset, bytes);
    stream.wait(store.fetched());
    std::vector<char> out(bytes);
    backend.copy_to_host(out.data(), staging.data(), bytes, stream);
    stream.synchronize();
    return out;
  }
  // Stores `data` block by block from offset 0, then fetches it back in ranges of 1.5 blocks,
  // which straddle the stored blocks.
  std::vector<char> round_trip(SpillStore& s, const std::vector<char>& data) {
    for (std::uint64_t at = 0; at < data.size(); at += kBlock) store(s, at, data, at, kBlock);
    std::vector<char> back;
    for (std::uint64_t at = 0; at < data.size(); at += 3 * kBlock / 2) {
      const auto part = fetch(s, at, std::min<std::uint64_t>(3 * kBlock / 2, data.size() - at));
      back.insert(back.end(), part.begin(), part.end());
    }
    return back;
  }
};

struct Cpu {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Stream> stream;
  explicit Cpu(std::uint64_t host_limit, std::uint64_t device_limit = 1ull << 30)
      : backend(detail::make_cpu_backend(device_limit, host_limit)), stream(backend->make_stream(false)) {}
};

TEST(SpillStore, PinnedTierGivesBackTheBytesAndChargesTheHostBudget) {
  Cpu cpu(1ull << 20);
  const std::uint64_t space = 8 * kBlock;
  const auto data = random_values(space, 1);
  {
    Device device(*cpu.backend, *cpu.stream);
    SpillStore store(*cpu.backend, options(space));
    EXPECT_EQ(store.tier(), Tier::pinned);
    EXPECT_EQ(cpu.backend->host_budget().in_use(), space);
    EXPECT_EQ(device.round_trip(store, data), data);
    EXPECT_EQ(store.held_bytes(Tier::pinned), space);
    EXPECT_EQ(store.held_bytes(Tier::scratch), 0u);
    EXPECT_EQ(store.peak_host_bytes(), space);
    EXPECT_EQ(store.stored_raw_bytes(), space);
    EXPECT_EQ(store.stored_kept_bytes(), space);
  }
  EXPECT_EQ(cpu.backend->host_budget().in_use(), 0u) << "released with the store";
}

TEST(SpillStore, TinyHostBudgetPutsTheSpaceInAScratchFile) {
  // 16 KiB of host memory: the bounce buffers (one block in, two out) fit, the 256 KiB space does not.
  Cpu cpu(16 * 1024);
  const std::uint64_t space = 64 * kBlock;
  const auto data = random_values(space, 2);
  test::TempDir dir;
  {
    Device device(*cpu.backend, *cpu.stream);
    SpillStore::Options o = options(space);
    o.scratch_dir = dir.path;
    SpillStore store(*cpu.backend, o);
    EXPECT_EQ(store.tier(), Tier::scratch);
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()), 1) << "one scratch file";
    EXPECT_EQ(cpu.backend->host_budget().in_use(), 3 * kBlock) << "only the bounce buffers";
    EXPECT_EQ(device.round_trip(store, data), data);
    EXPECT_EQ(store.held_bytes(Tier::scratch), space);
    EXPECT_EQ(store.held_bytes(Tier::pinned), 0u);
    EXPECT_EQ(store.peak_host_bytes(), 3 * kBlock);
  }
  EXPECT_EQ(cpu.backend->host_budget().in_use(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "the scratch file goes with the store";
}

TEST(SpillStore, HostShareBelowTheSpaceAlsoPicksTheScratchTier) {
  Cpu cpu(1ull << 30);
  test::TempDir dir;
  SpillStore::Options o = options(4 * kBlock);
  o.host_share = 4 * kBlock - 1;
  o.scratch_dir = dir.path;
  EXPECT_EQ(SpillStore(*cpu.backend, o).tier(), Tier::scratch);
  o.host_share = 4 * kBlock;
  EXPECT_EQ(SpillStore(*cpu.backend, o).tier(), Tier::pinned);
}

TEST(SpillStore, LosslessCodedTierGivesBackTheBytesAndChargesOnlyItsStreams) {
  Cpu cpu(1ull << 20);
  const std::uint64_t space = 16 * kBlock;
  const auto data = random_values(space, 3);
  SpillStore::Options o = options(space);
  o.coded = codec::Settings{codec::Pipeline::szx, 256, 0.0, 0.0, true};  // error 0: every bit kept
  const std::uint64_t device_bytes = SpillStore::device_bytes(BackendKind::cpu, o);
  EXPECT_GT(device_bytes, kBlock);
  EXPECT_EQ(SpillStore::device_bytes(BackendKind::cpu, options(space)), 0u) << "only the coded tier needs device memory";
  {
    Device device(*cpu.backend, *cpu.stream);
    const std::uint64_t device_before = cpu.backend->device_budget().in_use();
    SpillStore store(*cpu.backend, o);
    EXPECT_EQ(store.tier(), Tier::coded);
    EXPECT_EQ(cpu.backend->device_budget().in_use() - device_before, device_bytes);
    EXPECT_EQ(cpu.backend->host_budget().in_use(), 0u) << "no host arena";
    EXPECT_EQ(device.round_trip(store, data), data);
    EXPECT_EQ(store.stored_raw_bytes(), space);
    EXPECT_EQ(store.held_bytes(Tier::coded), store.stored_kept_bytes());
    EXPECT_EQ(cpu.backend->host_budget().in_use(), store.held_bytes(Tier::coded));
    EXPECT_EQ(store.peak_host_bytes(), store.held_bytes(Tier::coded));
    // A store replaces the streams it overlaps: one block over two halves leaves the others.
    const std::uint64_t before = store.held_bytes(Tier::coded);
    device.store(store, kBlock / 2, data, 0, kBlock);
    EXPECT_LT(store.held_bytes(Tier::coded), before);
    EXPECT_EQ(cpu.backend->host_budget().in_use(), store.held_bytes(Tier::coded));
    EXPECT_EQ(store.peak_host_bytes(), before);
    EXPECT_EQ(device.fetch(store, kBlock / 2, kBlock), std::vector<char>(data.begin(), data.begin() + kBlock));
    EXPECT_EQ(device.fetch(store, 2 * kBlock, kBlock), std::vector<char>(data.begin() + 2 * kBlock, data.begin() + 3 * kBlock));
  }
  EXPECT_EQ(cpu.backend->host_budget().in_use(), 0u);
  EXPECT_EQ(cpu.backend->device_budget().in_use(), 0u);
}

TEST(SpillStore, LossyCodedTierKeepsTheCodecsBound) {
  Cpu cpu(1ull << 20);
  const std::uint64_t space = 16 * kBlock;
  const auto data = random_values(space, 4);
  SpillStore::Options o = options(space);
  const double error = 1e-3;
  o.coded = codec::Settings{codec::Pipeline::szx, 256, 0.0, error, false};  // absolute bound
  Device device(*cpu.backend, *cpu.stream);
  SpillStore store(*cpu.backend, o);
  const auto back = device.round_trip(store, data);
  ASSERT_EQ(back.size(), data.size());
  const auto* x = reinterpret_cast<const float*>(data.data());
  const auto* y = reinterpret_cast<const float*>(back.data());
  int outside = 0;
  for (std::uint64_t i = 0; i < space / 4; ++i)
    outside += std::abs(static_cast<double>(y[i]) - x[i]) > codec::detail::allowed_error(x[i], -1.0, error);
  EXPECT_EQ(outside, 0);
  EXPECT_LT(store.stored_kept_bytes(), store.stored_raw_bytes()) << "a lossy bound codes random values smaller";
}

TEST(SpillStore, WrongUseIsAClearError) {
  Cpu cpu(1ull << 20);
  Device device(*cpu.backend, *cpu.stream);
  const auto data = random_values(4 * kBlock, 5);
  SpillStore::Options coded = options(4 * kBlock);
  coded.coded = codec::Settings{codec::Pipeline::szx, 256, 0.0, 0.0, true};
  for (const SpillStore::Options& o : {options(4 * kBlock), coded}) {
    SpillStore store(*cpu.backend, o);
    const std::string tier = SpillStore::tier_name(store.tier());
    // A range never stored, or stored only in part.
    try {
      device.fetch(store, 0, kBlock);
      ADD_FAILURE() << tier << ": a fetch of a range never stored succeeded";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("must be stored before it is fetched"), std::string::npos) << e.what();
    }
    device.store(store, 0, data, 0, kBlock);
    EXPECT_THROW(device.fetch(store, kBlock / 2, kBlock), std::logic_error) << tier;
    EXPECT_NO_THROW(device.fetch(store, kBlock / 2, kBlock / 2)) << tier;
    // Outside the space.
    try {
      device.store(store, 4 * kBlock - 8, data, 0, 16);
      ADD_FAILURE() << tier << ": a store beyond the space succeeded";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("outside the spill store"), std::string::npos) << e.what();
    }
  }
  // Too large for the host budget, and no scratch file allowed.
  Cpu tiny(16 * 1024);
  try {
    SpillStore store(*tiny.backend, options(64 * kBlock));
    ADD_FAILURE() << "a space beyond the host budget was taken without a scratch folder";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no scratch folder"), std::string::npos) << e.what();
  }
  // Coded streams beyond the host budget: the budget refuses the charge.
  Cpu no_host(16);
  Device device2(*no_host.backend, *no_host.stream);
  SpillStore store(*no_host.backend, coded);
  EXPECT_THROW(device2.store(store, 0, data, 0, kBlock), RuntimeFailure);
  EXPECT_EQ(no_host.backend->host_budget().in_use(), 0u);
}

TEST(SpillStore, ScratchFileInAFolderThatIsNotThereIsAClearError) {
  Cpu cpu(16 * 1024);
  test::TempDir dir;
  SpillStore::Options o = options(64 * kBlock);
  o.scratch_dir = dir.path / "no-such-folder";
  try {
    SpillStore store(*cpu.backend, o);
    ADD_FAILURE() << "a scratch file in a missing folder";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create the scratch file"), std::string::npos) << e.what();
  }
}

// On a GPU: every tier's round trip through the store's own streams (copies asynchronous,
// ordered by events), the coded tier through the GPU coder.
TEST(SpillStore, EveryTierOnTheGpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  test::TempDir dir;
  const std::uint64_t space = 16 * kBlock;
  const auto data = random_values(space, 6);
  SpillStore::Options scratch = options(space);
  scratch.host_share = 0;
  scratch.scratch_dir = dir.path;
  SpillStore::Options coded = options(space);
  coded.coded = codec::Settings{codec::Pipeline::szx, 256, 0.0, 0.0, true};
  for (const SpillStore::Options& o : {options(space), scratch, coded}) {
    Device device(*gpu.backend, *gpu.stream);
    SpillStore store(*gpu.backend, o);
    EXPECT_EQ(device.round_trip(store, data), data) << SpillStore::tier_name(store.tier());
  }
}

}  // namespace
}  // namespace qstage::engine
