// The streaming engine across ranks (ctest runs it on 3; it holds for any number): an appended
// output exchanged by bucket between ranks, identical for 1, 2 and 3 ranks, and after a run on 3
// ranks that was stopped and resumed on 2. The oracle is the host's own loop over the rows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/mpi.hpp"
#include "core/signals.hpp"
#include "engine/stream_engine.hpp"
#include "gtest_mpi.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"

namespace qstage {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kRows = 3000;
constexpr std::uint32_t kBuckets = 5;  // more buckets than ranks: a rank owns several

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}
// Row r appends rows {key, r} for j < (r * 7919) % 5, key = mix(x[r] + j); bucket key % kBuckets.
std::uint64_t appended_by(std::uint64_t r) { return (r * 7919) % 5; }

class BucketKernel final : public engine::PassKernel {
 public:
  explicit BucketKernel(std::int64_t stop_at) : stop_at_(stop_at) {}
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const std::uint64_t*>(b.inputs[0]);
    std::vector<std::vector<std::uint64_t>> by_bucket(kBuckets);
    for (std::uint64_t r = 0; r < b.rows.size(); ++r)
      for (std::uint64_t j = 0; j < appended_by(b.rows.begin + r); ++j) {
        const std::uint64_t key = mix(x[r] + j);
        by_bucket[key % kBuckets].insert(by_bucket[key % kBuckets].end(), {key, b.rows.begin + r});
      }
    auto* out = static_cast<std::uint64_t*>(b.outputs[0]);
    for (std::uint32_t k = 0; k < kBuckets; ++k) {
      std::memcpy(out, by_bucket[k].data(), by_bucket[k].size() * 8);
      out += by_bucket[k].size();
      b.appended[0][k] = by_bucket[k].size() / 2;
    }
    if (stop_at_ >= 0 && static_cast<std::int64_t>(b.index) == stop_at_) signals::request_stop(SIGTERM);
  }

 private:
  std::int64_t stop_at_;
};

struct Shared {
  mpi::Comm world;
  fs::path dir;
  std::vector<std::uint64_t> x;
  Shared() : x(kRows) {
    for (std::uint64_t r = 0; r < kRows; ++r) x[r] = (r * 2654435761u) % 1000003;
    std::string path;
    if (world.root()) {
      dir = fs::temp_directory_path() / ("qstage-mpi-engine-" + std::to_string(std::random_device{}()));
      fs::create_directories(dir);
      h5::File f = h5::File::create(dir / "x.h5");
      f.create_dataset("x", {h5::DType::uint64, {kRows}, {256}, false}).write_all(x.data());
      f.close();
      path = dir.string();
    }
    dir = world.broadcast(path);
    world.barrier();
  }
  ~Shared() {
    world.barrier();
    if (world.root()) fs::remove_all(dir);
  }
};

// Runs `body` with a communicator of the first `ranks` ranks of the world; the others wait.
void on_first_ranks(const Shared& s, int ranks, const std::function<void(const mpi::Comm&)>& body) {
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, s.world.rank() < ranks ? 0 : MPI_UNDEFINED, s.world.rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    {
      const mpi::Comm comm(sub);
      body(comm);
    }
    MPI_Comm_free(&sub);
  }
  s.world.barrier();
}

// The input dataset and a pass over it with tiles of `tile_rows` rows.
struct XPass {
  h5::File file;
  h5::Dataset x;
  engine::PassSpec spec;
  XPass(const Shared& s, std::uint64_t tile_rows)
      : file(h5::File::open(s.dir / "x.h5", h5::Mode::read_only)), x(file.open_dataset("x")) {
    spec.rows = kRows;
    spec.tile_rows = tile_rows;
    spec.inputs.push_back({"x", &x, 8});
  }
};

// A CPU engine on `comm` with batches of `batch_rows` rows, committing every round
// (`checkpoint_seconds` 0) or less often, and the work directory of the step `name` (emptied
// first when `fresh`).
struct EngineOn {
  std::unique_ptr<Backend> backend;
  engine::StreamEngine engine;
  engine::StepWork work;
  EngineOn(const Shared& s, const mpi::Comm& comm, const std::string& name, bool fresh, std::uint64_t batch_rows,
           double checkpoint_seconds)
      : backend(detail::make_cpu_backend(32u << 20, 1ull << 30)),
        engine(*backend, comm, options(batch_rows, checkpoint_seconds)),
        work(emptied(s, comm, name, fresh), "key-" + name, comm) {}

 private:
  static engine::EngineOptions options(std::uint64_t batch_rows, double checkpoint_seconds) {
    engine::EngineOptions options;
    options.checkpoint_seconds = checkpoint_seconds;
    options.max_batch_rows = batch_rows;
    return options;
  }
  static fs::path emptied(const Shared& s, const mpi::Comm& comm, const std::string& name, bool fresh) {
    const fs::path dir = s.dir / ("work-" + name);
    if (fresh && comm.root()) fs::remove_all(dir);
    comm.barrier();
    return dir;
  }
};

// Runs the pass on the first `ranks` ranks of the world (the others wait). Returns whether it
// completed (on those ranks).
bool run_on(const Shared& s, int ranks, const std::string& name, std::int64_t stop_at, bool fresh) {
  bool complete = false;
  on_first_ranks(s, ranks, [&](const mpi::Comm& comm) {
    EngineOn on(s, comm, name, fresh, 200, 0.0);
    auto& engine = on.engine;
    auto& work = on.work;
    XPass pass(s, 100);
    engine::OutputDecl out{"keys", h5::DType::uint64, {kRows * 4, 2}, {512, 2}};
    out.kind = engine::OutputKind::appended;
    out.max_rows_per_row = 4;
    out.buckets = kBuckets;
    pass.spec.outputs.push_back(out);
    BucketKernel kernel(stop_at);
    auto outcome = engine.run(pass.spec, kernel, nullptr, work, s.dir / (name + ".h5"), nullptr);
    complete = outcome.complete;
    if (complete) {
      std::uint64_t total = 0;
      for (auto n : outcome.outputs[0].bucket_rows) total += n;
      EXPECT_EQ(outcome.outputs[0].bucket_rows.size(), kBuckets);
      EXPECT_EQ(total, outcome.outputs[0].rows);
      outcome.staged.commit();
    }
  });
  signals::request_stop(0);
  return s.world.any(complete);  // (the ranks that ran agree)
}

// Per tile of 10 rows: the sum of sqrt(x) in double, rows in order. Left to right, the sum of
// such partials depends on where a fold starts; in the fixed tree it does not.
class SqrtSumKernel final : public engine::PassKernel {
 public:
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const std::uint64_t*>(b.inputs[0]);
    auto* partials = static_cast<double*>(b.partials);
    for (std::uint64_t r = 0; r < b.rows.size(); ++r) {
      if (r % 10 == 0) partials[r / 10] = 0;
      partials[r / 10] += std::sqrt(static_cast<double>(x[r]) * 1.0000001);
    }
  }
};

class SumFold final : public engine::Reduction {
 public:
  std::unique_ptr<engine::Reduction> empty() const override { return std::make_unique<SumFold>(); }
  void fold(std::uint64_t, const std::byte* p) override { std::memcpy(&sum, p, 8); }
  void merge(const engine::Reduction& r) override { sum += static_cast<const SumFold&>(r).sum; }
  std::string save() const override { return std::string(reinterpret_cast<const char*>(&sum), 8); }
  void load(const std::string& s) override { std::memcpy(&sum, s.data(), 8); }
  double sum = 0;
};

// The tree-folded sum on the first `ranks` ranks, with batches of `batch_rows` rows (rank 0's).
double tree_sum_on(const Shared& s, int ranks, std::uint64_t batch_rows) {
  double sum = 0;
  on_first_ranks(s, ranks, [&](const mpi::Comm& comm) {
    auto backend = detail::make_cpu_backend(32u << 20, 1ull << 30);
    engine::EngineOptions options;
    options.max_batch_rows = batch_rows;
    engine::StreamEngine engine(*backend, comm, options);
    const std::string name = "sum-" + std::to_string(ranks) + "-" + std::to_string(batch_rows);
    engine::StepWork work(s.dir / ("work-" + name), name, comm);
    XPass pass(s, 10);
    pass.spec.tile_partial_bytes = 8;
    SqrtSumKernel kernel;
    SumFold fold;
    auto outcome = engine.run(pass.spec, kernel, &fold, work, s.dir / (name + ".h5"), nullptr);
    EXPECT_TRUE(outcome.complete);
    outcome.staged.commit();
    sum = fold.sum;
  });
  return sum;  // (rank 0 takes part in every run)
}

std::vector<std::uint64_t> expected(const Shared& s) {
  std::vector<std::uint64_t> want;
  for (std::uint32_t k = 0; k < kBuckets; ++k)
    for (std::uint64_t r = 0; r < kRows; ++r)
      for (std::uint64_t j = 0; j < appended_by(r); ++j)
        if (mix(s.x[r] + j) % kBuckets == k) want.insert(want.end(), {mix(s.x[r] + j), r});
  return want;
}

// The exchanged output's rows, read in place from the bucket files (the pass's file names them
// and holds no copy), as a later pass streams them.
std::vector<std::uint64_t> read(const Shared& s, const std::string& name) {
  h5::File f = h5::File::open(s.dir / (name + ".h5"), h5::Mode::read_only);
  EXPECT_FALSE(f.exists("keys"));
  const auto files = engine::exchanged_output(f, "keys");
  if (!files) {
    ADD_FAILURE() << name << " names no exchanged output 'keys'";
    return {};
  }
  std::vector<std::uint64_t> v(files->total_rows() * 2);
  h5::RowFilesReader(*files).read(0, files->total_rows(), v.data());
  return v;
}

TEST(EngineRanks, ExchangedOutputIsTheSameForOneTwoAndThreeRanks) {
  Shared s;
  const auto want = expected(s);
  for (int ranks = 1; ranks <= std::min(3, s.world.size()); ++ranks) {
    const std::string name = "exchanged-" + std::to_string(ranks);
    ASSERT_TRUE(run_on(s, ranks, name, -1, true));
    if (s.world.root()) EXPECT_EQ(read(s, name), want) << ranks << " ranks";
  }
}

TEST(EngineRanks, ATreeFoldIsBitwiseTheSameForOneTwoAndThreeRanksAndAnyBatchSize) {
  Shared s;
  std::vector<double> sums;  // (rank 0's values are the ones compared)
  for (int ranks = 1; ranks <= std::min(3, s.world.size()); ++ranks)
    for (std::uint64_t batch : {10u, 70u, 300u}) sums.push_back(tree_sum_on(s, ranks, batch));
  if (!s.world.root()) return;
  double naive = 0;  // left to right over the rows: close, but not the tree's rounding
  for (std::uint64_t r = 0; r < kRows; ++r) naive += std::sqrt(static_cast<double>(s.x[r]) * 1.0000001);
  for (double v : sums) {
    EXPECT_EQ(std::memcmp(&v, &sums[0], 8), 0) << v << " vs " << sums[0];
    EXPECT_NEAR(v, naive, 1e-9 * naive);
  }
}

TEST(EngineRanks, ExchangedOutputStoppedOnThreeRanksResumesOnTwo) {
  Shared s;
  if (s.world.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const auto want = expected(s);
  ASSERT_FALSE(run_on(s, 3, "moved", 4, true));  // stops at a round boundary after batch 4
  ASSERT_TRUE(run_on(s, 2, "moved", -1, false));
  if (s.world.root()) EXPECT_EQ(read(s, "moved"), want);
}

// Row r gives the row {x[r], r*r} to "rows" and appends appended_by(r) rows {mix(x[r] + j), r}
// to "appended" (not exchanged: in batch order).
class RowsKernel final : public engine::PassKernel {
 public:
  explicit RowsKernel(std::int64_t stop_at) : stop_at_(stop_at) {}
  void process(const engine::BatchView& b) override {
    const auto* x = static_cast<const std::uint64_t*>(b.inputs[0]);
    auto* rows = static_cast<std::uint64_t*>(b.outputs[0]);
    auto* appended = static_cast<std::uint64_t*>(b.outputs[1]);
    std::uint64_t n = 0;
    for (std::uint64_t r = 0; r < b.rows.size(); ++r) {
      const std::uint64_t row = b.rows.begin + r;
      rows[2 * r] = x[r];
      rows[2 * r + 1] = row * row;
      for (std::uint64_t j = 0; j < appended_by(row); ++j, ++n) {
        appended[2 * n] = mix(x[r] + j);
        appended[2 * n + 1] = row;
      }
    }
    b.appended[1][0] = n;
    if (stop_at_ >= 0 && static_cast<std::int64_t>(b.index) == stop_at_) signals::request_stop(SIGTERM);
  }

 private:
  std::int64_t stop_at_;
};

struct RowsRun {
  bool complete = false;
  std::uint64_t collective_calls = 0;  // rank 0's
};

// A pass of 25-row batches with a rows and an appended output on the first `ranks` ranks,
// committing every round (`every_round`) or only at the end.
RowsRun rows_run_on(const Shared& s, int ranks, const std::string& name, std::int64_t stop_at, bool fresh,
                    bool every_round) {
  RowsRun result;
  on_first_ranks(s, ranks, [&](const mpi::Comm& comm) {
    EngineOn on(s, comm, name, fresh, 25, every_round ? 0.0 : 1e9);
    auto& engine = on.engine;
    auto& work = on.work;
    XPass pass(s, 25);
    pass.spec.outputs.push_back({"rows", h5::DType::uint64, {kRows, 2}, {25, 2}});
    engine::OutputDecl appended{"appended", h5::DType::uint64, {kRows * 4, 2}, {512, 2}};
    appended.kind = engine::OutputKind::appended;
    appended.max_rows_per_row = 4;
    pass.spec.outputs.push_back(appended);
    RowsKernel kernel(stop_at);
    const std::uint64_t before = h5::collective_dataset_calls();
    auto outcome = engine.run(pass.spec, kernel, nullptr, work, s.dir / (name + ".h5"), nullptr);
    result.complete = outcome.complete;
    result.collective_calls = h5::collective_dataset_calls() - before;
    if (outcome.complete) outcome.staged.commit();
  });
  signals::request_stop(0);
  result.complete = s.world.any(result.complete);
  result.collective_calls = s.world.broadcast(result.collective_calls);
  return result;
}

// Rank 0: the output `name` of the run `run`, as a flat list of u64.
std::vector<std::uint64_t> read_output(const Shared& s, const std::string& run, const std::string& name) {
  h5::File f = h5::File::open(s.dir / (run + ".h5"), h5::Mode::read_only);
  h5::Dataset d = f.open_dataset(name);
  std::vector<std::uint64_t> v(d.shape()[0] * 2);
  if (!v.empty()) d.read_all(v.data());
  return v;
}

// Ranks write their rows in place, without collective MPI-IO per round: in a pass of 40 rounds on
// 3 ranks each output's room doubles when a round needs more, and the segment gets its exact
// extent when it closes: a few extent changes, not one per round. A run stopped on 3 ranks
// (commits every round) resumes on 2, and every run gives 1 rank's bytes.
TEST(EngineRanks, RanksWriteRowsInPlaceWithoutCollectiveCallsPerRound) {
  Shared s;
  if (s.world.size() < 3) GTEST_SKIP() << "needs 3 ranks";
  ASSERT_TRUE(rows_run_on(s, 1, "rows-1", -1, true, false).complete);
  const RowsRun one_segment = rows_run_on(s, 3, "rows-3", -1, true, false);
  ASSERT_TRUE(one_segment.complete);
  // 120 batches in 40 rounds: 75 rows a round (room for 75, 150, ..., 2400, then the pass's 3000)
  // and about 150 appended ones (room for 150, ..., 9600, then cut to the exact extent): at most
  // 8 extent changes each, and no collective writes.
  EXPECT_LE(one_segment.collective_calls, 16u) << "collective MPI-IO calls in a pass of 40 rounds on 3 ranks";
  ASSERT_FALSE(rows_run_on(s, 3, "rows-stopped", 7, true, true).complete);  // stops at a round boundary
  ASSERT_TRUE(rows_run_on(s, 2, "rows-stopped", -1, false, true).complete);
  if (!s.world.root()) return;
  std::vector<std::uint64_t> rows, appended;
  for (std::uint64_t r = 0; r < kRows; ++r) {
    rows.insert(rows.end(), {s.x[r], r * r});
    for (std::uint64_t j = 0; j < appended_by(r); ++j) appended.insert(appended.end(), {mix(s.x[r] + j), r});
  }
  for (const std::string run : {"rows-1", "rows-3", "rows-stopped"}) {
    EXPECT_EQ(read_output(s, run, "rows"), rows) << run;
    EXPECT_EQ(read_output(s, run, "appended"), appended) << run;
  }
}

// A collective write whose ranks write different numbers of rows goes in pieces of at most the
// writer's byte limit, as many calls on every rank (OpenMPI's two_phase crashed past 2 GiB);
// here a limit of 7 rows makes rank r's 5 + 11 r rows take up to 4 calls while the others wait.
// (Chunks of 2 of the 3 columns: rows not in place as plain bytes, so HDF5 writes them.)
TEST(EngineRanks, CollectiveWritesOfUnequalSizesGoInAgreedPieces) {
  Shared s;
  const std::uint64_t cols = 3;
  std::vector<std::uint64_t> first{0};
  for (int r = 0; r < s.world.size(); ++r) first.push_back(first.back() + 5 + 11 * static_cast<std::uint64_t>(r));
  const std::uint64_t mine = first[s.world.rank() + 1] - first[s.world.rank()], most = first.back() - first[first.size() - 2];
  std::vector<std::uint64_t> rows(mine * cols);
  for (std::uint64_t i = 0; i < rows.size(); ++i) rows[i] = first[s.world.rank()] * cols + i;
  {
    h5::File f = h5::File::create(s.dir / "pieces.h5", MPI_COMM_WORLD);
    {
      h5::Dataset d = f.create_dataset("y", {h5::DType::uint64, {first.back(), cols}, {4, 2}, false, false});
      h5::RowWriter writer(d, 7 * cols * 8);
      writer.write(first[s.world.rank()], mine, rows.data(), most);
    }
    f.close();
  }
  s.world.barrier();
  if (!s.world.root()) return;
  h5::File f = h5::File::open(s.dir / "pieces.h5", h5::Mode::read_only);
  std::vector<std::uint64_t> back(first.back() * cols);
  f.open_dataset("y").read_all(back.data());
  for (std::uint64_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], i) << "element " << i;
}

}  // namespace
}  // namespace qstage

int main(int argc, char** argv) { return qstage::test::run_all_tests_on_every_rank(argc, argv); }
