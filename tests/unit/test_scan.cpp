// The scan and compaction primitives (kernels/scan.hpp): the CPU twins against a plain
// computation, through the cpu backend's dispatch, and (on a machine with a GPU) the CUDA
// versions against the CPU twins, bitwise, on sizes 0, 1, around a tile and several million.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/scan.hpp"
#include "test_util.hpp"

using namespace qstage;
using test::GpuRun;

namespace {

constexpr std::uint64_t kTile = kernels::detail::kScanTile;
const std::uint64_t kSizes[] = {0, 1, 7, 8, 9, kTile - 1, kTile, kTile + 1, 3 * kTile + 517, 5'000'003};

// Counts up to 2^32 (so that several million add up to far below the scan's 2^62), a third of them 0.
std::vector<std::uint64_t> random_counts(std::uint64_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::uint64_t> v(n);
  for (auto& c : v) c = gen() % 3 == 0 ? 0 : gen() >> 32;
  return v;
}

// Values in (-1, 1), with exact zeros, values at the threshold, NaN and infinities among them.
std::vector<float> random_values(std::uint64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) {
    const unsigned kind = gen() % 16;
    x = kind == 0 ? 0.0f : kind == 1 ? 0.5f : kind == 2 ? -0.5f : d(gen);
  }
  if (n > 3) {
    v[n / 3] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = std::numeric_limits<float>::infinity();
    v[n - 1] = -std::numeric_limits<float>::infinity();
  }
  return v;
}

// Host vectors go up and come back with one element more than they hold (no copy of 0 bytes).
template <typename T>
Buffer upload(GpuRun& gpu, std::vector<T> v) {
  v.emplace_back();
  return gpu.upload(v.data(), sizeof(T) * v.size());
}
template <typename T>
std::vector<T> download(GpuRun& gpu, const Buffer& b, std::size_t count) {
  auto v = gpu.download<T>(b, count + 1);
  v.pop_back();
  return v;
}
Buffer device(GpuRun& gpu, std::size_t bytes) { return gpu.backend->alloc_device(bytes + 8, "test"); }

bool same_bytes(const void* a, const void* b, std::size_t bytes) { return bytes == 0 || std::memcmp(a, b, bytes) == 0; }

// What one flag_above, scan, compact and expand give, as vectors.
struct Compaction {
  std::vector<std::uint8_t> bitmap;
  std::vector<std::uint64_t> counts, ranks;  // bytes + 1 each (the last count 0)
  std::vector<float> kept, expanded;         // expanded: stride 2, the odd entries left as they were
};

// On the cpu backend, through the dispatch.
Compaction compaction_on(Stream& s, const std::vector<float>& x, double t) {
  const std::uint64_t n = x.size(), bytes = (n + 7) / 8;
  Compaction c;
  c.bitmap.resize(bytes);
  c.counts.assign(bytes + 1, 0);
  c.ranks.resize(bytes + 1);
  std::vector<std::uint64_t> scratch(kernels::scan_scratch_words(bytes + 1));
  kernels::flag_above(s, x.data(), n, 1, t, c.bitmap.data(), c.counts.data());
  kernels::exclusive_scan(s, c.counts.data(), bytes + 1, c.ranks.data(), scratch.data());
  c.kept.resize(c.ranks[bytes]);
  kernels::compact(s, x.data(), n, 1, c.bitmap.data(), c.ranks.data(), c.kept.data());
  c.expanded.assign(2 * n, 7.0f);
  kernels::expand(s, c.kept.data(), n, 2, c.bitmap.data(), c.ranks.data(), c.expanded.data());
  return c;
}

// The same on the GPU, read back.
Compaction compaction_on(GpuRun& gpu, const std::vector<float>& x, double t) {
  const std::uint64_t n = x.size(), bytes = (n + 7) / 8;
  Stream& s = *gpu.stream;
  Buffer dx = upload(gpu, x), bitmap = device(gpu, bytes);
  Buffer counts = upload(gpu, std::vector<std::uint64_t>(bytes + 1, 0));  // (flag_above leaves the last one: 0)
  Buffer ranks = device(gpu, 8 * (bytes + 1)), scratch = device(gpu, 8 * kernels::scan_scratch_words(bytes + 1));
  kernels::flag_above(s, static_cast<const float*>(dx.data()), n, 1, t, static_cast<std::uint8_t*>(bitmap.data()),
                      static_cast<std::uint64_t*>(counts.data()));
  kernels::exclusive_scan(s, static_cast<const std::uint64_t*>(counts.data()), bytes + 1,
                          static_cast<std::uint64_t*>(ranks.data()), static_cast<std::uint64_t*>(scratch.data()));
  Compaction c;
  c.bitmap = download<std::uint8_t>(gpu, bitmap, bytes);
  c.counts = download<std::uint64_t>(gpu, counts, bytes + 1);
  c.ranks = download<std::uint64_t>(gpu, ranks, bytes + 1);
  Buffer kept = device(gpu, 4 * c.ranks[bytes]);
  kernels::compact(s, static_cast<const float*>(dx.data()), n, 1, static_cast<const std::uint8_t*>(bitmap.data()),
                   static_cast<const std::uint64_t*>(ranks.data()), static_cast<float*>(kept.data()));
  Buffer expanded = upload(gpu, std::vector<float>(2 * n, 7.0f));
  kernels::expand(s, static_cast<const float*>(kept.data()), n, 2, static_cast<const std::uint8_t*>(bitmap.data()),
                  static_cast<const std::uint64_t*>(ranks.data()), static_cast<float*>(expanded.data()));
  c.kept = download<float>(gpu, kept, c.ranks[bytes]);
  c.expanded = download<float>(gpu, expanded, 2 * n);
  return c;
}

}  // namespace

TEST(ScanCpu, ExclusiveScanIsThePlainRunningSum) {
  auto cpu = make_backend({"cpu", 0, 0, 0});
  auto stream = cpu->make_stream(false);
  for (std::uint64_t n : kSizes) {
    const auto counts = random_counts(n, 11 + static_cast<unsigned>(n));
    std::vector<std::uint64_t> offsets(n, 99), scratch(kernels::scan_scratch_words(n));
    kernels::exclusive_scan(*stream, counts.data(), n, offsets.data(), scratch.data());
    std::uint64_t sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(offsets[i], sum) << "n " << n << " i " << i;
      sum += counts[i];
    }
  }
  EXPECT_EQ(kernels::scan_scratch_words(0), 1u);
  EXPECT_EQ(kernels::scan_scratch_words(kTile), 2u);
  EXPECT_EQ(kernels::scan_scratch_words(kTile + 1), 3u);
}

TEST(ScanCpu, CompactionKeepsTheFlaggedItemsInOrderAndExpandPutsThemBack) {
  auto cpu = make_backend({"cpu", 0, 0, 0});
  auto stream = cpu->make_stream(false);
  const double t = 0.5;
  for (std::uint64_t n : kSizes) {
    const auto x = random_values(n, 5 + static_cast<unsigned>(n));
    const Compaction c = compaction_on(*stream, x, t);
    std::vector<float> kept;
    for (std::uint64_t i = 0; i < n; ++i) {
      const bool flagged = std::isnan(x[i]) || std::fabs(x[i]) > t;
      ASSERT_EQ((c.bitmap[i / 8] >> (i % 8)) & 1u, flagged ? 1u : 0u) << "n " << n << " i " << i;
      if (flagged) kept.push_back(x[i]);
      const float back = flagged ? x[i] : 0.0f;
      ASSERT_TRUE(same_bytes(&c.expanded[2 * i], &back, 4)) << "n " << n << " i " << i;
      ASSERT_EQ(c.expanded[2 * i + 1], 7.0f);
    }
    for (std::uint64_t j = 0; j < c.bitmap.size(); ++j)
      ASSERT_EQ(c.counts[j], static_cast<std::uint64_t>(std::popcount(c.bitmap[j])));
    ASSERT_EQ(c.ranks.back(), kept.size()) << "n " << n;
    ASSERT_TRUE(same_bytes(c.kept.data(), kept.data(), 4 * kept.size())) << "n " << n;
  }
}

TEST(ScanCpu, PopcountsAndTypedCompaction) {
  std::mt19937 gen(3);
  for (std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4099}}) {
    std::vector<std::uint8_t> bitmap(bytes);
    for (auto& b : bitmap) b = static_cast<std::uint8_t>(gen());
    std::vector<std::uint64_t> counts(bytes + 1, 99), ranks(bytes + 1);
    kernels::cpu::popcounts(bitmap.data(), bytes, counts.data());
    ASSERT_EQ(counts[bytes], 0u);
    kernels::cpu::exclusive_scan(counts.data(), bytes + 1, ranks.data());
    const std::uint64_t n = 8 * bytes;
    std::vector<std::uint64_t> x(n), kept(ranks[bytes]), back(n, 5);
    for (std::uint64_t i = 0; i < n; ++i) x[i] = gen() + (std::uint64_t{1} << 40);
    kernels::cpu::compact(x.data(), n, 1, bitmap.data(), ranks.data(), kept.data());
    kernels::cpu::expand(kept.data(), n, 1, bitmap.data(), ranks.data(), back.data());
    std::uint64_t k = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const bool flagged = (bitmap[i / 8] >> (i % 8)) & 1u;
      if (flagged) ASSERT_EQ(kept[k++], x[i]);
      ASSERT_EQ(back[i], flagged ? x[i] : 0u);
    }
    ASSERT_EQ(k, kept.size());
  }
}

TEST(ScanGpu, ExclusiveScanSameAsTheCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  for (std::uint64_t n : kSizes) {
    const auto counts = random_counts(n, 17 + static_cast<unsigned>(n));
    std::vector<std::uint64_t> expected(n);
    kernels::cpu::exclusive_scan(counts.data(), n, expected.data());
    Buffer dc = upload(gpu, counts), offsets = device(gpu, 8 * n);
    // The scratch filled with garbage: the scan zeroes it itself.
    Buffer scratch = upload(gpu, std::vector<std::uint64_t>(kernels::scan_scratch_words(n), ~std::uint64_t{0}));
    kernels::exclusive_scan(*gpu.stream, static_cast<const std::uint64_t*>(dc.data()), n,
                            static_cast<std::uint64_t*>(offsets.data()), static_cast<std::uint64_t*>(scratch.data()));
    EXPECT_EQ(download<std::uint64_t>(gpu, offsets, n), expected) << "n " << n;
  }
}

TEST(ScanGpu, CompactionSameAsTheCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  auto cpu = make_backend({"cpu", 0, 0, 0});
  auto stream = cpu->make_stream(false);
  for (std::uint64_t n : kSizes) {
    const auto x = random_values(n, 23 + static_cast<unsigned>(n));
    const Compaction want = compaction_on(*stream, x, 0.5), got = compaction_on(gpu, x, 0.5);
    EXPECT_EQ(got.bitmap, want.bitmap) << "n " << n;
    EXPECT_EQ(got.counts, want.counts) << "n " << n;
    EXPECT_EQ(got.ranks, want.ranks) << "n " << n;
    ASSERT_EQ(got.kept.size(), want.kept.size()) << "n " << n;
    EXPECT_TRUE(same_bytes(got.kept.data(), want.kept.data(), 4 * want.kept.size())) << "n " << n;
    EXPECT_TRUE(same_bytes(got.expanded.data(), want.expanded.data(), 4 * want.expanded.size())) << "n " << n;
  }
}

TEST(ScanGpu, PopcountsAndByteCompactionSameAsTheCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  std::mt19937 gen(8);
  for (std::uint64_t bytes : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4099}, std::uint64_t{700'001}}) {
    std::vector<std::uint8_t> bitmap(bytes);
    for (auto& b : bitmap) b = static_cast<std::uint8_t>(gen());
    std::vector<std::uint64_t> counts(bytes + 1), ranks(bytes + 1);
    kernels::cpu::popcounts(bitmap.data(), bytes, counts.data());
    kernels::cpu::exclusive_scan(counts.data(), bytes + 1, ranks.data());
    const std::uint64_t n = 8 * bytes;
    std::vector<std::uint8_t> x(n), kept(ranks[bytes]), back(n);
    for (auto& v : x) v = static_cast<std::uint8_t>(gen() | 1u);
    kernels::cpu::compact(x.data(), n, 1, bitmap.data(), ranks.data(), kept.data());
    kernels::cpu::expand(kept.data(), n, 1, bitmap.data(), ranks.data(), back.data());

    Buffer dbitmap = upload(gpu, bitmap), dx = upload(gpu, x);
    Buffer dcounts = device(gpu, 8 * (bytes + 1)), dranks = device(gpu, 8 * (bytes + 1));
    Buffer scratch = device(gpu, 8 * kernels::scan_scratch_words(bytes + 1));
    Buffer dkept = device(gpu, kept.size()), dback = device(gpu, n);
    const auto* b = static_cast<const std::uint8_t*>(dbitmap.data());
    const auto* r = static_cast<const std::uint64_t*>(dranks.data());
    kernels::popcounts(*gpu.stream, b, bytes, static_cast<std::uint64_t*>(dcounts.data()));
    kernels::exclusive_scan(*gpu.stream, static_cast<const std::uint64_t*>(dcounts.data()), bytes + 1,
                            static_cast<std::uint64_t*>(dranks.data()), static_cast<std::uint64_t*>(scratch.data()));
    kernels::compact(*gpu.stream, static_cast<const std::uint8_t*>(dx.data()), n, 1, b, r,
                     static_cast<std::uint8_t*>(dkept.data()));
    kernels::expand(*gpu.stream, static_cast<const std::uint8_t*>(dkept.data()), n, 1, b, r,
                    static_cast<std::uint8_t*>(dback.data()));
    EXPECT_EQ(download<std::uint64_t>(gpu, dcounts, bytes + 1), counts) << "bytes " << bytes;
    EXPECT_EQ(download<std::uint64_t>(gpu, dranks, bytes + 1), ranks) << "bytes " << bytes;
    EXPECT_EQ(download<std::uint8_t>(gpu, dkept, kept.size()), kept) << "bytes " << bytes;
    EXPECT_EQ(download<std::uint8_t>(gpu, dback, n), back) << "bytes " << bytes;
  }
}
