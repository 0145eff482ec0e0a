// The streaming engine on the cpu backend: datasets far larger than the device budget, results
// independent of batch size, stop + resume equal to an uninterrupted run, merged checkpoints.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/mpi.hpp"
#include "core/signals.hpp"
#include "engine/partition.hpp"
#include "engine/stream_engine.hpp"
#include "io/h5.hpp"
#include "kernels/checksum.hpp"
#include "test_util.hpp"

using namespace qstage;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t kCols = 16;

// y[r][c] = 2 x[r][c] + r, and per tile the sum of y (in double, row order within the tile).
class AffineKernel final : public engine::PassKernel {
 public:
  explicit AffineKernel(std::uint64_t tile_rows, std::int64_t stop_at_batch = -1)
      : tile_rows_(tile_rows), stop_at_(stop_at_batch) {}
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const float*>(b.inputs[0]);
    auto* y = static_cast<float*>(b.outputs[0]);
    auto* partial = static_cast<double*>(b.partials);
    for (std::uint64_t r = 0; r < b.rows.size(); ++r) {
      if (r % tile_rows_ == 0) partial[r / tile_rows_] = 0;
      for (std::uint64_t c = 0; c < kCols; ++c) {
        y[r * kCols + c] = 2 * x[r * kCols + c] + static_cast<float>(b.rows.begin + r);
        partial[r / tile_rows_] += y[r * kCols + c];
      }
    }
    ++batches;
    if (stop_at_ >= 0 && static_cast<std::int64_t>(b.index) == stop_at_) signals::request_stop(SIGTERM);
  }
  int batches = 0;

 private:
  std::uint64_t tile_rows_;
  std::int64_t stop_at_;
};

// Folds tile sums with a Kahan-free plain sum: order matters, which is the point of the test.
class SumReduction final : public engine::Reduction {
 public:
  void fold(const std::byte* tile) override {
    double v;
    std::memcpy(&v, tile, sizeof v);
    sum += v;
    ++tiles;
  }
  std::string save() const override {
    std::string s(16, '\0');
    std::memcpy(s.data(), &sum, 8);
    std::memcpy(s.data() + 8, &tiles, 8);
    return s;
  }
  void load(const std::string& s) override {
    std::memcpy(&sum, s.data(), 8);
    std::memcpy(&tiles, s.data() + 8, 8);
  }
  double sum = 0;
  std::uint64_t tiles = 0;
};

struct Fixture {
  test::TempDir dir;
  std::uint64_t rows;
  std::vector<float> x;
  h5::File input_file;
  h5::Dataset input;

  explicit Fixture(std::uint64_t rows_) : rows(rows_), x(rows_ * kCols) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) * 0.001f - 0.5f;
    {
      h5::File f = h5::File::create(dir.path / "x.h5");
      f.create_dataset("x", {h5::DType::float32, {rows, kCols}, {256, kCols}, false}).write_all(x.data());
      f.close();
    }
    input_file = h5::File::open(dir.path / "x.h5", h5::Mode::read_only);
    input = input_file.open_dataset("x");
  }

  engine::PassSpec spec() const {
    engine::PassSpec s;
    s.rows = rows;
    s.tile_rows = 512;
    s.inputs.push_back({"x", &input, kCols * 4});
    s.outputs.push_back({"y", h5::DType::float32, {rows, kCols}, {256, kCols}});
    s.tile_partial_bytes = sizeof(double);
    return s;
  }

  std::vector<float> expected() const {
    std::vector<float> y(x.size());
    for (std::uint64_t r = 0; r < rows; ++r)
      for (std::uint64_t c = 0; c < kCols; ++c) y[r * kCols + c] = 2 * x[r * kCols + c] + static_cast<float>(r);
    return y;
  }
};

struct Result {
  engine::PassOutcome outcome;
  std::vector<float> y;
  SumReduction reduction;
  std::uint64_t peak_device = 0;
  int batches = 0;
};

Result run_pass(Fixture& fx, std::uint64_t device_budget, std::optional<double> checkpoint, const std::string& name,
                std::int64_t stop_at = -1, bool fresh = true) {
  auto backend = detail::make_cpu_backend(device_budget, 1ull << 30);
  mpi::Comm comm;
  engine::EngineOptions options;
  options.checkpoint_seconds = checkpoint;
  engine::StreamEngine engine(*backend, comm, options);
  const fs::path work_dir = fx.dir.path / ("work-" + name), output = fx.dir.path / (name + ".h5");
  if (fresh) fs::remove_all(work_dir);
  engine::StepWork work(work_dir, "key-" + name, comm);
  auto spec = fx.spec();
  AffineKernel kernel(spec.tile_rows, stop_at);
  Result r;
  r.outcome = engine.run(spec, kernel, &r.reduction, work, output,
                         [](h5::File& f, const engine::Journal&) { f.set_attribute("annotated", "yes"); }, nullptr);
  r.peak_device = backend->device_budget().peak();
  r.batches = kernel.batches;
  if (r.outcome.complete) {
    h5::File f = h5::File::open(output, h5::Mode::read_only);
    EXPECT_EQ(f.string_attribute("annotated"), "yes");
    r.y.resize(fx.x.size());
    f.open_dataset("y").read_all(r.y.data());
  }
  return r;
}

std::uint64_t qsum(const std::vector<float>& v) {
  std::uint64_t s = 0;
  kernels::checksum_cpu({v.data(), v.size() * 4, 4, 0, &s});
  return s;
}

}  // namespace

TEST(Engine, StreamsTenTimesTheDeviceBudget) {
  Fixture fx(1u << 16);  // 4 MiB in + 4 MiB out
  const std::uint64_t budget = 768u << 10;  // 0.75 MiB: the data is more than ten times larger
  ASSERT_GT(2 * fx.rows * kCols * 4, 10 * budget);
  Result r = run_pass(fx, budget, std::nullopt, "big");
  ASSERT_TRUE(r.outcome.complete);
  EXPECT_EQ(r.y, fx.expected());
  EXPECT_EQ(r.outcome.journal.checksums.at(0), qsum(fx.expected()));
  EXPECT_LE(r.peak_device, budget);
  EXPECT_GT(r.peak_device, 0u);
  EXPECT_GE(r.batches, 10);
  EXPECT_EQ(r.reduction.tiles, fx.rows / 512);
}

TEST(Engine, ResultsDoNotDependOnBatchSize) {
  Fixture fx(20000);  // not a multiple of the tile: the last batch is short
  Result small = run_pass(fx, 700u << 10, std::nullopt, "small");
  Result large = run_pass(fx, 8u << 20, std::nullopt, "large");
  ASSERT_TRUE(small.outcome.complete && large.outcome.complete);
  EXPECT_LT(small.outcome.plan.batch_rows, large.outcome.plan.batch_rows);
  EXPECT_EQ(small.y, large.y);
  EXPECT_EQ(small.outcome.journal.checksums, large.outcome.journal.checksums);
  // Bitwise: the fold runs over tiles in tile order whatever the batches were.
  EXPECT_EQ(std::memcmp(&small.reduction.sum, &large.reduction.sum, 8), 0);
}

TEST(Engine, StopCommitsAndResumeEqualsUninterrupted) {
  Fixture fx(30000);
  Result clean = run_pass(fx, 700u << 10, std::nullopt, "clean");
  ASSERT_TRUE(clean.outcome.complete);

  signals::request_stop(0);
  Result first = run_pass(fx, 700u << 10, 60.0, "resumed", /*stop_at=*/3);
  signals::request_stop(0);
  ASSERT_FALSE(first.outcome.complete);
  EXPECT_GT(first.outcome.journal.committed_rows, 0u);
  EXPECT_LT(first.outcome.journal.committed_rows, fx.rows);
  EXPECT_FALSE(fs::exists(fx.dir.path / "resumed.h5"));

  Result second = run_pass(fx, 700u << 10, 60.0, "resumed", -1, /*fresh=*/false);
  ASSERT_TRUE(second.outcome.complete);
  EXPECT_EQ(second.outcome.resumed_from, first.outcome.journal.committed_rows);
  EXPECT_EQ(second.outcome.journal.attempts, 2);
  // Only the rows after the commit were processed again.
  EXPECT_LT(second.outcome.rows_run, fx.rows);
  EXPECT_EQ(second.y, clean.y);
  EXPECT_EQ(second.outcome.journal.checksums, clean.outcome.journal.checksums);
  EXPECT_EQ(std::memcmp(&second.reduction.sum, &clean.reduction.sum, 8), 0);
  EXPECT_FALSE(fs::exists(fx.dir.path / "work-resumed" / "seg-000000.h5.tmp"));
}

TEST(Engine, CheckpointEveryRoundMergesSegments) {
  Fixture fx(12000);
  Result every = run_pass(fx, 700u << 10, 0.0, "every");
  ASSERT_TRUE(every.outcome.complete);
  EXPECT_GT(every.outcome.journal.segments.size(), 2u);
  EXPECT_EQ(every.y, fx.expected());
  EXPECT_EQ(every.outcome.journal.checksums.at(0), qsum(fx.expected()));
}

TEST(Engine, ForeignJournalIsDiscarded) {
  Fixture fx(4096);
  const fs::path work = fx.dir.path / "work-foreign";
  fs::create_directories(work);
  test::write_text(work / "journal.json", R"({"key":"other","rows":1,"tile_rows":1,"committed_rows":1,"segments":[],)"
                                          R"("checksums":["0000000000000000"],"reduction":""})");
  test::write_text(work / "seg-000007.h5.tmp", "half-written garbage");
  Result r = run_pass(fx, 700u << 10, std::nullopt, "foreign", -1, /*fresh=*/false);
  ASSERT_TRUE(r.outcome.complete);
  EXPECT_EQ(r.outcome.resumed_from, 0u);
  EXPECT_EQ(r.y, fx.expected());
  EXPECT_FALSE(fs::exists(work / "seg-000007.h5.tmp"));
}

TEST(Engine, BudgetTooSmallForOneBatchIsInputError) {
  Fixture fx(4096);
  auto backend = detail::make_cpu_backend(64u << 10, 1ull << 30);
  mpi::Comm comm;
  engine::StreamEngine engine(*backend, comm, {});
  try {
    engine.plan(fx.spec());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--device-memory"), std::string::npos) << what;
    EXPECT_NE(what.find("too small"), std::string::npos) << what;
  }
  auto host_starved = detail::make_cpu_backend(1ull << 30, 64u << 10);
  engine::StreamEngine engine2(*host_starved, comm, {});
  EXPECT_THROW(engine2.plan(fx.spec()), InputError);
}

// ------------------------------------------------------------------------------ key ranges
namespace {

// Per batch: {count, sum of keys}, one partial.
class KeySumKernel final : public engine::PassKernel {
 public:
  explicit KeySumKernel(std::int64_t stop_at = -1) : stop_at_(stop_at) {}
  void process(const engine::BatchView& b) override {
    const auto* keys = static_cast<const std::uint64_t*>(b.inputs[0]);
    std::uint64_t out[2] = {b.rows.size(), 0};
    for (std::uint64_t i = 0; i < b.rows.size(); ++i) out[1] += keys[i];
    std::memcpy(b.partials, out, sizeof out);
    if (stop_at_ >= 0 && static_cast<std::int64_t>(b.index) == stop_at_) signals::request_stop(SIGTERM);
  }

 private:
  std::int64_t stop_at_;
};

class ListReduction final : public engine::Reduction {
 public:
  void fold(const std::byte* p) override {
    std::uint64_t v[2];
    std::memcpy(v, p, sizeof v);
    list.push_back({v[0], v[1]});
  }
  std::string save() const override {
    return std::string(reinterpret_cast<const char*>(list.data()), list.size() * sizeof(list[0]));
  }
  void load(const std::string& s) override {
    list.resize(s.size() / sizeof(list[0]));
    std::memcpy(list.data(), s.data(), s.size());
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> list;
};

}  // namespace

TEST(Engine, KeyRangeBatchesFromSortedKeys) {
  test::TempDir dir;
  const std::uint64_t n = 10000;
  std::vector<std::uint64_t> keys(n);
  for (std::uint64_t i = 0; i < n; ++i) keys[i] = i / 3;  // sorted, with duplicates
  {
    h5::File f = h5::File::create(dir.path / "keys.h5");
    f.create_dataset("keys", {h5::DType::uint64, {n}, {512}, false}).write_all(keys.data());
    f.close();
  }
  h5::File f = h5::File::open(dir.path / "keys.h5", h5::Mode::read_only);
  h5::Dataset d = f.open_dataset("keys");
  const auto ranges = engine::key_range_batches(d, {100, 101, 2000, 2500, 99999});
  ASSERT_EQ(ranges.size(), 5u);
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> want_ranges = {
      {0, 300}, {300, 303}, {303, 6000}, {6000, 7500}, {7500, 10000}};
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].begin, want_ranges[i].first);
    EXPECT_EQ(ranges[i].end, want_ranges[i].second);
  }

  engine::PassSpec spec;
  spec.rows = n;
  spec.tile_rows = 512;
  spec.inputs.push_back({"keys", &d, 8});
  spec.tile_partial_bytes = 16;
  spec.batches = ranges;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> want;
  for (const auto& r : ranges) {
    std::uint64_t sum = 0;
    for (auto i = r.begin; i < r.end; ++i) sum += keys[i];
    want.push_back({r.size(), sum});
  }

  auto run = [&](std::uint64_t budget, const char* name, std::int64_t stop_at, bool fresh) {
    auto backend = detail::make_cpu_backend(budget, 1ull << 30);
    mpi::Comm comm;
    engine::EngineOptions options;
    options.checkpoint_seconds = 0.0;
    engine::StreamEngine engine(*backend, comm, options);
    if (fresh) fs::remove_all(dir.path / name);
    engine::StepWork work(dir.path / name, name, comm);
    KeySumKernel kernel(stop_at);
    ListReduction reduction;
    auto outcome = engine.run(spec, kernel, &reduction, work, dir.path / (std::string(name) + ".h5"),
                              [](h5::File&, const engine::Journal&) {}, nullptr);
    return std::make_pair(outcome, reduction.list);
  };
  // The batches are the key ranges whatever the budget.
  EXPECT_EQ(run(1u << 20, "roomy", -1, true).second, want);
  EXPECT_EQ(run(200u << 10, "tight", -1, true).second, want);
  // Stop after the third batch, resume: the fold continues where the journal left it.
  signals::request_stop(0);
  auto first = run(1u << 20, "stopped", 2, true);
  signals::request_stop(0);
  ASSERT_FALSE(first.first.complete);
  // Committed at a key-range boundary (the signal is seen at the first round boundary after it).
  const auto committed = first.first.journal.committed_rows;
  EXPECT_TRUE(committed == 300 || committed == 303 || committed == 6000) << committed;
  // The fold's state is in a binary side file that the journal names, with its size and hash.
  const auto journal = nlohmann::json::parse(fsutil::read_file(dir.path / "stopped" / "journal.json"));
  EXPECT_FALSE(journal.contains("reduction"));
  const std::string side = journal.at("reduction_file").get<std::string>();
  EXPECT_EQ(side, "reduction-" + std::to_string(committed) + ".bin");
  EXPECT_EQ(fs::file_size(dir.path / "stopped" / side), journal.at("reduction_bytes").get<std::uint64_t>());
  auto second = run(1u << 20, "stopped", -1, false);
  ASSERT_TRUE(second.first.complete);
  EXPECT_EQ(second.first.resumed_from, committed);
  EXPECT_EQ(second.second, want);
  // A side file that does not hold what its journal recorded is not trusted: the pass starts over.
  signals::request_stop(0);
  ASSERT_FALSE(run(1u << 20, "corrupted", 2, true).first.complete);
  signals::request_stop(0);
  const auto j2 = nlohmann::json::parse(fsutil::read_file(dir.path / "corrupted" / "journal.json"));
  const fs::path side2 = dir.path / "corrupted" / j2.at("reduction_file").get<std::string>();
  std::string bytes = fsutil::read_file(side2);
  bytes[0] ^= 1;
  fsutil::write_file_atomic(side2, bytes);
  auto redone = run(1u << 20, "corrupted", -1, false);
  ASSERT_TRUE(redone.first.complete);
  EXPECT_EQ(redone.first.resumed_from, 0u);
  EXPECT_EQ(redone.second, want);
  // The largest key range must fit: 5697 rows x 8 bytes x 3 slots do not fit 64 KiB.
  auto small = detail::make_cpu_backend(64u << 10, 1ull << 30);
  mpi::Comm comm;
  EXPECT_THROW(engine::StreamEngine(*small, comm, {}).plan(spec), InputError);
  // Boundaries must be consecutive.
  spec.batches[1].begin = 299;
  EXPECT_THROW(engine::StreamEngine(*small, comm, {}).plan(spec), std::invalid_argument);
}
