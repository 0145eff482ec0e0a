// comm::Communicator under mpirun (ctest runs it on 3 ranks; it holds for any number). Every
// element sent encodes (source rank, destination rank, index), and every rank can compute what
// each rank sends, so each receiver checks every element it gets and where it lands.
//
// The GPU case needs NCCL and a GPU per rank (mpirun -np 2 on a 2-GPU machine); elsewhere it skips.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/mpi.hpp"
#include "gtest_mpi.hpp"

namespace qstage::comm {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// Elements `src` sends to `dst` in scenario `seed`: random, a quarter of them zero, and rank
// seed % size sends nothing at all.
std::uint64_t count_of(int seed, int src, int dst, int size) {
  if (src == seed % size) return 0;
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 1000003u + static_cast<std::uint64_t>(src) * 1009u +
                      static_cast<std::uint64_t>(dst));
  return rng() % 4 == 0 ? 0 : rng() % 300;
}

std::uint64_t element(int src, int dst, std::uint64_t index) {
  return (static_cast<std::uint64_t>(src) << 48) | (static_cast<std::uint64_t>(dst) << 32) | index;
}

struct Plan {
  Counts send_counts, recv_counts;
  std::vector<std::uint64_t> send, expected;
};

Plan plan_for(int seed, int rank, int size) {
  Plan plan;
  for (int p = 0; p < size; ++p) {
    plan.send_counts.push_back(count_of(seed, rank, p, size));
    plan.recv_counts.push_back(count_of(seed, p, rank, size));
    for (std::uint64_t i = 0; i < plan.send_counts.back(); ++i) plan.send.push_back(element(rank, p, i));
    for (std::uint64_t i = 0; i < plan.recv_counts.back(); ++i) plan.expected.push_back(element(p, rank, i));
  }
  return plan;
}

// "" if equal, else where the first difference is.
std::string first_difference(const std::vector<std::uint64_t>& got, const std::vector<std::uint64_t>& expected) {
  if (got.size() != expected.size())
    return "got " + std::to_string(got.size()) + " elements, expected " + std::to_string(expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i])
      return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
             std::to_string(expected[i]);
  return "";
}

class CommTest : public ::testing::Test {
 protected:
  mpi::Comm world;
  Communicator comm{world};
};

TEST(CommPieces, CountsAboveIntMaxSplitIntoIntSizedPiecesThatCoverEveryByte) {
  // Arithmetic only: nothing of these sizes is allocated.
  for (std::uint64_t bytes : {std::uint64_t{1} << 31, (std::uint64_t{5} << 31) + 7, std::uint64_t{1} << 40,
                              std::uint64_t{INT_MAX} + 1, std::uint64_t{3} * kGiB}) {
    for (std::uint64_t piece : {kGiB, std::uint64_t{INT_MAX}, std::uint64_t{1} << 20}) {
      const detail::Pieces pieces{bytes, piece};
      ASSERT_EQ(pieces.count(), (bytes + piece - 1) / piece) << bytes << " in pieces of " << piece;
      std::uint64_t covered = 0;
      for (std::uint64_t i = 0; i < pieces.count(); ++i) {
        ASSERT_EQ(pieces.offset(i), covered);
        ASSERT_GT(pieces.size(i), 0);
        ASSERT_LE(static_cast<std::uint64_t>(pieces.size(i)), piece);
        covered += static_cast<std::uint64_t>(pieces.size(i));
      }
      EXPECT_EQ(covered, bytes) << bytes << " in pieces of " << piece;
    }
  }
  const detail::Pieces odd{(std::uint64_t{5} << 31) + 7, kGiB};
  EXPECT_EQ(odd.count(), 11u);
  EXPECT_EQ(odd.size(10), 7);
  EXPECT_EQ(odd.offset(10), 10 * kGiB);
  EXPECT_EQ((detail::Pieces{0, kGiB}.count()), 0u);
  EXPECT_EQ((detail::Pieces{2 * kGiB, kGiB}.count()), 2u);
  EXPECT_EQ((detail::Pieces{2 * kGiB, kGiB}.size(1)), static_cast<int>(kGiB));
}

TEST(CommPieces, DisplacementsAreExclusivePrefixSums) {
  EXPECT_EQ(displacements({3, 0, 5, std::uint64_t{1} << 33, 1}),
            (Counts{0, 3, 3, 8, (std::uint64_t{1} << 33) + 8}));
  EXPECT_EQ(displacements({}), Counts{});
}

TEST_F(CommTest, PieceSizeMustFitAnInt) {
  EXPECT_THROW(comm.set_piece_bytes(0), std::logic_error);
  EXPECT_THROW(comm.set_piece_bytes(std::uint64_t{INT_MAX} + 1), std::logic_error);
  EXPECT_EQ(comm.piece_bytes(), Communicator::kDefaultPieceBytes);
  comm.set_piece_bytes(INT_MAX);
  EXPECT_EQ(comm.piece_bytes(), static_cast<std::uint64_t>(INT_MAX));
}

TEST_F(CommTest, CountsGoToTheirPeers) {
  const int size = comm.size(), rank = comm.rank();
  Counts send(static_cast<std::size_t>(size)), expected(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    // Above 2^32, so a 32-bit count anywhere on the way would show.
    send[static_cast<std::size_t>(p)] = (std::uint64_t{1} << 40) + static_cast<std::uint64_t>(rank * 100 + p);
    expected[static_cast<std::size_t>(p)] = (std::uint64_t{1} << 40) + static_cast<std::uint64_t>(p * 100 + rank);
  }
  EXPECT_EQ(comm.alltoall_counts(send), expected);
}

TEST_F(CommTest, AlltoallvPutsEachPeersBlockInRankOrder) {
  for (int seed = 0; seed < 6; ++seed) {
    const Plan plan = plan_for(seed, comm.rank(), comm.size());
    // Room past the end, which must stay untouched.
    constexpr std::uint64_t kSentinel = ~std::uint64_t{0};
    std::vector<std::uint64_t> recv(plan.expected.size() + 5, kSentinel);
    comm.alltoallv(HostSpan<const std::uint64_t>(plan.send.data(), plan.send.size()), plan.send_counts,
                   HostSpan<std::uint64_t>(recv.data(), recv.size()), plan.recv_counts);
    std::vector<std::uint64_t> tail(recv.end() - 5, recv.end());
    recv.resize(plan.expected.size());
    EXPECT_EQ(first_difference(recv, plan.expected), "") << "seed " << seed << ", rank " << comm.rank();
    EXPECT_EQ(tail, std::vector<std::uint64_t>(5, kSentinel)) << "seed " << seed << ", rank " << comm.rank();
  }
}

TEST_F(CommTest, ManySmallPiecesGiveTheSameResult) {
  // Tiny pieces stand in for counts above INT_MAX: each message goes in many pieces, and with
  // 3 or 13 bytes a piece boundary falls inside an element.
  for (std::uint64_t piece : {std::uint64_t{3}, std::uint64_t{8}, std::uint64_t{13}, std::uint64_t{64}}) {
    comm.set_piece_bytes(piece);
    for (int seed = 0; seed < 3; ++seed) {
      const Plan plan = plan_for(seed, comm.rank(), comm.size());
      std::vector<std::uint64_t> recv(plan.expected.size());
      comm.alltoallv(HostSpan<const std::uint64_t>(plan.send.data(), plan.send.size()), plan.send_counts,
                     HostSpan<std::uint64_t>(recv.data(), recv.size()), plan.recv_counts);
      EXPECT_EQ(first_difference(recv, plan.expected), "")
          << "piece " << piece << " bytes, seed " << seed << ", rank " << comm.rank();
    }
  }
}

struct Record {
  std::uint32_t src;
  std::uint32_t dst;
  std::uint64_t index;
  double weight;
};

TEST_F(CommTest, ExchangeSendsCountsThenData) {
  comm.set_piece_bytes(40);  // a Record is 24 bytes: pieces cut through records
  for (int seed = 3; seed < 6; ++seed) {
    const int rank = comm.rank(), size = comm.size();
    std::vector<Record> send;
    Counts send_counts;
    for (int p = 0; p < size; ++p) {
      send_counts.push_back(count_of(seed, rank, p, size));
      for (std::uint64_t i = 0; i < send_counts.back(); ++i)
        send.push_back({static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(p), i, 0.5 * static_cast<double>(i)});
    }
    const Received<Record> got = comm.exchange(send, send_counts);
    Counts expected_counts;
    for (int p = 0; p < size; ++p) expected_counts.push_back(count_of(seed, p, rank, size));
    EXPECT_EQ(got.counts, expected_counts) << "seed " << seed << ", rank " << rank;
    if (got.counts != expected_counts) continue;  // (not ASSERT: the other ranks go on exchanging)
    std::size_t at = 0, wrong = 0;
    for (int p = 0; p < size; ++p)
      for (std::uint64_t i = 0; i < expected_counts[static_cast<std::size_t>(p)]; ++i, ++at) {
        const Record& r = got.data.at(at);
        wrong += r.src != static_cast<std::uint32_t>(p) || r.dst != static_cast<std::uint32_t>(rank) || r.index != i ||
                 r.weight != 0.5 * static_cast<double>(i);
      }
    EXPECT_EQ(got.data.size(), at) << "seed " << seed << ", rank " << rank;
    EXPECT_EQ(wrong, 0u) << "seed " << seed << ", rank " << rank;
  }
}

TEST_F(CommTest, CpuBackendDeviceBuffersGoThroughMpi) {
  auto backend = qstage::detail::make_cpu_backend(std::uint64_t{1} << 30, std::uint64_t{1} << 30);
  auto stream = backend->make_stream();
  Communicator on_backend(world, backend.get());
  on_backend.set_piece_bytes(16);
  const Plan plan = plan_for(1, comm.rank(), comm.size());
  Buffer send = backend->alloc_device(plan.send.size() * sizeof(std::uint64_t) + 8, "test send");
  Buffer recv = backend->alloc_device(plan.expected.size() * sizeof(std::uint64_t) + 8, "test recv");
  backend->copy_to_device(send.data(), plan.send.data(), plan.send.size() * sizeof(std::uint64_t), *stream);
  on_backend.alltoallv(device_span<const std::uint64_t>(send), plan.send_counts, device_span<std::uint64_t>(recv),
                       plan.recv_counts, *stream);
  std::vector<std::uint64_t> got(plan.expected.size());
  backend->copy_to_host(got.data(), recv.data(), got.size() * sizeof(std::uint64_t), *stream);
  stream->synchronize();
  EXPECT_EQ(first_difference(got, plan.expected), "") << "rank " << comm.rank();
}

TEST_F(CommTest, WrongCountsAreRefusedBeforeAnythingIsSent) {
  // Every rank makes the same mistake, so every rank throws and none waits for a message.
  std::vector<std::uint64_t> send(10), recv(10);
  const auto size = static_cast<std::size_t>(comm.size());
  Counts too_few(size - 1, 0), fits(size, 0), too_many(size, 0);
  too_many[0] = 11;
  EXPECT_THROW(comm.alltoallv(HostSpan<std::uint64_t>(send.data(), 10), too_few, HostSpan<std::uint64_t>(recv.data(), 10), fits),
               std::logic_error);
  EXPECT_THROW(comm.alltoallv(HostSpan<std::uint64_t>(send.data(), 10), too_many, HostSpan<std::uint64_t>(recv.data(), 10), fits),
               std::logic_error);
  EXPECT_THROW(comm.alltoallv(HostSpan<std::uint64_t>(send.data(), 10), fits, HostSpan<std::uint64_t>(recv.data(), 10), too_many),
               std::logic_error);
  EXPECT_THROW(comm.alltoall_counts(too_few), std::logic_error);
}

// Every rank's elements everywhere, in rank order, whatever each sends (rank 1 none), in pieces
// that cut through the elements.
TEST_F(CommTest, AllgathervGivesEveryRanksElementsInRankOrder) {
  const int size = comm.size(), rank = comm.rank();
  auto elements_of = [](int r) {
    std::vector<std::uint64_t> v(r == 1 ? 0 : static_cast<std::size_t>(3 + 5 * r));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint64_t>(r) * 1000 + i;
    return v;
  };
  for (const std::uint64_t piece : {std::uint64_t{13}, Communicator::kDefaultPieceBytes}) {
    comm.set_piece_bytes(piece);
    const std::vector<std::uint64_t> mine = elements_of(rank);
    const auto got = comm.allgatherv(HostSpan<const std::uint64_t>(mine.data(), mine.size()));
    std::vector<std::uint64_t> want;
    Counts counts;
    for (int p = 0; p < size; ++p) {
      const auto theirs = elements_of(p);
      want.insert(want.end(), theirs.begin(), theirs.end());
      counts.push_back(theirs.size());
    }
    EXPECT_EQ(got.counts, counts) << "rank " << rank << ", pieces of " << piece;
    EXPECT_EQ(got.data, want) << "rank " << rank << ", pieces of " << piece;

    // The same through "device" buffers of the cpu backend (MPI), into a buffer with room to spare.
    auto backend = qstage::detail::make_cpu_backend(std::uint64_t{1} << 30, std::uint64_t{1} << 30);
    auto stream = backend->make_stream();
    Communicator on_backend(world, backend.get());
    on_backend.set_piece_bytes(piece);
    Buffer from = backend->alloc_device(mine.size() * 8 + 8, "test mine");
    Buffer to = backend->alloc_device(want.size() * 8 + 16, "test all");
    if (!mine.empty()) std::memcpy(from.data(), mine.data(), mine.size() * 8);
    on_backend.allgatherv(device_span<const std::uint64_t>(from), device_span<std::uint64_t>(to), counts, *stream);
    stream->synchronize();
    EXPECT_EQ(std::vector<std::uint64_t>(to.as<std::uint64_t>(), to.as<std::uint64_t>() + want.size()), want)
        << "rank " << rank << ", device buffers, pieces of " << piece;
    Counts too_many = counts;
    too_many[static_cast<std::size_t>(rank)] = mine.size() + 2;  // (more than its buffer holds: refused on every rank)
    EXPECT_THROW(on_backend.allgatherv(device_span<const std::uint64_t>(from), device_span<std::uint64_t>(to), too_many,
                                       *stream),
                 std::logic_error);
  }
}

TEST_F(CommTest, AllgatherAndBroadcast) {
  const int size = comm.size(), rank = comm.rank();
  const std::vector<std::int64_t> all = comm.allgather(std::int64_t{7} * rank - 3);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) EXPECT_EQ(all[static_cast<std::size_t>(p)], std::int64_t{7} * p - 3);

  comm.set_piece_bytes(5);
  const int root = size - 1;
  std::vector<double> splitters;
  if (rank == root)
    for (int i = 0; i < 37; ++i) splitters.push_back(1.5 * i);
  else
    splitters.assign(3, -1.0);  // ignored: the root's values replace them
  const std::vector<double> got = comm.broadcast(splitters, root);
  ASSERT_EQ(got.size(), 37u) << "rank " << rank;
  for (int i = 0; i < 37; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], 1.5 * i) << "rank " << rank;
  EXPECT_THROW(comm.broadcast(splitters, size), std::logic_error);
}

// mpi::Comm::gather (the engine's per-round records): rank r sends r * 1000 + 1 bytes that name
// it, rank 1 nothing; rank 0 gets them in rank order, the others nothing.
TEST(MpiComm, GatherGivesRankZeroEveryRanksBytesInRankOrder) {
  mpi::Comm world;
  const int size = world.size(), rank = world.rank();
  auto bytes_of = [](int r) {
    return r == 1 ? std::string() : std::string(static_cast<std::size_t>(r) * 1000 + 1, static_cast<char>('a' + r % 26));
  };
  const std::vector<std::string> got = world.gather(bytes_of(rank));
  if (rank != 0) {
    EXPECT_TRUE(got.empty()) << "rank " << rank;
    return;
  }
  ASSERT_EQ(got.size(), static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], bytes_of(r)) << "from rank " << r;
}

TEST(CommNccl, DeviceBuffersOnTwoGpusGoThroughNccl) {
  mpi::Comm world;
#if defined(QSTAGE_HAVE_NCCL)
  const int gpus = qstage::detail::cuda_device_count();
  // The same answer on every rank, so all skip or none does.
  if (world.any(gpus < 2 || world.local_rank() >= gpus))
    GTEST_SKIP() << "NCCL test skipped: needs 2 or more GPUs and one GPU per rank on each host";
  BackendOptions options;
  options.device = "cuda";
  options.device_memory = std::uint64_t{1} << 30;
  options.local_rank = world.local_rank();
  auto backend = make_backend(options);
  auto stream = backend->make_stream();
  Communicator comm(world, backend.get());
  for (int seed = 0; seed < 4; ++seed) {
    const Plan plan = plan_for(seed, comm.rank(), comm.size());
    const std::size_t send_bytes = plan.send.size() * sizeof(std::uint64_t);
    const std::size_t recv_bytes = plan.expected.size() * sizeof(std::uint64_t);
    Buffer send = backend->alloc_device(send_bytes + 8, "test send");
    Buffer recv = backend->alloc_device(recv_bytes + 8, "test recv");
    backend->copy_to_device(send.data(), plan.send.data(), send_bytes, *stream);
    comm.alltoallv(device_span<const std::uint64_t>(send), plan.send_counts, device_span<std::uint64_t>(recv),
                   plan.recv_counts, *stream);
    std::vector<std::uint64_t> got(plan.expected.size());
    backend->copy_to_host(got.data(), recv.data(), recv_bytes, *stream);
    stream->synchronize();
    EXPECT_EQ(first_difference(got, plan.expected), "") << "seed " << seed << ", rank " << comm.rank();
  }
  // allgatherv: each rank's block sent from one place to every peer (rank r: 3 + 5 r elements).
  Counts counts;
  std::vector<std::uint64_t> want;
  for (int p = 0; p < comm.size(); ++p) {
    counts.push_back(static_cast<std::uint64_t>(3 + 5 * p));
    for (std::uint64_t i = 0; i < counts.back(); ++i) want.push_back(static_cast<std::uint64_t>(p) * 1000 + i);
  }
  const std::uint64_t own = counts[static_cast<std::size_t>(comm.rank())];
  std::vector<std::uint64_t> mine(
      want.begin() + static_cast<std::ptrdiff_t>(displacements(counts)[static_cast<std::size_t>(comm.rank())]),
      want.begin() + static_cast<std::ptrdiff_t>(displacements(counts)[static_cast<std::size_t>(comm.rank())] + own));
  Buffer from = backend->alloc_device(own * 8, "test mine");
  Buffer to = backend->alloc_device(want.size() * 8, "test all");
  backend->copy_to_device(from.data(), mine.data(), own * 8, *stream);
  comm.allgatherv(device_span<const std::uint64_t>(from), device_span<std::uint64_t>(to), counts, *stream);
  std::vector<std::uint64_t> got(want.size());
  backend->copy_to_host(got.data(), to.data(), want.size() * 8, *stream);
  stream->synchronize();
  EXPECT_EQ(first_difference(got, want), "") << "allgatherv, rank " << comm.rank();
#else
  GTEST_SKIP() << "NCCL test skipped: this build has no NCCL";
#endif
}

}  // namespace
}  // namespace qstage::comm

int main(int argc, char** argv) { return qstage::test::run_all_tests_on_every_rank(argc, argv); }
