// kernels/sort_unique: the CPU twins against a plain std::map reference (tile by tile, bucket by
// bucket, and the whole chain down to the reverse index), and the GPU against the CPU bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <omp.h>
#include <random>
#include <string>
#include <vector>

#include "kernels/keys/sort_unique.hpp"
#include "stages/keys/dedup_resident.hpp"
#include "test_util.hpp"

namespace qstage {
namespace {

using kernels::RecordLayout;
using Key = std::vector<std::uint64_t>;

struct Data {
  std::uint32_t words;
  std::vector<std::uint64_t> keys;  // rows * words
  std::vector<double> values;
  std::uint64_t rows() const { return keys.size() / words; }
  Key key(std::uint64_t r) const { return Key(keys.begin() + r * words, keys.begin() + (r + 1) * words); }
};

// Skewed keys: a small alphabet per word (many duplicates), a Zipf-like tail, and one key half the time.
Data skewed(std::uint64_t rows, std::uint32_t words, std::uint64_t seed, bool one_key = false) {
  std::mt19937_64 rng(seed);
  Data d{words, {}, {}};
  for (std::uint64_t r = 0; r < rows; ++r) {
    const bool hot = (rng() & 1) == 0;
    for (std::uint32_t w = 0; w < words; ++w) {
      std::uint64_t v;
      if (one_key) v = 42;
      else if (hot) v = w == 0 ? 7 : ~std::uint64_t{0} - 3;  // high bits set: unsigned order matters
      else v = static_cast<std::uint64_t>(std::pow(1.0 + static_cast<double>(rng() % 1000), 1.7)) % 97 + (w == 0 ? 0 : rng() % 3);
      d.keys.push_back(v);
    }
    d.values.push_back(std::ldexp(static_cast<double>(rng() % 2000001) - 1e6, -10) + 1e-7 * static_cast<double>(r % 7));
  }
  return d;
}

struct RefEntry {
  std::uint64_t count = 0;
  kernels::PairwiseSum sum;
};

// PairwiseSum's documented shape, written as the recursion it stands for.
double pairwise_reference(const double* x, std::uint64_t n) {
  if (n == 0) return 0;
  if (n == 1) return x[0];
  std::uint64_t head = 1;
  while (head * 2 < n) head *= 2;  // the largest power of two below n (n/2 for a power of two)
  return pairwise_reference(x, head) + pairwise_reference(x + head, n - head);
}

TEST(SortUnique, PairwiseSumHasTheDocumentedShape) {
  std::mt19937_64 rng(3);
  std::vector<double> x(5000);
  for (double& v : x) v = std::ldexp(static_cast<double>(rng() % 1000001) - 5e5, static_cast<int>(rng() % 60) - 30);
  for (std::uint64_t n : {0ull, 1ull, 2ull, 3ull, 5ull, 6ull, 7ull, 8ull, 13ull, 64ull, 100ull, 257ull, 4095ull, 4097ull, 5000ull}) {
    kernels::PairwiseSum s;
    for (std::uint64_t i = 0; i < n; ++i) s.add(x[i]);
    const double want = pairwise_reference(x.data(), n);
    const double got_one = s.total();
    EXPECT_EQ(std::memcmp(&want, &got_one, 8), 0) << n;
    // complete subtrees added whole give the same bits: what a GPU block does with a long run
    // (trees of at most 2^cap terms, by the binary digits of what is left)
    for (int cap : {0, 2, 3, 6}) {
      kernels::PairwiseSum t;
      for (std::uint64_t at = 0; at < n;) {
        int level = 0;
        while (level < cap && (std::uint64_t{2} << level) <= n - at) ++level;
        t.add_tree(pairwise_reference(x.data() + at, std::uint64_t{1} << level), level);
        at += std::uint64_t{1} << level;
      }
      const double got = t.total();
      EXPECT_EQ(std::memcmp(&want, &got, 8), 0) << n << " terms, subtrees of up to 2^" << cap;
    }
  }
}

// tile_unique on the CPU, checked against a map per tile (counts, sums in input order, local ids).
struct Tiled {
  std::vector<std::uint64_t> records, tile_unique, local;
};
Tiled tile_unique_cpu(const Data& d, std::uint64_t tile_rows, RecordLayout L, std::uint64_t first_row = 0) {
  Tiled t;
  const std::uint64_t n = d.rows();
  t.records.assign(n * L.cols(), 0);
  t.tile_unique.assign(kernels::tiles_of(n, tile_rows), 0);
  t.local.assign(n, 0);
  kernels::KeyRows in{d.keys.data(), d.words, d.words, L.value ? d.values.data() : nullptr, false, n};
  kernels::cpu::tile_unique({in, L, tile_rows, first_row, t.records.data(), t.tile_unique.data(), t.local.data(), {}});
  return t;
}

void expect_tiles_match_reference(const Data& d, std::uint64_t tile_rows) {
  const RecordLayout L{d.words, true, true};
  const Tiled t = tile_unique_cpu(d, tile_rows, L, 1000 * tile_rows);
  const std::uint64_t n = d.rows();
  for (std::uint64_t tile = 0; tile * tile_rows < n; ++tile) {
    std::map<Key, RefEntry> ref;
    const std::uint64_t end = std::min(n, (tile + 1) * tile_rows);
    for (std::uint64_t r = tile * tile_rows; r < end; ++r) {
      auto& e = ref[d.key(r)];
      ++e.count;
      e.sum.add(d.values[r]);
    }
    ASSERT_EQ(t.tile_unique[tile], ref.size()) << "tile " << tile;
    std::uint64_t j = 0;
    for (const auto& [key, e] : ref) {
      const std::uint64_t* rec = t.records.data() + (tile * tile_rows + j) * L.cols();
      EXPECT_EQ(Key(rec, rec + d.words), key);
      EXPECT_EQ(rec[L.count_col()], e.count);
      double v;
      std::memcpy(&v, rec + L.value_col(), 8);
      EXPECT_EQ(v, e.sum.total());  // the same terms in the same order (input order), the same shape
      EXPECT_EQ(rec[L.origin_col()], 1000 * tile_rows + tile * tile_rows + j);
      ++j;
    }
    for (std::uint64_t r = tile * tile_rows; r < end; ++r) {
      const std::uint64_t* rec = t.records.data() + (tile * tile_rows + t.local[r]) * L.cols();
      EXPECT_EQ(Key(rec, rec + d.words), d.key(r)) << "row " << r;
    }
  }
}

TEST(SortUnique, TilesMatchAMapPerTile) {
  for (std::uint32_t w : {1u, 2u, 3u, 5u})  // (up to four words sorted side by side, wider through a permutation)
    for (std::uint64_t tile : {1ull, 7ull, 64ull, 1000ull}) expect_tiles_match_reference(skewed(3001, w, 11 + w), tile);
}

TEST(SortUnique, OneKeyEverywhere) {
  const Data d = skewed(500, 2, 5, true);
  const Tiled t = tile_unique_cpu(d, 128, {2, true, false});
  for (std::uint64_t u : t.tile_unique) EXPECT_EQ(u, 1u);
  EXPECT_EQ(t.records[2 + 1], 128u);  // count of tile 0
  EXPECT_EQ(t.records.at((3 * 128) * 4 + 3), 500u - 3 * 128);
}

// One bucket's merge on the CPU (kernels::cpu::bucket_merge) into vectors of room enough.
struct Merged {
  std::vector<std::uint64_t> keys, counts, pairs, pair_counts;
  std::vector<double> values;
  std::uint64_t unique = 0;
};
Merged merge_bucket(const std::uint64_t* records, std::uint64_t rows, RecordLayout L, std::uint32_t batch,
                    std::uint32_t row_buckets, std::uint64_t rows_per_row_bucket) {
  Merged out;
  out.keys.resize(rows * L.words), out.counts.resize(rows), out.values.resize(rows);
  out.pairs.resize(3 * rows), out.pair_counts.resize(row_buckets);
  kernels::BucketMerge mg;
  mg.records = records;
  mg.rows = rows;
  mg.layout = L;
  mg.keys = out.keys.data();
  mg.counts = out.counts.data();
  mg.values = out.values.data();
  mg.unique = &out.unique;
  mg.batch = batch;
  mg.pairs = out.pairs.data();
  mg.pair_counts = out.pair_counts.data();
  mg.row_buckets = row_buckets;
  mg.rows_per_row_bucket = rows_per_row_bucket;
  kernels::cpu::bucket_merge(mg);
  return out;
}

// The whole chain on the CPU: tiles, samples, buckets, merge, index, against one std::map.
void expect_chain_matches_reference(const Data& d, std::uint64_t tile_rows, std::vector<Key> splitter_keys,
                                    std::uint64_t rows_per_row_bucket) {
  const RecordLayout L{d.words, true, true};
  const std::uint64_t n = d.rows();
  const Tiled t = tile_unique_cpu(d, tile_rows, L);
  std::vector<std::uint64_t> splitters;
  for (const Key& k : splitter_keys) splitters.insert(splitters.end(), k.begin(), k.end());
  const auto B = static_cast<std::uint32_t>(splitter_keys.size() + 1);
  std::vector<std::uint64_t> split(n * L.cols()), counts(B);
  kernels::cpu::bucket_split({t.records.data(), t.tile_unique.data(), L, n, tile_rows, splitters.data(), B, split.data(),
                              counts.data(), {}});
  // In place (the partition pass on cpu: the records are already in the output): the same.
  std::vector<std::uint64_t> in_place = t.records, in_place_counts(B);
  ASSERT_EQ(in_place.size(), n * L.cols());
  kernels::cpu::bucket_split({in_place.data(), t.tile_unique.data(), L, n, tile_rows, splitters.data(), B,
                              in_place.data(), in_place_counts.data(), {}});
  EXPECT_EQ(in_place_counts, counts);
  const std::uint64_t split_words = std::accumulate(counts.begin(), counts.end(), std::uint64_t{0}) * L.cols();
  EXPECT_TRUE(std::equal(split.begin(), split.begin() + static_cast<std::ptrdiff_t>(split_words), in_place.begin()));
  // Each bucket merged on its own, appended in bucket order.
  std::vector<std::uint64_t> keys, kcounts, pairs, prefix{0};
  std::vector<double> values;
  const auto R = static_cast<std::uint32_t>((n + rows_per_row_bucket - 1) / rows_per_row_bucket);
  std::uint64_t at = 0;
  for (std::uint32_t b = 0; b < B; ++b) {
    const std::uint64_t m = counts[b];
    const Merged mg = merge_bucket(split.data() + at * L.cols(), m, L, b, R, rows_per_row_bucket);
    keys.insert(keys.end(), mg.keys.begin(), mg.keys.begin() + mg.unique * d.words);
    kcounts.insert(kcounts.end(), mg.counts.begin(), mg.counts.begin() + mg.unique);
    values.insert(values.end(), mg.values.begin(), mg.values.begin() + mg.unique);
    pairs.insert(pairs.end(), mg.pairs.begin(), mg.pairs.end());
    prefix.push_back(prefix.back() + mg.unique);
    at += m;
  }
  std::map<Key, RefEntry> ref;
  for (std::uint64_t r = 0; r < n; ++r) ++ref[d.key(r)].count;
  ASSERT_EQ(kcounts.size(), ref.size());
  std::uint64_t j = 0;
  std::map<Key, std::uint64_t> position;
  for (const auto& [key, e] : ref) {
    EXPECT_EQ(Key(keys.begin() + j * d.words, keys.begin() + (j + 1) * d.words), key) << j;
    EXPECT_EQ(kcounts[j], e.count);
    // pairwise over tiles in tile order of pairwise sums in input order
    kernels::PairwiseSum sum;
    for (std::uint64_t tile = 0; tile * tile_rows < n; ++tile) {
      kernels::PairwiseSum s;
      for (std::uint64_t r = tile * tile_rows; r < std::min(n, (tile + 1) * tile_rows); ++r)
        if (d.key(r) == key) s.add(d.values[r]);
      if (s.n) sum.add(s.total());
    }
    EXPECT_EQ(values[j], sum.total());
    position[key] = j++;
  }
  // The reverse index, per row bucket, from the pairs of every merge (in any order).
  std::vector<std::uint64_t> index(n);
  for (std::uint64_t first = 0; first < n; first += rows_per_row_bucket) {
    const std::uint64_t rows = std::min(rows_per_row_bucket, n - first);
    std::vector<std::uint64_t> mine;
    for (std::size_t p = 0; p < pairs.size(); p += 3)
      if (pairs[p] >= first && pairs[p] < first + rows) mine.insert(mine.end(), pairs.begin() + p, pairs.begin() + p + 3);
    kernels::cpu::index_gather({t.local.data() + first, rows, first, tile_rows, mine.data(), mine.size() / 3,
                                prefix.data(), index.data() + first, {}});
  }
  for (std::uint64_t r = 0; r < n; ++r) EXPECT_EQ(index[r], position.at(d.key(r))) << "row " << r;
}

TEST(SortUnique, ChainMatchesAMap) {
  for (std::uint32_t w : {1u, 2u}) {
    const Data d = skewed(4000, w, 3 * w);
    // splitters below everything (an empty bucket), inside, and at the hot key
    std::vector<Key> s{Key(w, 0), Key(w, 5), d.key(0), Key(w, 90)};
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    expect_chain_matches_reference(d, 64, s, 640);
    expect_chain_matches_reference(d, 1000, {}, 4000);  // one bucket, one row bucket
  }
}

// A bucket's merge against a stable sort of its records, on one thread and on several: sorted
// runs with keys shared between runs (as buckets are: tiles' unique keys, one tile after another),
// a run cut into parts at keys that repeat, and records in no order at all.
void expect_merge_is_the_stable_sorts(const std::vector<std::uint64_t>& records, std::uint64_t rows) {
  const RecordLayout L{2, true, true};
  const std::uint32_t cols = L.cols();
  std::vector<std::uint64_t> order(rows);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    return std::lexicographical_compare(&records[a * cols], &records[a * cols + 2], &records[b * cols], &records[b * cols + 2]);
  });
  std::vector<std::uint64_t> keys, counts, origins;
  std::vector<double> values;
  for (std::uint64_t i = 0; i < rows;) {
    const std::uint64_t* key = &records[order[i] * cols];
    std::uint64_t count = 0, j = i;
    kernels::PairwiseSum sum;
    for (; j < rows && std::equal(key, key + 2, &records[order[j] * cols]); ++j) {
      count += records[order[j] * cols + L.count_col()];
      double v;
      std::memcpy(&v, &records[order[j] * cols + L.value_col()], 8);
      sum.add(v);
      origins.push_back(records[order[j] * cols + L.origin_col()]);
    }
    keys.insert(keys.end(), key, key + 2);
    counts.push_back(count);
    values.push_back(sum.total());
    i = j;
  }
  const int threads = omp_get_max_threads();
  for (int t : {1, 3}) {
    omp_set_num_threads(t);
    const Merged mg = merge_bucket(records.data(), rows, L, 0, 1, rows);
    ASSERT_EQ(mg.unique, counts.size()) << t << " threads";
    EXPECT_TRUE(std::equal(keys.begin(), keys.end(), mg.keys.begin())) << t << " threads";
    EXPECT_TRUE(std::equal(counts.begin(), counts.end(), mg.counts.begin())) << t << " threads";
    for (std::size_t u = 0; u < values.size(); ++u)
      ASSERT_EQ(std::bit_cast<std::uint64_t>(mg.values[u]), std::bit_cast<std::uint64_t>(values[u])) << u << ", " << t << " threads";
    for (std::uint64_t i = 0; i < rows; ++i) ASSERT_EQ(mg.pairs[3 * i], origins[i]) << i << ", " << t << " threads";
  }
  omp_set_num_threads(threads);
}

TEST(SortUnique, BucketMergeIsTheStableSortsOnAnyThreadCount) {
  const RecordLayout L{2, true, true};
  std::mt19937_64 rng(11);
  const auto record = [&](std::vector<std::uint64_t>& out, std::uint64_t a, std::uint64_t b) {
    const double v = std::ldexp(static_cast<double>(rng() % 2000001) - 1e6, -12);
    std::uint64_t value;
    std::memcpy(&value, &v, 8);
    const std::uint64_t row = out.size() / L.cols();
    out.insert(out.end(), {a, b, value, 1 + rng() % 4, row});
  };
  for (const std::uint64_t runs : {1u, 2u, 7u, 40u}) {  // (with 20,000 rows a run, 3 threads cut each run)
    std::vector<std::uint64_t> records;
    for (std::uint64_t r = 0; r < runs; ++r) {
      std::vector<std::uint64_t> keys(60000);  // a run: ascending unique keys, a third of them drawn
      std::iota(keys.begin(), keys.end(), std::uint64_t{0});
      std::shuffle(keys.begin(), keys.end(), rng);
      keys.resize(20000);
      std::sort(keys.begin(), keys.end());
      for (const std::uint64_t k : keys) record(records, k / 3, k % 3 == 2 ? ~std::uint64_t{0} : k % 3);  // (ascending)
    }
    expect_merge_is_the_stable_sorts(records, records.size() / L.cols());
  }
  std::vector<std::uint64_t> unordered;
  for (int i = 0; i < 30000; ++i) record(unordered, rng() % 500, rng() % 3);
  expect_merge_is_the_stable_sorts(unordered, unordered.size() / L.cols());
}

// The CPU's one-call dedup (RadixUnique) against the chain it stands for: tile_unique, bucket_split
// into one bucket, bucket_merge, byte for byte, on 1 and 3 threads: skewed keys with high bits set
// (tiles share keys, so sums cross tiles), keys that differ in every byte, one key everywhere.
void expect_radix_is_the_chains_bytes(const Data& d, std::uint64_t tile_rows) {
  const RecordLayout L{d.words, true, false};
  const std::uint64_t n = d.rows();
  const Tiled t = tile_unique_cpu(d, tile_rows, L);
  std::vector<std::uint64_t> split(n * L.cols()), count(1);
  kernels::cpu::bucket_split({t.records.data(), t.tile_unique.data(), L, n, tile_rows, nullptr, 1, split.data(), count.data(), {}});
  const Merged want = merge_bucket(split.data(), count[0], L, 0, 1, n);
  const int threads = omp_get_max_threads();
  for (int th : {1, 3}) {
    omp_set_num_threads(th);
    std::vector<std::uint64_t> records;  // (key words, then the value's bits)
    for (std::uint64_t r = 0; r < n; ++r) {
      records.insert(records.end(), d.keys.begin() + r * d.words, d.keys.begin() + (r + 1) * d.words);
      records.push_back(std::bit_cast<std::uint64_t>(d.values[r]));
    }
    std::vector<std::uint64_t> spare(records.size());
    std::vector<double> values(n);
    const kernels::cpu::RadixUnique got({records.data(), spare.data(), values.data(), n, d.words, tile_rows});
    const std::string where = fmt::format("{} words, tiles of {}, {} threads", d.words, tile_rows, th);
    EXPECT_EQ(got.tile_records(), count[0]) << where;
    ASSERT_EQ(got.unique(), want.unique) << where;
    std::vector<std::uint64_t> keys(want.unique * d.words), counts(want.unique);
    std::vector<double> sums(want.unique);
    got.write(keys.data(), counts.data(), sums.data());
    EXPECT_TRUE(std::equal(keys.begin(), keys.end(), want.keys.begin())) << where;
    EXPECT_TRUE(std::equal(counts.begin(), counts.end(), want.counts.begin())) << where;
    for (std::uint64_t u = 0; u < want.unique; ++u)
      ASSERT_EQ(std::bit_cast<std::uint64_t>(sums[u]), std::bit_cast<std::uint64_t>(want.values[u])) << u << ", " << where;
    // Its tile records: tile_unique's, sorted stably by key (what ranks exchange), and merged
    // they are the chain's bytes again.
    std::vector<std::uint64_t> tiles(count[0] * L.cols());
    got.write_tile_records(tiles.data());
    std::vector<std::uint64_t> order(count[0]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
      return kernels::compare_keys(split.data() + a * L.cols(), split.data() + b * L.cols(), d.words) < 0;
    });
    for (std::uint64_t i = 0; i < count[0]; ++i)
      ASSERT_TRUE(std::equal(tiles.begin() + i * L.cols(), tiles.begin() + (i + 1) * L.cols(),
                             split.begin() + order[i] * L.cols()))
          << i << ", " << where;
    // With origins: the same records, record k's origin first + k, and every row sent to a
    // record of its key that counts it (each record's count equals the rows sent to it).
    const std::uint64_t cols = L.cols() + 1, first = 1000;
    std::vector<std::uint64_t> with_origin(count[0] * cols), record_of(n, ~std::uint64_t{0}), rows_of(count[0], 0),
        tile_of(count[0], ~std::uint64_t{0});
    got.write_tile_records(with_origin.data(), record_of.data(), first);
    for (std::uint64_t i = 0; i < count[0]; ++i) {
      ASSERT_TRUE(
          std::equal(tiles.begin() + i * L.cols(), tiles.begin() + (i + 1) * L.cols(), with_origin.begin() + i * cols))
          << i << ", " << where;
      ASSERT_EQ(with_origin[i * cols + L.cols()], first + i) << i << ", " << where;
    }
    for (std::uint64_t r = 0; r < n; ++r) {
      ASSERT_LT(record_of[r], count[0]) << r << ", " << where;
      ASSERT_EQ(kernels::compare_keys(d.keys.data() + r * d.words, with_origin.data() + record_of[r] * cols, d.words),
                0)
          << r << ", " << where;
      ++rows_of[record_of[r]];
      if (tile_of[record_of[r]] == ~std::uint64_t{0}) tile_of[record_of[r]] = r / tile_rows;
      ASSERT_EQ(tile_of[record_of[r]], r / tile_rows) << r << ", " << where;  // (a record is one tile's)
    }
    for (std::uint64_t i = 0; i < count[0]; ++i)
      ASSERT_EQ(rows_of[i], tiles[i * L.cols() + d.words + 1]) << i << ", " << where;
    const Merged again = merge_bucket(tiles.data(), count[0], L, 0, 1, n);
    EXPECT_EQ(again.keys, want.keys) << where;
    for (std::uint64_t u = 0; u < want.unique; ++u)
      ASSERT_EQ(std::bit_cast<std::uint64_t>(again.values[u]), std::bit_cast<std::uint64_t>(want.values[u]))
          << u << ", " << where;
  }
  omp_set_num_threads(threads);
}

TEST(SortUnique, RadixUniqueIsTheChainsBytesOnAnyThreadCount) {
  for (std::uint32_t w : {1u, 2u, 3u, 4u}) {
    for (std::uint64_t tile : {1ull, 7ull, 64ull, 1000ull}) expect_radix_is_the_chains_bytes(skewed(20001, w, 5 + w), tile);
    Data wide{w, {}, {}};  // (every byte of every word varies: all eight passes a word)
    std::mt19937_64 rng(w);
    for (int r = 0; r < 9000; ++r) {
      const std::uint64_t pick = rng() % 3000;  // (about three rows a key)
      for (std::uint32_t k = 0; k < w; ++k) wide.keys.push_back(kernels::fmix64(pick * 5 + k));
      wide.values.push_back(std::ldexp(static_cast<double>(rng() % 1000001) - 5e5, -9));
    }
    expect_radix_is_the_chains_bytes(wide, 64);
    expect_radix_is_the_chains_bytes(skewed(5000, w, 1, true), 64);
  }
  expect_radix_is_the_chains_bytes(Data{2, {}, {}}, 64);  // (no rows)
}

TEST(SortUnique, SamplesAreRegular) {
  const Data d = skewed(1000, 1, 9);
  const RecordLayout L{1, false, false};
  const Tiled t = tile_unique_cpu(d, 256, L);
  const std::uint32_t s = 4;
  std::vector<std::uint64_t> partials(4 * kernels::sample_partial_words(s, 1));
  kernels::cpu::tile_samples({t.records.data(), t.tile_unique.data(), L, 4, 256, 7, s, partials.data()});
  for (std::uint64_t tile = 0; tile < 4; ++tile) {
    const std::uint64_t* p = partials.data() + tile * kernels::sample_partial_words(s, 1);
    const std::uint64_t u = t.tile_unique[tile];
    EXPECT_EQ(p[1], u);
    EXPECT_EQ(p[0], std::min<std::uint64_t>(u, s));
    for (std::uint64_t j = 0; j < p[0]; ++j)
      EXPECT_EQ(p[2 + j], t.records[(tile * 256 + (u <= s ? j : kernels::sample_position(j, u, s, 7 + tile))) * L.cols()]);
  }
}

// Positions: one per spacing u / samples, shifted by the tile's phase, always inside the tile, and
// not the same quantiles in every tile (what lets many tiles resolve many buckets).
TEST(SortUnique, SamplePositionsAreJitteredPerTile) {
  for (std::uint64_t u : {33ull, 1000ull, 65536ull, (1ull << 33) + 5}) {
    std::vector<std::uint64_t> first;
    for (std::uint64_t tile = 0; tile < 64; ++tile) {
      for (std::uint64_t j = 0; j < 32; ++j) {
        const std::uint64_t pos = kernels::sample_position(j, u, 32, tile);
        EXPECT_LT(pos, u);
        EXPECT_GE(pos, j * u / 32);
        EXPECT_LE(pos, (j + 1) * u / 32);
      }
      first.push_back(kernels::sample_position(0, u, 32, tile));
    }
    std::sort(first.begin(), first.end());
    // spread over the first spacing (u / 32 positions there), not one point
    const auto distinct = std::unique(first.begin(), first.end()) - first.begin();
    if (u >= 1000) EXPECT_GT(distinct, std::min<std::ptrdiff_t>(48, static_cast<std::ptrdiff_t>(u / 32) / 2)) << u;
  }
}

TEST(SortUnique, BucketOfSplitsKeysNotRows) {
  const std::uint64_t splitters[] = {1, 5, 5 + 0, 9};
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 1>{0}.data(), splitters, 4, 1), 0u);
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 1>{1}.data(), splitters, 4, 1), 1u);
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 1>{5}.data(), splitters, 4, 1), 3u);
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 1>{100}.data(), splitters, 4, 1), 4u);
  const std::uint64_t two[] = {1, 0, 1, ~std::uint64_t{0}};  // (1, 0) and (1, max)
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 2>{0, ~std::uint64_t{0}}.data(), two, 2, 2), 0u);
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 2>{1, 5}.data(), two, 2, 2), 1u);
  EXPECT_EQ(kernels::bucket_of(std::array<std::uint64_t, 2>{2, 0}.data(), two, 2, 2), 2u);
}

// The GPU gives the CPU's bytes: tiles (with a partial last tile and empty-free tiles), buckets
// and a merge. Tiles of 16 rows make the hot key's merge run 1,250 records and tiles of 2^15 rows
// make its tile runs 16,000 rows: both longer than a thread's share, summed by blocks.
TEST(SortUnique, GpuMatchesCpu) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  struct Case {
    std::uint32_t w;
    std::uint64_t rows, tile;
  };
  for (const Case& c : {Case{1, 20011, 1024}, Case{2, 20011, 1024}, Case{3, 20011, 1024}, Case{2, 20011, 16},
                        Case{1, 70001, 1 << 15}, Case{2, 70001, 1 << 15}}) {
    const std::uint32_t w = c.w;
    SCOPED_TRACE(testing::Message() << "words " << w << ", tile " << c.tile);
    const Data d = skewed(c.rows, w, 17 + w);
    const std::uint64_t n = d.rows(), tile = c.tile;
    const RecordLayout L{w, true, true};
    const Tiled cpu = tile_unique_cpu(d, tile, L, 5 * tile);
    Buffer keys = gpu.upload(d.keys.data(), d.keys.size() * 8), values = gpu.upload(d.values.data(), n * 8);
    Buffer records = gpu.backend->alloc_device(n * L.cols() * 8, "t"), tu = gpu.backend->alloc_device(cpu.tile_unique.size() * 8, "t");
    Buffer local = gpu.backend->alloc_device(n * 8, "t");
    const std::uint64_t sb = kernels::tile_unique_scratch_bytes(n, w);
    Buffer scratch = gpu.backend->alloc_device(std::max(sb, kernels::bucket_merge_scratch_bytes(n, w)), "t");
    std::vector<std::uint64_t> zero(n * L.cols(), 0);
    gpu.backend->copy_to_device(records.data(), zero.data(), zero.size() * 8, *gpu.stream);
    kernels::KeyRows in{keys.as<std::uint64_t>(), w, w, values.as<double>(), false, n};
    kernels::tile_unique(*gpu.stream, {in, L, tile, 5 * tile, records.as<std::uint64_t>(), tu.as<std::uint64_t>(),
                                       local.as<std::uint64_t>(), {scratch.data(), scratch.size()}});
    EXPECT_EQ(gpu.download<std::uint64_t>(tu, cpu.tile_unique.size()), cpu.tile_unique);
    EXPECT_EQ(gpu.download<std::uint64_t>(local, n), cpu.local);
    const auto got = gpu.download<std::uint64_t>(records, n * L.cols());
    for (std::uint64_t t = 0; t < cpu.tile_unique.size(); ++t)
      for (std::uint64_t j = 0; j < cpu.tile_unique[t] * L.cols(); ++j)
        ASSERT_EQ(got[t * tile * L.cols() + j], cpu.records[t * tile * L.cols() + j]) << "tile " << t;
    // one merge of everything (tile records in tile order), pairs in two row buckets
    std::vector<std::uint64_t> packed;
    for (std::uint64_t t = 0; t < cpu.tile_unique.size(); ++t)
      packed.insert(packed.end(), cpu.records.begin() + t * tile * L.cols(),
                    cpu.records.begin() + (t * tile + cpu.tile_unique[t]) * L.cols());
    const std::uint64_t m = packed.size() / L.cols();
    auto merge = [&](kernels::BucketMerge mg, auto run) {
      mg.rows = m;
      mg.layout = L;
      mg.batch = 3;
      mg.row_buckets = 2;
      mg.rows_per_row_bucket = (5 * tile + n) / 2 + 1;  // two row buckets
      run(mg);
    };
    std::vector<std::uint64_t> ck(m * w), cc(m), cp(3 * m), cpc(2), cu(1);
    std::vector<double> cv(m);
    merge({packed.data(), 0, L, ck.data(), cc.data(), cv.data(), cu.data(), 0, cp.data(), cpc.data(), 1, 1, {}},
          [](const kernels::BucketMerge& a) { kernels::cpu::bucket_merge(a); });
    Buffer in2 = gpu.upload(packed.data(), packed.size() * 8);
    Buffer gk = gpu.backend->alloc_device(m * w * 8, "t"), gc = gpu.backend->alloc_device(m * 8, "t"),
           gv = gpu.backend->alloc_device(m * 8, "t"), gp = gpu.backend->alloc_device(3 * m * 8, "t"),
           gpc = gpu.backend->alloc_device(16, "t"), gu = gpu.backend->alloc_device(8, "t");
    merge({in2.as<std::uint64_t>(), 0, L, gk.as<std::uint64_t>(), gc.as<std::uint64_t>(), gv.as<double>(),
           gu.as<std::uint64_t>(), 0, gp.as<std::uint64_t>(), gpc.as<std::uint64_t>(), 1, 1, {scratch.data(), scratch.size()}},
          [&](const kernels::BucketMerge& a) { kernels::bucket_merge(*gpu.stream, a); });
    const std::uint64_t u = gpu.download<std::uint64_t>(gu, 1)[0];
    ASSERT_EQ(u, cu[0]);
    EXPECT_EQ(gpu.download<std::uint64_t>(gk, u * w), std::vector<std::uint64_t>(ck.begin(), ck.begin() + u * w));
    EXPECT_EQ(gpu.download<std::uint64_t>(gc, u), std::vector<std::uint64_t>(cc.begin(), cc.begin() + u));
    const auto gvv = gpu.download<double>(gv, u);
    EXPECT_EQ(std::memcmp(gvv.data(), cv.data(), u * 8), 0);
    EXPECT_EQ(gpu.download<std::uint64_t>(gp, 3 * m), cp);
    EXPECT_EQ(gpu.download<std::uint64_t>(gpc, 2), cpc);
  }
}

}  // namespace
}  // namespace qstage

namespace qstage {
namespace {

// stages::keys::ResidentChain (the sample sort's kernels in turn on resident data, as keys.dedup's step
// and sci.solve's selections run them): the input added block by block (the last block partial)
// gives the bytes of one block, which are a std::map's keys, counts and index, and the value sums
// of one chain over the whole; on a GPU the same bytes.
struct ChainOutput {
  std::vector<std::uint64_t> keys, counts, index, value_bits;
};

ChainOutput resident_chain(Backend& backend, const Data& d, std::uint64_t tile, std::uint64_t block) {
  std::unique_ptr<Stream> stream = backend.make_stream(false);
  const std::uint64_t n = d.rows();
  const RecordLayout L{d.words, true, true};
  stages::keys::ResidentChain chain(backend, *stream, L, n, tile, block,
                            [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); });
  Buffer keys = backend.alloc_device(n * d.words * 8, "keys"), values = backend.alloc_device(n * 8, "values");
  backend.copy_to_device(keys.data(), d.keys.data(), n * d.words * 8, *stream);
  backend.copy_to_device(values.data(), d.values.data(), n * 8, *stream);
  for (std::uint64_t first = 0; first < n; first += block) {
    const kernels::KeyRows in{keys.as<std::uint64_t>() + first * d.words, d.words, d.words, values.as<double>() + first, false,
                              std::min(block, n - first)};
    chain.add(in, first);
  }
  stages::keys::ResidentChain::Unique u = chain.finish();
  auto download = [&](const Buffer& b, std::uint64_t count) {
    std::vector<std::uint64_t> out(count);
    backend.copy_to_host(out.data(), b.data(), count * 8, *stream);
    stream->synchronize();
    return out;
  };
  return {download(u.keys, u.unique * d.words), download(u.counts, u.unique), download(u.index, n), download(u.values, u.unique)};
}

// The same input through stages::keys::HostChain (its records in host memory, merged in buckets of
// at most `block` records): its outputs are host memory.
ChainOutput host_chain(Backend& backend, const Data& d, std::uint64_t tile, std::uint64_t block,
                       std::uint32_t* buckets) {
  std::unique_ptr<Stream> stream = backend.make_stream(false);
  const std::uint64_t n = d.rows();
  const RecordLayout L{d.words, true, true};
  stages::keys::HostChain chain(backend, *stream, L, n, tile, block);
  Buffer keys = backend.alloc_device(n * d.words * 8, "keys"), values = backend.alloc_device(n * 8, "values");
  backend.copy_to_device(keys.data(), d.keys.data(), n * d.words * 8, *stream);
  backend.copy_to_device(values.data(), d.values.data(), n * 8, *stream);
  for (std::uint64_t first = 0; first < n; first += block) {
    const kernels::KeyRows in{keys.as<std::uint64_t>() + first * d.words,
                              d.words,
                              d.words,
                              values.as<double>() + first,
                              false,
                              std::min(block, n - first)};
    chain.add(in, first);
  }
  const stages::keys::HostChain::Unique u = chain.finish();
  EXPECT_TRUE(u.on_host);
  *buckets = u.buckets;
  auto read = [&](const Buffer& b, std::uint64_t count) {
    return std::vector<std::uint64_t>(b.as<std::uint64_t>(), b.as<std::uint64_t>() + count);
  };
  return {read(u.keys, u.unique * d.words), read(u.counts, u.unique), read(u.index, n), read(u.values, u.unique)};
}

TEST(SortUnique, ResidentChainAddedBlockByBlockIsOneChainsBytes) {
  auto cpu = make_backend({"cpu", 0, 0, 0});
  for (const std::uint32_t w : {1u, 3u}) {
    SCOPED_TRACE(testing::Message() << "words " << w);
    const Data d = skewed(5003, w, 11 + w);
    const ChainOutput whole = resident_chain(*cpu, d, 64, 64 * 80), blocks = resident_chain(*cpu, d, 64, 640);
    EXPECT_EQ(blocks.keys, whole.keys);
    EXPECT_EQ(blocks.counts, whole.counts);
    EXPECT_EQ(blocks.index, whole.index);
    EXPECT_EQ(blocks.value_bits, whole.value_bits);
    std::map<Key, std::uint64_t> counts;
    for (std::uint64_t r = 0; r < d.rows(); ++r) ++counts[d.key(r)];
    ASSERT_EQ(whole.counts.size(), counts.size());
    std::map<Key, std::uint64_t> position;
    std::uint64_t u = 0;
    for (const auto& [key, count] : counts) {
      EXPECT_TRUE(std::equal(key.begin(), key.end(), whole.keys.begin() + u * w)) << u;
      EXPECT_EQ(whole.counts[u], count) << u;
      position[key] = u++;
    }
    for (std::uint64_t r = 0; r < d.rows(); ++r) ASSERT_EQ(whole.index[r], position[d.key(r)]) << r;
    if (test::gpu_available()) {
      test::GpuRun gpu;
      const ChainOutput on_gpu = resident_chain(*gpu.backend, d, 64, 640);
      EXPECT_EQ(on_gpu.keys, whole.keys);
      EXPECT_EQ(on_gpu.counts, whole.counts);
      EXPECT_EQ(on_gpu.index, whole.index);
      EXPECT_EQ(on_gpu.value_bits, whole.value_bits);
    }
  }
}

// HostChain cuts its buckets where the tiles' sorted records allow and merges them one by one: the
// bytes of ResidentChain's one bucket for any bucket size (a key's records in one bucket, in tile
// order), on the CPU and on a GPU. It fails if a bucket's records are gathered out of tile order
// (the value sums), if a bound splits a key's records (the counts) or if the index table is filled
// without each bucket's first position.
TEST(SortUnique, HostChainInBucketsIsTheResidentChainsBytes) {
  auto cpu = make_backend({"cpu", 0, 0, 0});
  for (const std::uint32_t w : {1u, 2u, 3u}) {
    SCOPED_TRACE(testing::Message() << "words " << w);
    const Data d = skewed(5003, w, 11 + w);
    const ChainOutput want = resident_chain(*cpu, d, 64, 64 * 80);
    // (79 tiles: a bucket holds at least 8 records of each, 632; records about 3,000)
    for (const std::uint64_t block : {640ull, 1280ull, 64ull * 80}) {
      SCOPED_TRACE(testing::Message() << "block " << block);
      std::uint32_t buckets = 0;
      const ChainOutput got = host_chain(*cpu, d, 64, block, &buckets);
      EXPECT_EQ(got.keys, want.keys);
      EXPECT_EQ(got.counts, want.counts);
      EXPECT_EQ(got.index, want.index);
      EXPECT_EQ(got.value_bits, want.value_bits);
      if (block == 640) EXPECT_GE(buckets, 4u);
      if (block == 64 * 80) EXPECT_EQ(buckets, 1u);
    }
    if (test::gpu_available()) {
      test::GpuRun gpu;
      std::uint32_t buckets = 0;
      const ChainOutput on_gpu = host_chain(*gpu.backend, d, 64, 640, &buckets);
      EXPECT_EQ(on_gpu.keys, want.keys);
      EXPECT_EQ(on_gpu.counts, want.counts);
      EXPECT_EQ(on_gpu.index, want.index);
      EXPECT_EQ(on_gpu.value_bits, want.value_bits);
    }
  }
  EXPECT_THROW(stages::keys::HostChain(*cpu, *cpu->make_stream(false), RecordLayout{1, true, true}, 5003, 64, 320),
               std::logic_error);  // (320 rows cannot hold 8 records of each of 79 tiles)
}

}  // namespace
}  // namespace qstage
