// keys::unique_over_ranks (ctest runs it on 3 ranks): the de-duplication divided between ranks,
// each holding whole tiles of the rows (a rank may hold none), gives ResidentChain's keys, counts
// and values on one rank, bit for bit, end to end over the ranks in rank order, and with the
// reverse index ResidentChain's index, each rank its rows'. The oracle is ResidentChain over
// every row on every rank. Both run on the CPU's backend and, where a GPU is visible, on the
// GPU's (the ranks sharing it: the communicator's staged exchange).
#include <gtest/gtest.h>
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/mpi.hpp"
#include "gtest_mpi.hpp"
#include "stages/keys/dedup_resident.hpp"

namespace qstage {
namespace {

// Rows of `words` key words and an interleaved value (SCI's candidate records): keys from a
// small alphabet (many duplicates, spread over many tiles), values of every magnitude.
std::vector<std::uint64_t> make_rows(std::uint64_t rows, std::uint32_t words, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint64_t> out;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t pick = rng() % (rows / 3 + 1);
    for (std::uint32_t w = 0; w < words; ++w) out.push_back(w + 1 == words ? pick * 0x9e3779b97f4a7c15ULL : pick % 5);
    out.push_back(std::bit_cast<std::uint64_t>(std::ldexp(static_cast<double>(rng() % 2000001) - 1e6, -static_cast<int>(rng() % 40))));
  }
  return out;
}

struct Flat {
  std::vector<std::uint64_t> keys, counts, values, index;
};

// The backends the cases run on: the CPU's, then the GPU's where this build and machine have one
// (the same answer on every rank, so every rank runs the same collectives).
std::vector<std::unique_ptr<Backend>> backends(const mpi::Comm& world) {
  std::vector<std::unique_ptr<Backend>> out;
  out.push_back(detail::make_cpu_backend(1ull << 30, 1ull << 30));
  if (!world.any(detail::cuda_device_count() < 1)) {
    BackendOptions options{"cuda", 1ull << 30, 1ull << 30, world.local_rank()};
    options.bind = false;
    out.push_back(make_backend(options));
  }
  return out;
}

// `bytes` of host memory in a new device buffer (at least 8 bytes), and a device buffer's first
// `count` words on the host.
Buffer to_device(Backend& backend, Stream& stream, const void* host, std::uint64_t bytes, const char* what) {
  Buffer b = backend.alloc_device(std::max<std::uint64_t>(bytes, 8), what);
  if (bytes) backend.copy_to_device(b.data(), host, bytes, stream);
  stream.synchronize();
  return b;
}
std::vector<std::uint64_t> to_host(Backend& backend, Stream& stream, const Buffer& b, std::uint64_t count) {
  std::vector<std::uint64_t> out(count);
  if (count) backend.copy_to_host(out.data(), b.data(), count * 8, stream);
  stream.synchronize();
  return out;
}

// The rows' keys apart (words each) and their values apart, as keys.dedup reads them.
struct Apart {
  std::vector<std::uint64_t> keys;
  std::vector<double> values;
};
Apart apart(const std::vector<std::uint64_t>& rows, std::uint32_t words) {
  Apart a;
  for (std::size_t at = 0; at < rows.size(); at += words + 1) {
    a.keys.insert(a.keys.end(), rows.begin() + static_cast<std::ptrdiff_t>(at),
                  rows.begin() + static_cast<std::ptrdiff_t>(at + words));
    a.values.push_back(std::bit_cast<double>(rows[at + words]));
  }
  return a;
}

// `in`: host rows (keys apart, values apart or none, or interleaved), moved to the backend's device.
Flat one_rank(Backend& backend, kernels::KeyRows in, std::uint64_t tile_rows, bool index) {
  auto stream = backend.make_stream(false);
  const std::uint64_t n = in.rows;
  Buffer keys = to_device(backend, *stream, in.keys, in.stride * n * 8, "test keys");
  Buffer values = to_device(backend, *stream, in.values, in.has_value() && !in.interleaved ? n * 8 : 0, "test values");
  in.keys = keys.as<std::uint64_t>();
  if (in.has_value() && !in.interleaved) in.values = values.as<double>();
  const kernels::RecordLayout layout{in.words, in.has_value(), index};
  stages::keys::ResidentChain chain(backend, *stream, layout, n, tile_rows, kernels::tiles_of(n, tile_rows) * tile_rows,
                                    [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); });
  chain.add(in, 0);
  const stages::keys::ResidentChain::Unique u = chain.finish();
  Flat f;
  f.keys = to_host(backend, *stream, u.keys, u.unique * in.words);
  f.counts = to_host(backend, *stream, u.counts, u.unique);
  if (in.has_value()) f.values = to_host(backend, *stream, u.values, u.unique);
  if (index) f.index = to_host(backend, *stream, u.index, n);
  return f;
}

// Rank r's rows: [first[r], first[r + 1]), whole tiles (but the last rank's end).
Flat divided(Backend& backend, comm::Communicator& ranks, const std::vector<std::uint64_t>& rows, std::uint32_t words,
             std::uint64_t tile_rows, const std::vector<std::uint64_t>& first) {
  auto stream = backend.make_stream(false);
  const std::size_t me = static_cast<std::size_t>(ranks.rank());
  const std::uint64_t mine = first[me + 1] - first[me], S = words + 1;
  Buffer in = to_device(backend, *stream, rows.data() + first[me] * S, mine * S * 8, "test rows");
  const auto take = [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); };
  const kernels::KeyRows rows_in = kernels::KeyRows::interleaved_rows(in.as<std::uint64_t>(), words, mine);
  std::optional<stages::keys::ResidentChain::Unique> u = stages::keys::unique_over_ranks(
      backend, *stream, ranks, {rows_in, std::move(in), first[me]}, tile_rows, 4, false, 1ull << 40, take);
  EXPECT_TRUE(u.has_value());
  const auto gather = [&](const Buffer& b, std::uint64_t n) {
    const std::vector<std::uint64_t> here = to_host(backend, *stream, b, n);
    return ranks.allgatherv(comm::HostSpan<const std::uint64_t>(here.data(), n)).data;
  };
  Flat f;
  f.keys = gather(u->keys, u->unique * words);
  f.counts = gather(u->counts, u->unique);
  f.values = gather(u->values, u->unique);
  return f;
}

TEST(DedupRanks, DividedIsOneRanksBytes) {
  const mpi::Comm world;
  for (const auto& backend : backends(world)) {
    comm::Communicator ranks(world, backend.get());
    const auto P = static_cast<std::uint64_t>(ranks.size());
    for (const std::uint32_t words : {1u, 2u, 3u, 4u})
      for (const std::uint64_t tile_rows : {1ull, 7ull, 64ull}) {
        const std::uint64_t n = 5003;
        const std::vector<std::uint64_t> rows = make_rows(n, words, 17 * words + tile_rows);
        const Flat want =
            one_rank(*backend, kernels::KeyRows::interleaved_rows(rows.data(), words, n), tile_rows, false);
        const std::uint64_t tiles = kernels::tiles_of(n, tile_rows);
        // Shares: even ones; rank 1 holding none; every row on the last rank.
        std::vector<std::uint64_t> even(P + 1), last(P + 1, 0);
        for (std::uint64_t r = 0; r <= P; ++r) even[r] = std::min(n, tiles * r / P * tile_rows);
        std::vector<std::uint64_t> gap = even;
        if (P > 2) gap[2] = gap[1];  // (rank 1 holds none)
        last[P] = n;                 // (every row on the last rank)
        for (auto* shares : {&even, &gap, &last}) {
          (*shares)[0] = 0, (*shares)[P] = n;
          const Flat got = divided(*backend, ranks, rows, words, tile_rows, *shares);
          const std::string where = std::string(backend_name(backend->kind())) + ", words " + std::to_string(words) +
                                    ", tiles of " + std::to_string(tile_rows);
          EXPECT_EQ(got.keys, want.keys) << where;
          EXPECT_EQ(got.counts, want.counts) << where;
          EXPECT_EQ(got.values, want.values) << where;  // (the values' bits)
        }
      }
  }
}

// With the reverse index, rank r holding rows [first[r], first[r + 1]), keys and values apart, or
// keys alone. (The GPU's chain needs the equal shares of share_width; the CPU's radix sort any.)
Flat divided_with_index(Backend& backend, comm::Communicator& ranks, const Apart& rows, std::uint32_t words,
                        bool values, std::uint64_t tile_rows, const std::vector<std::uint64_t>& firsts) {
  auto stream = backend.make_stream(false);
  const auto me = static_cast<std::uint64_t>(ranks.rank());
  const std::uint64_t first = firsts[me], mine = firsts[me + 1] - first;
  std::vector<std::uint64_t> staged(rows.keys.begin() + static_cast<std::ptrdiff_t>(first * words),
                                    rows.keys.begin() + static_cast<std::ptrdiff_t>((first + mine) * words));
  for (std::uint64_t r = 0; r < mine; ++r) staged.push_back(std::bit_cast<std::uint64_t>(rows.values[first + r]));
  Buffer in = to_device(backend, *stream, staged.data(), mine * (words + 1) * 8, "test rows");
  kernels::KeyRows keys{in.as<std::uint64_t>(), words, words, nullptr, false, mine};
  if (values) keys.values = reinterpret_cast<const double*>(in.as<std::uint64_t>() + mine * words);
  const auto take = [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); };
  std::optional<stages::keys::ResidentChain::Unique> u = stages::keys::unique_over_ranks(
      backend, *stream, ranks, {keys, std::move(in), first}, tile_rows, 4, true, 1ull << 40, take);
  EXPECT_TRUE(u.has_value());
  const auto gather = [&](const Buffer& b, std::uint64_t count) {
    const std::vector<std::uint64_t> here = to_host(backend, *stream, b, count);
    return ranks.allgatherv(comm::HostSpan<const std::uint64_t>(here.data(), count)).data;
  };
  const std::vector<std::uint64_t> unique = ranks.allgather(u->unique);  // (keys[0]'s place: the ranks' before)
  std::uint64_t expected_first = 0;
  for (std::uint64_t r = 0; r < me; ++r) expected_first += unique[r];
  EXPECT_EQ(u->first, expected_first);
  Flat f;
  f.keys = gather(u->keys, u->unique * words);
  f.counts = gather(u->counts, u->unique);
  if (values) f.values = gather(u->values, u->unique);
  f.index = gather(u->index, mine);
  return f;
}

TEST(DedupRanks, DividedWithTheIndexIsOneRanksBytes) {
  const mpi::Comm world;
  for (const auto& backend : backends(world)) {
    comm::Communicator ranks(world, backend.get());
    for (const std::uint32_t words : {1u, 2u, 4u})
      for (const std::uint64_t tile_rows : {1ull, 7ull, 64ull, 4096ull})
        for (const bool values : {true, false}) {
          const std::uint64_t n = 5003;
          const Apart rows = apart(make_rows(n, words, 31 * words + tile_rows), words);
          kernels::KeyRows all{rows.keys.data(), words, words, values ? rows.values.data() : nullptr, false, n};
          const Flat want = one_rank(*backend, all, tile_rows, true);
          // Shares: equal widths (share_width: the last ranks' shorter or empty); every row on the last rank.
          const std::uint64_t P = static_cast<std::uint64_t>(ranks.size()),
                              width = stages::keys::share_width(n, tile_rows, P);
          std::vector<std::uint64_t> equal(P + 1), last(P + 1, 0);
          for (std::uint64_t r = 0; r <= P; ++r) equal[r] = std::min(n, r * width);
          last[P] = n;
          // (the GPU's chain takes the equal shares of share_width only)
          std::vector<const std::vector<std::uint64_t>*> cases{&equal};
          if (backend->kind() == BackendKind::cpu) cases.push_back(&last);
          for (const auto* shares : cases) {
            const Flat got = divided_with_index(*backend, ranks, rows, words, values, tile_rows, *shares);
            const std::string where = std::string(backend_name(backend->kind())) + ", words " + std::to_string(words) +
                                      ", tiles of " + std::to_string(tile_rows) +
                                      (values ? ", values" : ", no values") +
                                      (shares == &last ? ", all on the last rank" : "");
            EXPECT_EQ(got.keys, want.keys) << where;
            EXPECT_EQ(got.counts, want.counts) << where;
            EXPECT_EQ(got.values, want.values) << where;
            EXPECT_EQ(got.index, want.index) << where;
          }
        }
  }
}

}  // namespace
}  // namespace qstage

int main(int argc, char** argv) { return qstage::test::run_all_tests_on_every_rank(argc, argv); }
