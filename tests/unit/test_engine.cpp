// The streaming engine on the cpu backend: datasets far larger than the device budget, results
// independent of batch size, stop + resume equal to an uninterrupted run, merged checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/mpi.hpp"
#include "core/signals.hpp"
#include "engine/checkpoint_pace.hpp"
#include "engine/journal.hpp"
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
  std::unique_ptr<engine::Reduction> empty() const override { return std::make_unique<SumReduction>(); }
  void fold(std::uint64_t, const std::byte* tile) override {
    std::memcpy(&sum, tile, sizeof sum);
    tiles = 1;
  }
  void merge(const engine::Reduction& other) override {
    const auto& right = static_cast<const SumReduction&>(other);
    sum += right.sum;
    tiles += right.tiles;
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
  r.outcome = engine.run(spec, kernel, &r.reduction, work, output, nullptr);
  if (r.outcome.complete) {  // the caller annotates the staged output, then commits it
    EXPECT_FALSE(fs::exists(output));
    h5::File staged = r.outcome.staged.open();
    staged.set_attribute("annotated", "yes");
    staged.close();
    r.outcome.staged.commit();
  }
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

TEST(Engine, PassesOfAboutTheSameSizeTakeTheSameBuffersFromThePools) {
  // Two passes a few percent apart in rows, as sci.solve's iterations are: the slots' buffers are
  // sized for the batch's size class, so the second pass asks the pools for the bytes the first
  // gave back and takes every buffer from idle memory (the pools hand out exact sizes only).
  EXPECT_EQ(engine::size_class(41), 44u);
  EXPECT_EQ(engine::size_class(43), 44u);
  EXPECT_EQ(engine::size_class(44), 44u);
  EXPECT_EQ(engine::size_class(16), 16u);
  auto backend = detail::make_cpu_backend(64u << 20, 64u << 20);
  mpi::Comm comm;
  engine::EngineOptions options;
  options.checkpoint_seconds = std::nullopt;
  engine::StreamEngine engine(*backend, comm, options);
  Fixture first(41 * 512), second(43 * 512 - 100);  // 41 and 43 tiles: one batch each, class 44
  auto run = [&](Fixture& fx, const std::string& name) {
    engine::StepWork work(fx.dir.path / "work", "key", comm);
    auto spec = fx.spec();
    AffineKernel kernel(spec.tile_rows);
    SumReduction reduction;
    engine::PassOutcome o = engine.run(spec, kernel, &reduction, work, fx.dir.path / (name + ".h5"), nullptr);
    EXPECT_TRUE(o.complete);
    EXPECT_EQ(o.plan.buffer_rows, 44u * 512);
    EXPECT_TRUE(o.plan.size_classes);
    o.staged.commit();
    h5::File f = h5::File::open(fx.dir.path / (name + ".h5"), h5::Mode::read_only);
    std::vector<float> y(fx.x.size());
    f.open_dataset("y").read_all(y.data());
    EXPECT_EQ(y, fx.expected());
  };
  run(first, "first");
  const Backend::PoolCounts before = backend->pool_counts();
  run(second, "second");
  const Backend::PoolCounts after = backend->pool_counts();
  EXPECT_GT(after.host_taken, before.host_taken);
  EXPECT_EQ(after.host_taken - before.host_taken, after.host_reused - before.host_reused);
  EXPECT_EQ(after.device_taken - before.device_taken, after.device_reused - before.device_reused);
}

TEST(Engine, ResultsDoNotDependOnBatchSize) {
  Fixture fx(20000);  // not a multiple of the tile: the last batch is short
  Result small = run_pass(fx, 700u << 10, std::nullopt, "small");
  Result large = run_pass(fx, 8u << 20, std::nullopt, "large");
  ASSERT_TRUE(small.outcome.complete && large.outcome.complete);
  EXPECT_LT(small.outcome.plan.batch_rows, large.outcome.plan.batch_rows);
  EXPECT_EQ(small.y, large.y);
  EXPECT_EQ(small.outcome.journal.checksums, large.outcome.journal.checksums);
  // Bitwise: the fold is the same tree over the tiles whatever the batches were, and it is the
  // pairwise tree: left half + right half, recursively over a power-of-two span of the tiles.
  EXPECT_EQ(std::memcmp(&small.reduction.sum, &large.reduction.sum, 8), 0);
  std::vector<double> tile_sums;
  const auto y = fx.expected();
  for (std::uint64_t first = 0; first < fx.rows; first += 512) {
    double t = 0;
    for (std::uint64_t i = first * kCols; i < std::min(fx.rows, first + 512) * kCols; ++i) t += y[i];
    tile_sums.push_back(t);
  }
  std::function<double(std::uint64_t, std::uint64_t)> tree = [&](std::uint64_t begin, std::uint64_t span) -> double {
    if (begin >= tile_sums.size()) return 0.0;
    if (span == 1) return tile_sums[begin];
    if (begin + span / 2 >= tile_sums.size()) return tree(begin, span / 2);  // no right half
    return tree(begin, span / 2) + tree(begin + span / 2, span / 2);
  };
  std::uint64_t span = 1;
  while (span < tile_sums.size()) span *= 2;
  const double want = tree(0, span);
  EXPECT_EQ(std::memcmp(&small.reduction.sum, &want, 8), 0) << small.reduction.sum << " vs " << want;
  EXPECT_EQ(small.reduction.tiles, tile_sums.size());
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

// A stopped pass's journal and segments, checked the way a resumed run checks them before it
// trusts them: the journal against itself, then every segment's rows against their checksums.
TEST(Engine, JournalAndSegmentsAreCheckedBeforeTheyAreTrusted) {
  Fixture fx(30000);
  signals::request_stop(0);
  Result first = run_pass(fx, 700u << 10, 0.0, "checked", /*stop_at=*/3);
  signals::request_stop(0);
  ASSERT_FALSE(first.outcome.complete);
  const engine::Journal& j = first.outcome.journal;
  ASSERT_GE(j.segments.size(), 2u);
  const auto spec = fx.spec();
  const fs::path work = fx.dir.path / "work-checked";
  EXPECT_EQ(engine::journal_problem(j, spec), "");
  EXPECT_FALSE(engine::first_bad_segment(j, spec, work).has_value());
  // Each segment records the qsum64 of its rows; they add up to the journal's.
  std::uint64_t sum = 0;
  for (const auto& seg : j.segments) sum += seg.checksums.at(0);
  EXPECT_EQ(sum, j.checksums.at(0));

  engine::Journal more = j;
  more.committed_rows += 256;
  EXPECT_NE(engine::journal_problem(more, spec).find("committed_rows"), std::string::npos);
  engine::Journal gap = j;
  gap.segments[1].rows.begin += 1;
  EXPECT_NE(engine::journal_problem(gap, spec), "");
  engine::Journal sums = j;
  sums.segments[0].checksums[0] ^= 1;
  EXPECT_NE(engine::journal_problem(sums, spec).find("checksum"), std::string::npos);

  // A value changed inside a segment: found by its checksum, in that segment.
  {
    h5::File f = h5::File::open(work / j.segments[1].file, h5::Mode::read_write);
    h5::Dataset d = f.open_dataset(spec.outputs[0].name);
    std::vector<float> row(kCols);
    d.read_rows(5, 1, row.data());
    row[3] += 1.0f;
    d.write_rows(5, 1, row.data());
    f.close();
  }
  const auto bad = engine::first_bad_segment(j, spec, work);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->index, 1u);
  EXPECT_NE(bad->why.find("do not match their checksum"), std::string::npos);
  // The resumed pass (with its fold, it cannot keep the good segments) starts again and gives
  // the uninterrupted pass's rows and value.
  Result resumed = run_pass(fx, 700u << 10, 0.0, "checked", -1, /*fresh=*/false);
  ASSERT_TRUE(resumed.outcome.complete);
  EXPECT_EQ(resumed.outcome.resumed_from, 0u);
  EXPECT_EQ(resumed.y, fx.expected());
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
  std::unique_ptr<engine::Reduction> empty() const override { return std::make_unique<ListReduction>(); }
  void fold(std::uint64_t, const std::byte* p) override {
    std::uint64_t v[2];
    std::memcpy(v, p, sizeof v);
    list = {{v[0], v[1]}};
  }
  void merge(const engine::Reduction& other) override {
    const auto& right = static_cast<const ListReduction&>(other);
    list.insert(list.end(), right.list.begin(), right.list.end());
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
    auto outcome = engine.run(spec, kernel, &reduction, work, dir.path / (std::string(name) + ".h5"), nullptr);
    if (outcome.complete) outcome.staged.commit();
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

// ------------------------------------------------------------------------------ appended outputs
namespace {

// Row r of the input appends (r * 7919) % 5 rows (0 to 4): {r, j, x[r][0] as bits} for j < that.
std::uint64_t appended_by(std::uint64_t r) { return (r * 7919) % 5; }

class AppendKernel final : public engine::PassKernel {
 public:
  explicit AppendKernel(std::int64_t stop_at) : stop_at_(stop_at) {}
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const float*>(b.inputs[0]);
    auto* out = static_cast<std::uint64_t*>(b.outputs[0]);
    std::uint64_t n = 0;
    for (std::uint64_t r = 0; r < b.rows.size(); ++r) {
      std::uint32_t bits;
      std::memcpy(&bits, &x[r * kCols], 4);
      for (std::uint64_t j = 0; j < appended_by(b.rows.begin + r); ++j, ++n) {
        out[3 * n] = b.rows.begin + r;
        out[3 * n + 1] = j;
        out[3 * n + 2] = bits;
      }
    }
    *b.appended[0] = n;
    if (stop_at_ >= 0 && static_cast<std::int64_t>(b.index) == stop_at_) signals::request_stop(SIGTERM);
  }

 private:
  std::int64_t stop_at_;
};

}  // namespace

TEST(Engine, AppendedOutputsOfRandomLengthsPerBatchAreIdenticalForAnyBatchSizeAndAfterAResume) {
  Fixture fx(5000);
  std::vector<std::uint64_t> want;
  for (std::uint64_t r = 0; r < fx.rows; ++r) {
    std::uint32_t bits;
    std::memcpy(&bits, &fx.x[r * kCols], 4);
    for (std::uint64_t j = 0; j < appended_by(r); ++j) want.insert(want.end(), {r, j, bits});
  }
  const std::uint64_t want_rows = want.size() / 3;
  std::uint64_t want_sum = 0;
  kernels::checksum_cpu({want.data(), want.size() * 8, 4, 0, &want_sum});

  auto run = [&](std::uint64_t max_batch_rows, const std::string& name, std::int64_t stop_at, bool fresh) {
    auto backend = detail::make_cpu_backend(64u << 20, 1ull << 30);
    mpi::Comm comm;
    engine::EngineOptions options;
    options.checkpoint_seconds = 0.0;
    options.max_batch_rows = max_batch_rows;
    engine::StreamEngine engine(*backend, comm, options);
    const fs::path work_dir = fx.dir.path / ("work-" + name);
    if (fresh) fs::remove_all(work_dir);
    engine::StepWork work(work_dir, "key-" + name, comm);
    engine::PassSpec spec;
    spec.rows = fx.rows;
    spec.tile_rows = 100;
    spec.inputs.push_back({"x", &fx.input, kCols * 4});
    engine::OutputDecl out{"pairs", h5::DType::uint64, {fx.rows * 4, 3}, {1000, 3}};
    out.kind = engine::OutputKind::appended;
    out.max_rows_per_row = 4;
    spec.outputs.push_back(out);
    AppendKernel kernel(stop_at);
    auto outcome = engine.run(spec, kernel, nullptr, work, fx.dir.path / (name + ".h5"), nullptr);
    if (outcome.complete) outcome.staged.commit();
    return outcome;
  };
  auto read = [&](const std::string& name) {
    h5::File f = h5::File::open(fx.dir.path / (name + ".h5"), h5::Mode::read_only);
    h5::Dataset d = f.open_dataset("pairs");
    EXPECT_EQ(d.shape(), (h5::Shape{want_rows, 3}));
    std::vector<std::uint64_t> got(d.shape()[0] * 3);
    d.read_all(got.data());
    return got;
  };
  for (std::uint64_t batch : {100u, 700u, 5000u}) {
    const std::string name = "append-" + std::to_string(batch);
    const auto outcome = run(batch, name, -1, true);
    ASSERT_TRUE(outcome.complete);
    EXPECT_EQ(read(name), want) << batch;
    ASSERT_EQ(outcome.outputs.size(), 1u);
    EXPECT_EQ(outcome.outputs[0].rows, want_rows);
    EXPECT_EQ(outcome.journal.checksums[0], want_sum);
    // Each batch's count, in batch order: they sum to the output's rows.
    std::uint64_t total = 0;
    for (auto c : outcome.outputs[0].batch_rows) total += c;
    EXPECT_EQ(total, want_rows);
    EXPECT_EQ(outcome.outputs[0].batch_rows.size(), (fx.rows + batch - 1) / batch);
  }
  // Stopped after the fourth batch (checkpoint after every round), resumed: the same bytes.
  signals::request_stop(0);
  const auto first = run(300, "append-stopped", 3, true);
  signals::request_stop(0);
  ASSERT_FALSE(first.complete);
  EXPECT_EQ(first.journal.appended.at(0).size(), first.journal.committed_rows / 300);
  const auto second = run(300, "append-stopped", -1, false);
  ASSERT_TRUE(second.complete);
  EXPECT_EQ(second.resumed_from, first.journal.committed_rows);
  EXPECT_EQ(read("append-stopped"), want);
  EXPECT_EQ(second.journal.checksums[0], want_sum);
}

// ------------------------------------------------------------------------------ per-input row ranges
namespace {

// A two-way merge of sorted runs: batch i reads from each run the range its keys in
// [splitter i-1, splitter i) occupy, and appends their merge.
class MergeKernel final : public engine::PassKernel {
 public:
  void process(const engine::BatchView& b) override {
    const auto* a = static_cast<const std::uint64_t*>(b.inputs[0]);
    const auto* c = static_cast<const std::uint64_t*>(b.inputs[1]);
    std::merge(a, a + b.input_rows[0].size(), c, c + b.input_rows[1].size(), static_cast<std::uint64_t*>(b.outputs[0]));
    *b.appended[0] = b.input_rows[0].size() + b.input_rows[1].size();
  }
};

}  // namespace

TEST(Engine, PerInputRowRangesMergeSortedRunsByKeyRange) {
  test::TempDir dir;
  std::vector<std::uint64_t> run_a(3000), run_b(1700);
  for (std::size_t i = 0; i < run_a.size(); ++i) run_a[i] = (i * 2654435761u) % 100000;
  for (std::size_t i = 0; i < run_b.size(); ++i) run_b[i] = (i * 40503u + 7) % 100000;
  std::sort(run_a.begin(), run_a.end());
  std::sort(run_b.begin(), run_b.end());
  {
    h5::File f = h5::File::create(dir.path / "runs.h5");
    f.create_dataset("a", {h5::DType::uint64, {run_a.size()}, {512}, false}).write_all(run_a.data());
    f.create_dataset("b", {h5::DType::uint64, {run_b.size()}, {512}, false}).write_all(run_b.data());
    f.close();
  }
  h5::File f = h5::File::open(dir.path / "runs.h5", h5::Mode::read_only);
  h5::Dataset a = f.open_dataset("a"), b = f.open_dataset("b");
  const std::vector<std::uint64_t> splitters = {5000, 5001, 40000, 77777};  // one range is empty in both
  const auto ra = engine::key_range_batches(a, splitters), rb = engine::key_range_batches(b, splitters);
  // key_range_batches drops empty ranges; a merge needs one range per key range, empty or not.
  auto per_key_range = [&](const std::vector<std::uint64_t>& keys) {
    std::vector<engine::RowRange> r;
    std::uint64_t begin = 0;
    for (auto s : splitters) {
      const std::uint64_t end = std::lower_bound(keys.begin(), keys.end(), s) - keys.begin();
      r.push_back({begin, end});
      begin = end;
    }
    r.push_back({begin, keys.size()});
    return r;
  };
  ASSERT_LE(ra.size(), splitters.size() + 1);
  ASSERT_LE(rb.size(), splitters.size() + 1);

  engine::PassSpec spec;
  spec.rows = splitters.size() + 1;  // one row per key range
  spec.tile_rows = 1;
  for (std::uint64_t i = 0; i < spec.rows; ++i) spec.batches.push_back({i, i + 1});
  spec.inputs.push_back({"a", &a, 8, engine::InputKind::row_ranges, per_key_range(run_a)});
  spec.inputs.push_back({"b", &b, 8, engine::InputKind::row_ranges, per_key_range(run_b)});
  engine::OutputDecl out{"merged", h5::DType::uint64, {run_a.size() + run_b.size()}, {1024}};
  out.kind = engine::OutputKind::appended;
  out.max_rows_per_row = run_a.size() + run_b.size();
  spec.outputs.push_back(out);

  auto backend = detail::make_cpu_backend(16u << 20, 1ull << 30);
  mpi::Comm comm;
  engine::StreamEngine engine(*backend, comm, {});
  engine::StepWork work(dir.path / "work", "merge", comm);
  MergeKernel kernel;
  auto outcome = engine.run(spec, kernel, nullptr, work, dir.path / "merged.h5", nullptr);
  ASSERT_TRUE(outcome.complete);
  outcome.staged.commit();

  std::vector<std::uint64_t> want(run_a.size() + run_b.size());
  std::merge(run_a.begin(), run_a.end(), run_b.begin(), run_b.end(), want.begin());
  h5::File g = h5::File::open(dir.path / "merged.h5", h5::Mode::read_only);
  std::vector<std::uint64_t> got(want.size());
  ASSERT_EQ(g.open_dataset("merged").shape(), h5::Shape{want.size()});
  g.open_dataset("merged").read_all(got.data());
  EXPECT_EQ(got, want);
  // Each input's buffers hold its own longest range's size class (not the longest of all
  // inputs), and the plan is what the 3 slots took: those, the output's rows and its count.
  auto longest = [](const std::vector<engine::RowRange>& r) {
    std::uint64_t n = 0;
    for (const auto& x : r) n = std::max(n, x.size());
    return engine::size_class(n);
  };
  ASSERT_NE(longest(per_key_range(run_a)), longest(per_key_range(run_b)));
  EXPECT_EQ(outcome.plan.device_bytes,
            3 * (8 * longest(per_key_range(run_a)) + 8 * longest(per_key_range(run_b)) + 8 * out.max_rows_per_row + 8));
  EXPECT_EQ(backend->device_budget().peak(), outcome.plan.device_bytes);
  // The per-batch counts are the key ranges' sizes (the second one, [5000, 5001), may be empty).
  const auto pa = per_key_range(run_a), pb = per_key_range(run_b);
  ASSERT_EQ(outcome.outputs[0].batch_rows.size(), pa.size());
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(outcome.outputs[0].batch_rows[i], pa[i].size() + pb[i].size());

  // A range per batch is required, inside the dataset.
  spec.inputs[1].ranges.pop_back();
  EXPECT_THROW(engine.plan(spec), std::invalid_argument);
  spec.inputs[1].ranges = per_key_range(run_b);
  spec.inputs[1].ranges.back().end = run_b.size() + 1;
  EXPECT_THROW(engine.plan(spec), std::invalid_argument);
}

// ------------------------------------------------------------------------------ the device path
namespace {

// The rows of AppendKernel, and the same rows again grouped into 3 buckets (row r's bucket:
// r % 3), computed on the host and copied to the device as a GPU kernel would leave them.
class DeviceAppendKernel final : public engine::PassKernel {
 public:
  void prepare(Backend& backend, Stream&) override { backend_ = &backend; }
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const float*>(b.host_inputs[0]);
    std::vector<std::uint64_t> rows;
    std::vector<std::vector<std::uint64_t>> buckets(3);
    for (std::uint64_t r = 0; r < b.rows.size(); ++r) {
      std::uint32_t bits;
      std::memcpy(&bits, &x[r * kCols], 4);
      for (std::uint64_t j = 0; j < appended_by(b.rows.begin + r); ++j) {
        rows.insert(rows.end(), {b.rows.begin + r, j, bits});
        buckets[(b.rows.begin + r) % 3].insert(buckets[(b.rows.begin + r) % 3].end(), {b.rows.begin + r, j, bits});
      }
    }
    std::vector<std::uint64_t> grouped, counts{rows.size() / 3};
    for (const auto& k : buckets) grouped.insert(grouped.end(), k.begin(), k.end());
    std::vector<std::uint64_t> bucket_counts;
    for (const auto& k : buckets) bucket_counts.push_back(k.size() / 3);
    backend_->copy_to_device(b.outputs[0], rows.data(), rows.size() * 8, *b.stream);
    backend_->copy_to_device(b.appended[0], counts.data(), 8, *b.stream);
    backend_->copy_to_device(b.outputs[1], grouped.data(), grouped.size() * 8, *b.stream);
    backend_->copy_to_device(b.appended[1], bucket_counts.data(), 24, *b.stream);
    b.stream->synchronize();  // (the host vectors go out of scope)
  }

 private:
  Backend* backend_ = nullptr;
};

// An exchanged output's rows, read in place from the bucket files its pass's file names (as a
// later pass streams them); the file holds no dataset of that name.
std::vector<std::uint64_t> read_exchanged(const h5::File& f, const std::string& name) {
  EXPECT_FALSE(f.exists(name)) << name << " was copied into HDF5";
  const auto files = engine::exchanged_output(f, name);
  if (!files) {
    ADD_FAILURE() << "no exchanged output " << name;
    return {};
  }
  std::vector<std::uint64_t> v(files->total_rows() * files->row_bytes / 8);
  h5::RowFilesReader(*files).read(0, files->total_rows(), v.data());
  return v;
}

std::pair<std::vector<std::uint64_t>, std::vector<std::uint64_t>> run_device_append(Fixture& fx, Backend& backend,
                                                                                  const std::string& name) {
  mpi::Comm comm;
  engine::EngineOptions options;
  options.max_batch_rows = 700;
  engine::StreamEngine engine(backend, comm, options);
  engine::StepWork work(fx.dir.path / ("work-" + name), "key-" + name, comm);
  engine::PassSpec spec;
  spec.rows = fx.rows;
  spec.tile_rows = 100;
  spec.inputs.push_back({"x", &fx.input, kCols * 4});
  for (const char* out_name : {"pairs", "bucketed"}) {
    engine::OutputDecl out{out_name, {h5::DType::uint64, {fx.rows * 4, 3}, {1000, 3}}};
    out.kind = engine::OutputKind::appended;
    out.max_rows_per_row = 4;
    spec.outputs.push_back(out);
  }
  spec.outputs[1].buckets = 3;
  DeviceAppendKernel kernel;
  auto outcome = engine.run(spec, kernel, nullptr, work, fx.dir.path / (name + ".h5"), nullptr);
  EXPECT_TRUE(outcome.complete);
  outcome.staged.commit();
  h5::File f = h5::File::open(fx.dir.path / (name + ".h5"), h5::Mode::read_only);
  h5::Dataset ds = f.open_dataset("pairs");
  std::vector<std::uint64_t> pairs(ds.shape()[0] * 3);
  ds.read_all(pairs.data());
  return {pairs, read_exchanged(f, "bucketed")};
}

}  // namespace

TEST(Engine, AppendedAndExchangedOutputsOnTheGpuAreTheCpusBytes) {
  REQUIRE_GPU();
  Fixture fx(3000);
  auto cpu = detail::make_cpu_backend(64u << 20, 1ull << 30);
  auto cuda = make_backend({"cuda", 64u << 20, 1ull << 30, 0});  // (make_cuda_backend exists only in CUDA builds)
  const auto on_cpu = run_device_append(fx, *cpu, "cpu");
  const auto on_gpu = run_device_append(fx, *cuda, "gpu");
  EXPECT_EQ(on_gpu.first, on_cpu.first);
  EXPECT_EQ(on_gpu.second, on_cpu.second);
  // The bucketed output holds bucket 0's rows (row % 3 == 0), then bucket 1's, then bucket 2's.
  std::uint64_t last_bucket = 0;
  for (std::size_t i = 0; i < on_gpu.second.size(); i += 3) {
    EXPECT_GE(on_gpu.second[i] % 3, last_bucket);
    last_bucket = on_gpu.second[i] % 3;
  }
  EXPECT_EQ(on_gpu.first.size(), on_gpu.second.size());
}

// ------------------------------------------------------------------------------ planning what a slot holds
namespace {

// Row r of a batch goes to bucket r % buckets; the rows leave bucket-major, each bucket ascending.
class BucketKernel final : public engine::PassKernel {
 public:
  explicit BucketKernel(std::uint32_t buckets) : buckets_(buckets) {}
  void process(const engine::BatchView& b) override {  // (cpu: the outputs are host memory)
    auto* out = static_cast<std::uint64_t*>(b.outputs[0]);
    std::uint64_t* counts = b.appended[0];
    std::uint64_t at = 0;
    for (std::uint32_t k = 0; k < buckets_; ++k) {
      counts[k] = 0;
      for (std::uint64_t r = b.rows.begin; r < b.rows.end; ++r)
        if (r % buckets_ == k) {
          out[at++] = r;
          ++counts[k];
        }
    }
  }

 private:
  std::uint32_t buckets_;
};

}  // namespace

// A pass over the fixture's rows with one exchanged output, "bucketed", of one u64 a row
// (BucketKernel's).
engine::PassSpec bucketed_pass(Fixture& fx, std::uint32_t buckets) {
  engine::PassSpec spec;
  spec.rows = fx.rows;
  spec.tile_rows = 100;
  spec.inputs.push_back({"x", &fx.input, kCols * 4});
  engine::OutputDecl out{"bucketed", {h5::DType::uint64, {fx.rows}, {100}}};
  out.kind = engine::OutputKind::appended;
  out.max_rows_per_row = 1;
  out.buckets = buckets;
  spec.outputs.push_back(out);
  return spec;
}

// An exchanged output's kernel stores a count per bucket in every slot, on the device and on the
// host: with many buckets that is a good part of a slot, and the plan must charge it. A device
// budget of exactly the planned peak runs and peaks there; a byte less is refused when planning
// (InputError), not overrun when the last slot allocates.
TEST(Engine, PlanChargesAnExchangedOutputsCountPerBucket) {
  constexpr std::uint32_t kBuckets = 600;
  Fixture fx(1000);
  mpi::Comm comm;
  engine::EngineOptions options;
  options.max_batch_rows = 100;
  options.checkpoint_seconds = std::nullopt;
  const engine::PassSpec spec = bucketed_pass(fx, kBuckets);

  auto roomy = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  const engine::BatchPlan plan = engine::StreamEngine(*roomy, comm, options).plan(spec);
  ASSERT_EQ(plan.batch_rows, 100u);
  // 3 slots, each: the input's and the output's rows, and a u64 count per bucket.
  EXPECT_EQ(plan.device_bytes, 3 * (100 * kCols * 4 + 100 * 8 + 8 * kBuckets));
  EXPECT_EQ(plan.host_bytes, plan.device_bytes);

  auto exact = detail::make_cpu_backend(plan.device_bytes, 1ull << 30);
  engine::StreamEngine engine(*exact, comm, options);
  engine::StepWork work(fx.dir.path / "work-buckets", "key-buckets", comm);
  BucketKernel kernel(kBuckets);
  auto outcome = engine.run(spec, kernel, nullptr, work, fx.dir.path / "buckets.h5", nullptr);
  ASSERT_TRUE(outcome.complete);
  outcome.staged.commit();
  EXPECT_EQ(exact->device_budget().peak(), plan.device_bytes);
  std::vector<std::uint64_t> want(fx.rows);
  h5::File f = h5::File::open(fx.dir.path / "buckets.h5", h5::Mode::read_only);
  const std::vector<std::uint64_t> got = read_exchanged(f, "bucketed");
  std::iota(want.begin(), want.end(), std::uint64_t{0});
  std::stable_sort(want.begin(), want.end(), [](auto a, auto b) { return a % kBuckets < b % kBuckets; });
  EXPECT_EQ(got, want);

  auto short_by_one = detail::make_cpu_backend(plan.device_bytes - 1, 1ull << 30);
  try {
    engine::StreamEngine(*short_by_one, comm, options).plan(spec);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device memory budget"), std::string::npos) << what;
    EXPECT_NE(what.find("one batch of 100 rows needs"), std::string::npos) << what;
  }
}

// Copies its batch's rows of input 0 (u64) to output 0.
class CopyKernel final : public engine::PassKernel {
 public:
  void process(const engine::BatchView& b) override {  // (cpu: host memory)
    std::memcpy(b.outputs[0], b.inputs[0], b.input_rows[0].size() * 8);
  }
};

// An exchanged output stays in the bucket files the exchange wrote (its pass's file names them and
// holds no copy), and a later pass streams them in place, in bucket order. A bucket file cut short
// is refused by name, not read.
TEST(Engine, AnExchangedOutputStaysInItsBucketFilesAndALaterPassReadsThemInPlace) {
  constexpr std::uint32_t kBuckets = 7;
  Fixture fx(1000);
  mpi::Comm comm;
  engine::EngineOptions options;
  options.max_batch_rows = 100;
  options.checkpoint_seconds = std::nullopt;
  auto backend = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  engine::StreamEngine engine(*backend, comm, options);

  const engine::PassSpec spec = bucketed_pass(fx, kBuckets);
  engine::StepWork work(fx.dir.path / "pass-0", "key", comm);
  BucketKernel bucket(kBuckets);
  // (the output outside the work folder, where the runner's are inside: the file finds them either way)
  auto first = engine.run(spec, bucket, nullptr, work, fx.dir.path / "pass-0.h5", nullptr);
  ASSERT_TRUE(first.complete);
  first.staged.commit();

  std::vector<std::uint64_t> want(fx.rows);
  std::iota(want.begin(), want.end(), std::uint64_t{0});
  std::stable_sort(want.begin(), want.end(), [](auto a, auto b) { return a % kBuckets < b % kBuckets; });
  h5::File f = h5::File::open(fx.dir.path / "pass-0.h5", h5::Mode::read_only);
  const auto files = engine::exchanged_output(f, "bucketed");
  ASSERT_TRUE(files.has_value());
  EXPECT_FALSE(f.exists("bucketed"));
  EXPECT_FALSE(engine::exchanged_output(f, "other").has_value());
  ASSERT_EQ(files->rows.size(), kBuckets);
  EXPECT_EQ(files->rows, first.outputs.at(0).bucket_rows);
  EXPECT_EQ(files->total_rows(), fx.rows);

  engine::PassSpec next;
  next.rows = files->total_rows();
  next.tile_rows = 50;
  engine::StreamedInput in{"bucketed", nullptr, 8};
  in.files = &*files;
  next.inputs.push_back(in);
  next.outputs.push_back({"copy", {h5::DType::uint64, {next.rows}, {50}}});
  engine::StepWork work1(fx.dir.path / "pass-1", "key", comm);
  CopyKernel copy;
  auto second = engine.run(next, copy, nullptr, work1, fx.dir.path / "pass-1" / "output.h5", nullptr);
  ASSERT_TRUE(second.complete);
  second.staged.commit();
  std::vector<std::uint64_t> got(fx.rows);
  h5::File::open(fx.dir.path / "pass-1" / "output.h5", h5::Mode::read_only).open_dataset("copy").read_all(got.data());
  EXPECT_EQ(got, want);

  fs::resize_file(files->paths[3], fs::file_size(files->paths[3]) - 8);
  try {
    h5::RowFilesReader reader(*files);
    FAIL() << "expected CorruptInput";
  } catch (const CorruptInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(files->paths[3].filename().string()), std::string::npos) << what;
    EXPECT_NE(what.find("expected"), std::string::npos) << what;
  }
}

// Commits come every interval, but never sooner than 9x what the last one took (checkpoints at
// most a tenth of the run); an interval of 0 is a commit at every chance, costly or not.
// A commit point's state written on a thread of its own: writes land in the order given (the file
// never goes back to an older state), and a failed write is thrown by the next wait() or write().
TEST(FsUtil, BackgroundWritesLandInOrderAndReportAFailure) {
  test::TempDir dir;
  const auto file = dir.path / "state.bin";
  {
    fsutil::BackgroundWrites writes;
    for (int i = 0; i < 20; ++i) writes.write(file, std::string(static_cast<std::size_t>(1000 + i), static_cast<char>('a' + i)));
    writes.wait();
    EXPECT_EQ(fsutil::read_file(file), std::string(1019, static_cast<char>('a' + 19)));
    EXPECT_FALSE(std::filesystem::exists(fsutil::temp_path(file)));
    writes.write(dir.path / "no-such-folder" / "state.bin", "x");
    EXPECT_THROW(writes.wait(), RuntimeFailure);
    writes.write(dir.path / "no-such-folder" / "state.bin", "x");
    EXPECT_THROW(writes.write(file, "y"), RuntimeFailure);  // (the one before failed)
    EXPECT_EQ(fsutil::read_file(file), std::string(1019, static_cast<char>('a' + 19)));
    writes.write(dir.path / "no-such-folder" / "state.bin", "x");
  }  // (the destructor waits and drops that failure)
}

TEST(CheckpointPace, CommitsComeEveryIntervalOrNineTimesTheirCostApart) {
  using engine::CheckpointPace;
  using std::chrono::seconds;
  const auto t0 = CheckpointPace::Clock::time_point{} + seconds(1000);
  CheckpointPace pace(120.0, t0);
  EXPECT_FALSE(pace.due(t0 + seconds(119)));
  EXPECT_TRUE(pace.due(t0 + seconds(120)));
  // a 30 s commit: the next one 270 s after it ended
  const auto began = t0 + seconds(120), ended = began + seconds(30);
  pace.committed(began, ended);
  EXPECT_DOUBLE_EQ(pace.last_commit_seconds(), 30);
  EXPECT_DOUBLE_EQ(pace.gap(), 270);
  EXPECT_FALSE(pace.due(ended + seconds(269)));
  EXPECT_TRUE(pace.due(ended + seconds(270)));
  // a cheap one: back to the interval
  const auto later = ended + seconds(270);
  pace.committed(later, later + seconds(1));
  EXPECT_DOUBLE_EQ(pace.gap(), 120);
  EXPECT_TRUE(pace.due(later + seconds(121)));

  CheckpointPace every(0.0, t0);
  every.committed(t0, t0 + seconds(60));
  EXPECT_TRUE(every.due(t0 + seconds(60)));
  CheckpointPace never(std::nullopt, t0);
  EXPECT_FALSE(never.due(t0 + seconds(100000)));
}
