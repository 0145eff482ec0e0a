// keys::unique_over_ranks (ctest runs it on 3 ranks): the de-duplication divided between ranks,
// each holding whole tiles of the rows (a rank may hold none), gives ResidentChain's keys, counts
// and values on one rank, bit for bit, end to end over the ranks in rank order. The oracle is
// ResidentChain over every row on every rank.
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
  std::vector<std::uint64_t> keys, counts, values;
};

Flat one_rank(Backend& backend, const std::vector<std::uint64_t>& rows, std::uint64_t n, std::uint32_t words,
              std::uint64_t tile_rows) {
  auto stream = backend.make_stream(false);
  const kernels::RecordLayout layout{words, true, false};
  stages::keys::ResidentChain chain(backend, *stream, layout, n, tile_rows, kernels::tiles_of(n, tile_rows) * tile_rows,
                                    [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); });
  chain.add(kernels::KeyRows::interleaved_rows(rows.data(), words, n), 0);
  const stages::keys::ResidentChain::Unique u = chain.finish();
  Flat f;
  f.keys.assign(u.keys.as<std::uint64_t>(), u.keys.as<std::uint64_t>() + u.unique * words);
  f.counts.assign(u.counts.as<std::uint64_t>(), u.counts.as<std::uint64_t>() + u.unique);
  f.values.assign(u.values.as<std::uint64_t>(), u.values.as<std::uint64_t>() + u.unique);
  return f;
}

// Rank r's rows: [first[r], first[r + 1]), whole tiles (but the last rank's end).
Flat divided(Backend& backend, comm::Communicator& ranks, const std::vector<std::uint64_t>& rows, std::uint32_t words,
             std::uint64_t tile_rows, const std::vector<std::uint64_t>& first) {
  auto stream = backend.make_stream(false);
  const std::size_t me = static_cast<std::size_t>(ranks.rank());
  const std::uint64_t mine = first[me + 1] - first[me], S = words + 1;
  Buffer in = backend.alloc_device(std::max<std::uint64_t>(mine, 1) * S * 8, "test rows");
  std::memcpy(in.data(), rows.data() + first[me] * S, mine * S * 8);
  const auto take = [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); };
  std::optional<stages::keys::ResidentChain::Unique> u =
      stages::keys::unique_over_ranks(backend, *stream, ranks, std::move(in), mine, words, first[me], tile_rows, 4, 1ull << 40, take);
  EXPECT_TRUE(u.has_value());
  const auto gather = [&](const Buffer& b, std::uint64_t n) {
    return ranks.allgatherv(comm::HostSpan<const std::uint64_t>(b.as<std::uint64_t>(), n)).data;
  };
  Flat f;
  f.keys = gather(u->keys, u->unique * words);
  f.counts = gather(u->counts, u->unique);
  f.values = gather(u->values, u->unique);
  return f;
}

TEST(DedupRanks, DividedIsOneRanksBytes) {
  const mpi::Comm world;
  auto backend = detail::make_cpu_backend(1ull << 30, 1ull << 30);
  comm::Communicator ranks(world, backend.get());
  const auto P = static_cast<std::uint64_t>(ranks.size());
  for (const std::uint32_t words : {1u, 2u, 3u, 4u})
    for (const std::uint64_t tile_rows : {1ull, 7ull, 64ull}) {
      const std::uint64_t n = 5003;
      const std::vector<std::uint64_t> rows = make_rows(n, words, 17 * words + tile_rows);
      const Flat want = one_rank(*backend, rows, n, words, tile_rows);
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
        const std::string where = "words " + std::to_string(words) + ", tiles of " + std::to_string(tile_rows);
        EXPECT_EQ(got.keys, want.keys) << where;
        EXPECT_EQ(got.counts, want.counts) << where;
        EXPECT_EQ(got.values, want.values) << where;  // (the values' bits)
      }
    }
}

}  // namespace
}  // namespace qstage

int main(int argc, char** argv) { return qstage::test::run_all_tests_on_every_rank(argc, argv); }
