// Parallel row I/O: the same bytes as HDF5's own path, on every layout it accepts, and a clean
// fallback to HDF5 for the layouts it refuses.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>

#include "io/h5.hpp"
#include "io/row_io.hpp"
#include "test_util.hpp"

using namespace qstage;

namespace {

std::vector<float> iota(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.5f);
  return v;
}

}  // namespace

TEST(IoPool, RunsEveryJobOnceAndPropagatesErrors) {
  h5::IoPool pool(4);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> hits(97);
    pool.run(hits.size(), [&](std::size_t i) { hits[i]++; });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.run(10, [](std::size_t i) {
    if (i == 7) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<int> after{0};
  pool.run(5, [&](std::size_t) { after++; });  // still usable
  EXPECT_EQ(after.load(), 5);
}

TEST(RowIo, ParallelReadsMatchHdf5OnEveryLayout) {
  test::TempDir dir;
  const std::uint64_t rows = 1000, cols = 6;
  const auto data = iota(rows * cols);
  struct Layout { const char* name; h5::Shape chunk; bool parallel; };
  const Layout layouts[] = {{"contiguous", {}, true},
                            {"row_chunks", {64, cols}, true},
                            {"partial_row_chunks", {64, 3}, false}};
  {
    h5::File f = h5::File::create(dir.path / "in.h5");
    for (const auto& l : layouts) f.create_dataset(l.name, {h5::DType::float32, {rows, cols}, l.chunk, false}).write_all(data.data());
    f.close();
  }
  h5::File f = h5::File::open(dir.path / "in.h5", h5::Mode::read_only);
  for (const auto& l : layouts) {
    h5::Dataset d = f.open_dataset(l.name);
    h5::RowReader reader(d);
    EXPECT_EQ(reader.parallel(), l.parallel) << l.name;
    for (auto [row0, n] : {std::pair<std::uint64_t, std::uint64_t>{0, rows}, {37, 500}, {960, 40}, {999, 1}}) {
      std::vector<float> got(n * cols, -1), want(n * cols, -2);
      reader.read(row0, n, got.data());
      d.read_rows(row0, n, want.data());
      ASSERT_EQ(got, want) << l.name << " rows " << row0 << "+" << n;
    }
  }
}

TEST(RowIo, ParallelWritesIntoEarlyAllocatedExtendibleDatasets) {
  test::TempDir dir;
  const std::uint64_t cols = 5;
  const auto data = iota(777 * cols);
  {
    h5::File f = h5::File::create(dir.path / "out.h5");
    h5::Dataset d = f.create_dataset("y", {h5::DType::float32, {0, cols}, {100, cols}, true, true});
    h5::RowWriter writer(d);
    EXPECT_TRUE(writer.parallel());
    for (std::uint64_t r = 0; r < 777; r += 300) {
      const std::uint64_t n = std::min<std::uint64_t>(300, 777 - r);
      d.set_rows(r + n);
      writer.refresh();
      writer.write(r, n, data.data() + r * cols, n);
    }
    f.close();
  }
  h5::File f = h5::File::open(dir.path / "out.h5", h5::Mode::read_only);
  std::vector<float> back(777 * cols);
  f.open_dataset("y").read_all(back.data());
  EXPECT_EQ(back, data);
}

TEST(RowIo, WritesWithoutEarlyAllocationFallBackToHdf5) {
  test::TempDir dir;
  const auto data = iota(50 * 2);
  {
    h5::File f = h5::File::create(dir.path / "late.h5");
    h5::Dataset d = f.create_dataset("y", {h5::DType::float32, {50, 2}, {10, 2}, false, false});
    h5::RowWriter writer(d);
    writer.write(0, 50, data.data(), 50);  // chunks not allocated yet: HDF5 writes them
    f.close();
  }
  h5::File f = h5::File::open(dir.path / "late.h5", h5::Mode::read_only);
  std::vector<float> back(100);
  f.open_dataset("y").read_all(back.data());
  EXPECT_EQ(back, data);
}
