// The CPU twin of kernels/keys/sort_unique.cu: a stable sort per tile (OpenMP over tiles), a bucket's
// sorted runs merged stably, every run's terms added to a PairwiseSum in sorted order, which a
// stable sort makes input order: the same bytes as the GPU's.
#include "kernels/keys/sort_unique.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <numeric>
#include <omp.h>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

std::uint64_t tiles_of(std::uint64_t rows, std::uint64_t tile_rows) { return (rows + tile_rows - 1) / tile_rows; }

// The GPU versions' scratch (kernels/keys/sort_unique.cu says what each array is), with CUB's share.
namespace {
std::uint64_t with_cub(std::uint64_t rows, std::uint64_t array_bytes_per_row) {
  return rows * (array_bytes_per_row + 4) + kCubFixedBytes + 8 * 256;  // (+ the arrays' alignment)
}
}  // namespace
std::uint64_t tile_unique_scratch_bytes(std::uint64_t rows, std::uint32_t) { return with_cub(rows, 32); }
std::uint64_t bucket_split_scratch_bytes(std::uint64_t rows) { return with_cub(rows, 16); }
std::uint64_t bucket_merge_scratch_bytes(std::uint64_t rows, std::uint32_t) { return with_cub(rows, 40); }
std::uint64_t index_gather_scratch_bytes(std::uint64_t rows) { return with_cub(rows, 8); }

namespace {

double value_of(const KeyRows& in, std::uint64_t row) {
  if (in.values) return in.values[row];
  double v;
  std::memcpy(&v, in.keys + row * in.stride + in.words, sizeof v);
  return v;
}

std::uint64_t bits_of(double v) {
  std::uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double double_of(std::uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// The permutation that sorts `n` keys (key i at keys[i * stride]) stably.
std::vector<std::uint64_t> stable_order(const std::uint64_t* keys, std::uint64_t n, std::uint32_t stride,
                                        std::uint32_t words) {
  std::vector<std::uint64_t> order(n);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    return compare_keys(keys + a * stride, keys + b * stride, words) < 0;
  });
  return order;
}

// stable_order's permutation for keys that mostly come as a few non-descending runs (a bucket:
// each tile's unique keys, sorted, one tile after another; or each rank's tile records, key after
// key, a key's tiles side by side): the runs found, then merged (a run's
// key before an equal key of a later run, as a stable sort puts them), the key range cut into a
// part per OpenMP thread at keys of the longest run. Any input gives stable_order's permutation;
// more than kMostRuns runs go to it (a tree of them costs about as much as the sort).
std::vector<std::uint64_t> merged_order(const std::uint64_t* keys, std::uint64_t n, std::uint32_t stride,
                                        std::uint32_t words) {
  constexpr std::size_t kMostRuns = 1 << 12;
  const auto key = [&](std::uint64_t i) { return keys + i * stride; };
  std::vector<std::uint64_t> starts{0};
  for (std::uint64_t i = 1; i < n; ++i)
    if (compare_keys(key(i - 1), key(i), words) > 0) {
      if (starts.size() == kMostRuns) return stable_order(keys, n, stride, words);
      starts.push_back(i);
    }
  const std::size_t runs = starts.size();
  starts.push_back(n);
  std::size_t longest = 0;
  for (std::size_t r = 1; r < runs; ++r)
    if (starts[r + 1] - starts[r] > starts[longest + 1] - starts[longest]) longest = r;
  // Parts: [split p, split p + 1) of the key range; run r's share starts at cut[p][r].
  const std::uint64_t long_rows = starts[longest + 1] - starts[longest];
  const auto threads = static_cast<std::uint64_t>(omp_get_max_threads());
  const std::size_t parts = runs == 1 ? 1 : std::max<std::uint64_t>(1, std::min(threads, long_rows / 4096));
  std::vector<std::vector<std::uint64_t>> cut(parts + 1, std::vector<std::uint64_t>(runs));
  for (std::size_t r = 0; r < runs; ++r) cut[0][r] = starts[r], cut[parts][r] = starts[r + 1];
  for (std::size_t p = 1; p < parts; ++p) {
    const std::uint64_t* split = key(starts[longest] + long_rows * p / parts);
    for (std::size_t r = 0; r < runs; ++r) {  // (the first key of run r not below the split)
      std::uint64_t lo = starts[r], hi = starts[r + 1];
      while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (compare_keys(key(mid), split, words) < 0) lo = mid + 1;
        else hi = mid;
      }
      cut[p][r] = lo;
    }
  }
  std::vector<std::uint64_t> order(n);
  parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) {
    std::uint64_t at = 0;
    for (std::size_t r = 0; r < runs; ++r) at += cut[p][r] - starts[r];
    // A tournament (loser) tree over the runs' next rows: the winner, the least (key, run), on
    // top; after it moves on, one match a level decides the next (a binary heap takes two).
    // (run `runs`, empty, fills the leaves past the last run)
    std::vector<std::uint64_t> next(cut[p].begin(), cut[p].end()), end(cut[p + 1].begin(), cut[p + 1].end());
    next.push_back(0), end.push_back(0);
    const auto before = [&](std::size_t a, std::size_t b) {  // (run a's next row comes out before run b's)
      if (next[a] == end[a]) return false;                   // (a run that is done loses to any)
      if (next[b] == end[b]) return true;
      const int c = compare_keys(key(next[a]), key(next[b]), words);
      return c < 0 || (c == 0 && a < b);
    };
    const std::size_t leaves = std::bit_ceil(runs);
    std::vector<std::size_t> loser(leaves), winner(2 * leaves);
    for (std::size_t l = 0; l < leaves; ++l) winner[leaves + l] = std::min(l, runs);
    for (std::size_t node = leaves; node-- > 1;) {
      const std::size_t a = winner[2 * node], b = winner[2 * node + 1];
      const bool a_wins = before(a, b) || (!before(b, a) && a <= b);
      winner[node] = a_wins ? a : b;
      loser[node] = a_wins ? b : a;
    }
    std::size_t top = leaves > 1 ? winner[1] : winner[leaves];
    while (next[top] < end[top]) {
      order[at++] = next[top]++;
      std::size_t champion = top;
      for (std::size_t node = (leaves + top) / 2; node >= 1; node /= 2)
        if (before(loser[node], champion)) std::swap(loser[node], champion);
      top = champion;
    }
  });
  return order;
}

}  // namespace

namespace cpu {

namespace {

// A tile's rows in stable key order, read through key(j), value(j) and row(j) (j-th in order).
// Keys of up to four words: (key, row, value) copied side by side and sorted by (key, row), the
// stable order, so the walk below reads them in sequence (through a permutation, its reads of
// the tile's records missed the cache: most of a tile's time).
template <std::uint32_t W>
class TileRowsSorted {
 public:
  TileRowsSorted(const KeyRows& in, std::uint64_t begin, std::uint64_t n, bool values) : rows_(n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      std::copy(in.keys + (begin + i) * in.stride, in.keys + (begin + i) * in.stride + W, rows_[i].key);
      rows_[i].row = i;
      rows_[i].value = values ? value_of(in, begin + i) : 0.0;
    }
    std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) {
      for (std::uint32_t w = 0; w < W; ++w)
        if (a.key[w] != b.key[w]) return a.key[w] < b.key[w];
      return a.row < b.row;
    });
  }
  const std::uint64_t* key(std::uint64_t j) const { return rows_[j].key; }
  double value(std::uint64_t j) const { return rows_[j].value; }
  std::uint64_t row(std::uint64_t j) const { return rows_[j].row; }

 private:
  struct Row {
    std::uint64_t key[W];
    std::uint64_t row;
    double value;
  };
  std::vector<Row> rows_;
};

// Wider keys: a stably sorted permutation of the tile's rows.
class TileRowsOrdered {
 public:
  TileRowsOrdered(const KeyRows& in, std::uint64_t begin, std::uint64_t n, bool)
      : in_(in), begin_(begin), order_(stable_order(in.keys + begin * in.stride, n, in.stride, in.words)) {}
  const std::uint64_t* key(std::uint64_t j) const { return in_.keys + (begin_ + order_[j]) * in_.stride; }
  double value(std::uint64_t j) const { return value_of(in_, begin_ + order_[j]); }
  std::uint64_t row(std::uint64_t j) const { return order_[j]; }

 private:
  const KeyRows& in_;
  std::uint64_t begin_;
  std::vector<std::uint64_t> order_;
};

// Tile t's unique keys, in key order: each one's count and its values' PairwiseSum in input order.
template <typename Sorted>
void unique_tile(const TileUnique& a, std::uint64_t t) {
  const KeyRows& in = a.in;
  const RecordLayout L = a.layout;
  const std::uint32_t cols = L.cols();
  const std::uint64_t begin = t * a.tile_rows;
  const std::uint64_t n = std::min(a.tile_rows, in.rows - begin);
  const Sorted sorted(in, begin, n, L.value);
  std::uint64_t u = 0;
  for (std::uint64_t i = 0; i < n;) {
    const std::uint64_t* key = sorted.key(i);
    std::uint64_t* rec = a.records + (begin + u) * cols;
    std::copy(key, key + in.words, rec);
    PairwiseSum sum;
    std::uint64_t j = i;
    for (; j < n && compare_keys(sorted.key(j), key, in.words) == 0; ++j) {
      if (L.value) sum.add(sorted.value(j));
      if (a.local) a.local[begin + sorted.row(j)] = u;
    }
    if (L.value) rec[L.value_col()] = bits_of(sum.total());
    rec[L.count_col()] = j - i;
    if (L.origin) rec[L.origin_col()] = a.first_row + begin + u;
    ++u;
    i = j;
  }
  a.tile_unique[t] = u;
}

}  // namespace

void tile_unique(const TileUnique& a) {
  const auto tiles = static_cast<std::int64_t>(tiles_of(a.in.rows, a.tile_rows));
  // (a tile's sort allocates: parallel_for lets its std::bad_alloc out)
  parallel_for(tiles, [&](std::int64_t t) {
    const auto tile = static_cast<std::uint64_t>(t);
    switch (a.in.words) {
      case 1: return unique_tile<TileRowsSorted<1>>(a, tile);
      case 2: return unique_tile<TileRowsSorted<2>>(a, tile);
      case 3: return unique_tile<TileRowsSorted<3>>(a, tile);
      case 4: return unique_tile<TileRowsSorted<4>>(a, tile);
      default: return unique_tile<TileRowsOrdered>(a, tile);
    }
  });
}

void tile_samples(const TileSamples& a) {
  const std::uint32_t cols = a.layout.cols(), words = a.layout.words;
  const std::uint64_t pw = sample_partial_words(a.samples, words);
  for (std::uint64_t t = 0; t < a.tiles; ++t) {
    const std::uint64_t u = a.tile_unique[t];
    const std::uint64_t taken = std::min<std::uint64_t>(u, a.samples);
    std::uint64_t* p = a.partials + t * pw;
    std::fill(p, p + pw, 0);
    p[0] = taken;
    p[1] = u;
    for (std::uint64_t j = 0; j < taken; ++j) {
      const std::uint64_t pos = u <= a.samples ? j : sample_position(j, u, a.samples, a.first_tile + t);
      const std::uint64_t* rec = a.records + (t * a.tile_rows + pos) * cols;
      std::copy(rec, rec + words, p + 2 + j * words);
    }
  }
}

void bucket_split(const BucketSplit& a) {
  const std::uint32_t cols = a.layout.cols(), words = a.layout.words, B = a.buckets;
  const std::uint64_t tiles = tiles_of(a.rows, a.tile_rows);
  const auto each_tile = [&](auto&& body) { parallel_for(static_cast<std::int64_t>(tiles), body); };
  // One bucket in place: the tiles' records move down, tile after tile (each lands at or below
  // where it is, after the tiles before it), with no temporary.
  if (B == 1 && a.out == a.records) {
    std::uint64_t at = 0;
    for (std::uint64_t t = 0; t < tiles; ++t) {
      const std::uint64_t n = a.tile_unique[t] * cols;
      if (at != t * a.tile_rows * cols) std::memmove(a.out + at, a.records + t * a.tile_rows * cols, n * 8);
      at += n;
    }
    a.counts[0] = at / cols;
    return;
  }
  // In place (out == records): the records move through a host temporary.
  std::vector<std::uint64_t> copy(a.out == a.records ? a.rows * cols : 0);
  if (!copy.empty())
    each_tile([&](std::int64_t t) {
      const std::uint64_t first = static_cast<std::uint64_t>(t) * a.tile_rows * cols;
      std::copy(a.records + first, a.records + std::min(copy.size(), first + a.tile_rows * cols), copy.begin() + first);
    });
  const std::uint64_t* records = copy.empty() ? a.records : copy.data();
  // Each record's bucket and each tile's count a bucket, then a stable counting sort by bucket
  // (tile-major order within one): tile t's records of bucket b start after the earlier buckets
  // and after b's records of the earlier tiles.
  std::vector<std::uint32_t> bucket(a.rows, B);
  std::vector<std::uint64_t> tile_counts(tiles * B, 0);
  each_tile([&](std::int64_t t) {
    for (std::uint64_t j = 0; j < a.tile_unique[t]; ++j) {
      const std::uint64_t r = static_cast<std::uint64_t>(t) * a.tile_rows + j;
      bucket[r] = bucket_of(records + r * cols, a.splitters, B - 1, words);
      ++tile_counts[static_cast<std::uint64_t>(t) * B + bucket[r]];
    }
  });
  std::vector<std::uint64_t> at(tiles * B, 0), counts(B, 0);  // (at: where tile t's records of bucket b go)
  for (std::uint64_t start = 0, b = 0; b < B; ++b)
    for (std::uint64_t t = 0; t < tiles; ++t) {
      at[t * B + b] = start;
      start += tile_counts[t * B + b];
      counts[b] += tile_counts[t * B + b];
    }
  each_tile([&](std::int64_t t) {
    std::uint64_t* next = at.data() + static_cast<std::uint64_t>(t) * B;
    for (std::uint64_t j = 0; j < a.tile_unique[t]; ++j) {
      const std::uint64_t r = static_cast<std::uint64_t>(t) * a.tile_rows + j;
      std::copy(records + r * cols, records + (r + 1) * cols, a.out + next[bucket[r]]++ * cols);
    }
  });
  std::copy(counts.begin(), counts.end(), a.counts);
}

void bucket_merge(const BucketMerge& a) {
  const RecordLayout L = a.layout;
  const std::uint32_t cols = L.cols(), words = L.words;
  const std::vector<std::uint64_t> order = merged_order(a.records, a.rows, cols, words);
  std::vector<std::uint64_t> position(L.origin ? a.rows : 0);  // of each record's key (sorted order)
  const auto key_of = [&](std::uint64_t i) { return a.records + order[i] * cols; };
  // The sorted records in parts that start at a new key, a part per OpenMP thread: each part's
  // keys counted, then written from where the parts before it end.
  const auto threads = static_cast<std::uint64_t>(omp_get_max_threads());
  const std::uint64_t parts = std::max<std::uint64_t>(1, std::min(threads, a.rows / 65536));
  // (first[p]: part p's first record in sorted order; first_key[p]: its first unique key's index)
  std::vector<std::uint64_t> first(parts + 1, a.rows), first_key(parts, 0), counted(parts, 0);
  first[0] = 0;
  for (std::uint64_t p = 1; p < parts; ++p) {
    std::uint64_t b = std::max(first[p - 1], a.rows * p / parts);
    while (b > 0 && b < a.rows && compare_keys(key_of(b), key_of(b - 1), words) == 0) ++b;
    first[p] = b;
  }
  // (write: each key's record; else only counted)
  const auto walk = [&](std::uint64_t p, bool write) {
    std::uint64_t u = first_key[p];
    for (std::uint64_t i = first[p]; i < first[p + 1];) {
      const std::uint64_t* key = key_of(i);
      std::uint64_t count = 0, j = i;
      PairwiseSum sum;
      for (; j < a.rows && compare_keys(key_of(j), key, words) == 0; ++j)
        if (write) {
          const std::uint64_t* rec = key_of(j);
          count += rec[L.count_col()];
          if (L.value) sum.add(double_of(rec[L.value_col()]));
          if (L.origin) position[j] = u;
        }
      if (write) {
        std::copy(key, key + words, a.keys + u * words);
        a.counts[u] = count;
        if (L.value) a.values[u] = sum.total();
      }
      ++u;
      i = j;
    }
    return u - first_key[p];
  };
  if (parts > 1) parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) { counted[p] = walk(p, false); });
  for (std::uint64_t p = 0; p + 1 < parts; ++p) first_key[p + 1] = first_key[p] + counted[p];
  parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) { counted[p] = walk(p, true); });
  *a.unique = first_key[parts - 1] + counted[parts - 1];
  if (!L.origin) return;
  // The pairs in key order, grouped stably by row bucket.
  std::vector<std::uint64_t> counts(a.row_buckets, 0), at(a.row_buckets, 0);
  auto row_bucket = [&](std::uint64_t i) {
    return a.records[order[i] * cols + L.origin_col()] / a.rows_per_row_bucket;
  };
  for (std::uint64_t i = 0; i < a.rows; ++i) ++counts.at(row_bucket(i));
  for (std::uint32_t r = 1; r < a.row_buckets; ++r) at[r] = at[r - 1] + counts[r - 1];
  for (std::uint64_t i = 0; i < a.rows; ++i) {
    std::uint64_t* p = a.pairs + 3 * at[row_bucket(i)]++;
    p[0] = a.records[order[i] * cols + L.origin_col()];
    p[1] = a.batch;
    p[2] = position[i];
  }
  std::copy(counts.begin(), counts.end(), a.pair_counts);
}

namespace {

// How many pieces a pass over n rows is cut into (any number gives the same result), and piece
// p's rows [first, last).
std::uint64_t pieces_for(std::uint64_t n) {
  return std::max<std::uint64_t>(1, std::min<std::uint64_t>(static_cast<std::uint64_t>(omp_get_max_threads()), n / 4096));
}
std::pair<std::uint64_t, std::uint64_t> piece_rows(std::uint64_t n, std::uint64_t pieces, std::int64_t p) {
  const auto q = static_cast<std::uint64_t>(p);
  return {n * q / pieces, n * (q + 1) / pieces};
}

// One stable counting-sort pass over rows of W key words and an index (S = W + 1 words), by the
// byte at `shift` of key word `word`: each piece's rows
// counted by digit, then written in order from where its digit's rows of the pieces before end.
template <std::uint32_t W>
void radix_pass(const std::uint64_t* src, std::uint64_t* dst, std::uint64_t n, std::uint32_t word, std::uint32_t shift) {
  constexpr std::uint32_t S = W + 1;
  const std::uint64_t pieces = pieces_for(n);
  std::vector<std::array<std::uint64_t, 256>> at(pieces);
  // (each piece counts and writes through a copy of its counters on its own stack: the pieces'
  // counters side by side in `at` would share cache lines between threads at its edges)
  parallel_for(static_cast<std::int64_t>(pieces), [&](std::int64_t p) {
    std::array<std::uint64_t, 256> count{};
    const auto [first, last] = piece_rows(n, pieces, p);
    for (std::uint64_t i = first; i < last; ++i) ++count[(src[i * S + word] >> shift) & 255];
    at[p] = count;
  });
  std::uint64_t start = 0;
  for (std::uint32_t d = 0; d < 256; ++d)
    for (std::uint64_t p = 0; p < pieces; ++p) start += std::exchange(at[p][d], start);
  parallel_for(static_cast<std::int64_t>(pieces), [&](std::int64_t p) {
    std::array<std::uint64_t, 256> next = at[p];
    const auto [first, last] = piece_rows(n, pieces, p);
    for (std::uint64_t i = first; i < last; ++i) {
      const std::uint64_t* row = src + i * S;
      std::copy(row, row + S, dst + next[(row[word] >> shift) & 255]++ * S);
    }
  });
}

// The rows sorted stably by key, through `spare`; returns where they ended up.
template <std::uint32_t W>
const std::uint64_t* radix_sort(std::uint64_t* rows, std::uint64_t* spare, std::uint64_t n) {
  constexpr std::uint32_t S = W + 1;
  // (the bits in which some key differs from the first: no pass over a byte every key shares)
  std::array<std::uint64_t, W> varying{};
  if (n > 0) {
    const std::uint64_t pieces = pieces_for(n);
    std::vector<std::array<std::uint64_t, W>> partial(pieces);
    parallel_for(static_cast<std::int64_t>(pieces), [&](std::int64_t p) {
      std::array<std::uint64_t, W> v{};  // (in registers: the pieces' entries in `partial` share cache lines)
      const auto [first, last] = piece_rows(n, pieces, p);
      for (std::uint64_t i = first; i < last; ++i)
        for (std::uint32_t w = 0; w < W; ++w) v[w] |= rows[i * S + w] ^ rows[w];
      partial[p] = v;
    });
    for (const auto& v : partial)
      for (std::uint32_t w = 0; w < W; ++w) varying[w] |= v[w];
  }
  std::uint64_t *from = rows, *to = spare;
  for (std::uint32_t w = W; w-- > 0;)  // (word W - 1 is the least significant)
    for (std::uint32_t shift = 0; shift < 64; shift += 8)
      if ((varying[w] >> shift) & 255) {
        radix_pass<W>(from, to, n, w, shift);
        std::swap(from, to);
      }
  return from;
}

}  // namespace

RadixUnique::RadixUnique(const RadixUniqueArgs& a) : args_(a) {
  const std::uint32_t S = a.words + 1;
  const std::uint64_t n = a.rows;
  // (each row's value out, its index in: the sort carries the index, the sums read the values)
  parallel_for(static_cast<std::int64_t>(pieces_for(n)), [&, pieces = pieces_for(n)](std::int64_t p) {
    const auto [first, last] = piece_rows(n, pieces, p);
    for (std::uint64_t i = first; i < last; ++i) {
      std::memcpy(&a.values[i], &a.records[i * S + a.words], 8);
      a.records[i * S + a.words] = i;
    }
  });
  switch (a.words) {
    case 1: sorted_ = radix_sort<1>(a.records, a.spare, n); break;
    case 2: sorted_ = radix_sort<2>(a.records, a.spare, n); break;
    case 3: sorted_ = radix_sort<3>(a.records, a.spare, n); break;
    case 4: sorted_ = radix_sort<4>(a.records, a.spare, n); break;
    default: throw std::invalid_argument("RadixUnique: keys of 1 to 4 words");
  }
  // Parts that start at a new key, a part per thread; each part's keys and (key, tile) pairs counted.
  const std::uint64_t parts = pieces_for(n);
  part_first_.assign(parts + 1, n);
  part_first_[0] = 0;
  for (std::uint64_t p = 1; p < parts; ++p) {
    std::uint64_t b = std::max(part_first_[p - 1], piece_rows(n, parts, static_cast<std::int64_t>(p)).first);
    while (b > 0 && b < n && compare_keys(sorted_ + b * S, sorted_ + (b - 1) * S, a.words) == 0) ++b;
    part_first_[p] = b;
  }
  std::vector<std::uint64_t> keys(parts, 0), tiles(parts, 0);
  // (counted in locals and stored once: the parts' counters side by side in `keys` and `tiles`,
  // stored to at every row, kept two threads' cache line going back and forth, and the count no
  // faster on two threads than on one)
  parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) {
    std::uint64_t part_keys = 0, part_tiles = 0;
    for (std::uint64_t i = part_first_[p]; i < part_first_[p + 1]; ++i) {
      const bool new_key = i == part_first_[p] || compare_keys(sorted_ + i * S, sorted_ + (i - 1) * S, a.words) != 0;
      part_keys += new_key;
      part_tiles += new_key || sorted_[i * S + a.words] / a.tile_rows != sorted_[(i - 1) * S + a.words] / a.tile_rows;
    }
    keys[p] = part_keys, tiles[p] = part_tiles;
  });
  part_first_key_.assign(parts, 0);
  part_first_tile_record_.assign(parts, 0);
  for (std::uint64_t p = 0; p < parts; ++p) {
    part_first_key_[p] = unique_, part_first_tile_record_[p] = tile_records_;
    unique_ += keys[p], tile_records_ += tiles[p];
  }
}

void RadixUnique::write(std::uint64_t* keys, std::uint64_t* counts, double* values, std::uint64_t* index) const {
  const std::uint32_t W = args_.words, S = W + 1;
  const std::uint64_t parts = part_first_key_.size(), tile_rows = args_.tile_rows;
  parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) {
    std::uint64_t u = part_first_key_[p];
    for (std::uint64_t i = part_first_[p]; i < part_first_[p + 1]; ++u) {
      const std::uint64_t* key = sorted_ + i * S;
      // (a tile's rows summed as tile_unique sums them, the tiles' sums as bucket_merge sums them)
      PairwiseSum sum, tile_sum;
      std::uint64_t tile = key[W] / tile_rows, j = i;
      for (; j < part_first_[p + 1] && compare_keys(sorted_ + j * S, key, W) == 0; ++j) {
        const std::uint64_t row = sorted_[j * S + W];
        if (row / tile_rows != tile) {
          sum.add(tile_sum.total());
          tile_sum = PairwiseSum{};
          tile = row / tile_rows;
        }
        tile_sum.add(args_.values[row]);
        if (index) index[row] = u;
      }
      sum.add(tile_sum.total());
      std::copy(key, key + W, keys + u * W);
      counts[u] = j - i;
      values[u] = sum.total();
      i = j;
    }
  });
}

void RadixUnique::write_tile_records(std::uint64_t* records, std::uint64_t* record_of_row,
                                     std::uint64_t first_origin) const {
  const std::uint32_t W = args_.words, S = W + 1, cols = W + (record_of_row ? 3 : 2);
  const std::uint64_t parts = part_first_key_.size(), tile_rows = args_.tile_rows;
  parallel_for(static_cast<std::int64_t>(parts), [&](std::int64_t p) {
    std::uint64_t record = part_first_tile_record_[p];
    std::uint64_t* out = records + record * cols;
    for (std::uint64_t i = part_first_[p]; i < part_first_[p + 1]; ++record) {
      const std::uint64_t* key = sorted_ + i * S;
      const std::uint64_t tile = key[W] / tile_rows;
      PairwiseSum sum;
      std::uint64_t j = i;
      for (; j < part_first_[p + 1] && compare_keys(sorted_ + j * S, key, W) == 0 &&
             sorted_[j * S + W] / tile_rows == tile;
           ++j) {
        sum.add(args_.values[sorted_[j * S + W]]);
        if (record_of_row) record_of_row[sorted_[j * S + W]] = record;
      }
      std::copy(key, key + W, out);
      const double total = sum.total();
      std::memcpy(out + W, &total, 8);
      out[W + 1] = j - i;
      if (record_of_row) out[W + 2] = first_origin + record;
      out += cols;
      i = j;
    }
  });
}

void index_gather(const IndexGather& a) {
  std::vector<std::uint64_t> table(a.rows, ~std::uint64_t{0});
  for (std::uint64_t p = 0; p < a.pair_count; ++p) {
    const std::uint64_t* pair = a.pairs + 3 * p;
    if (pair[0] < a.first_row || pair[0] - a.first_row >= a.rows)
      throw std::logic_error("index_gather: a pair's origin lies outside the batch");
    table[pair[0] - a.first_row] = a.prefix[pair[1]] + pair[2];
  }
  const auto rows = static_cast<std::int64_t>(a.rows);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::uint64_t tile_start = static_cast<std::uint64_t>(i) / a.tile_rows * a.tile_rows;
    a.index[i] = table[tile_start + a.local[i]];
  }
}

}  // namespace cpu

void tile_unique(Stream& stream, const TileUnique& args) {
  QSTAGE_DISPATCH(stream, cpu::tile_unique(args), detail::tile_unique_cuda(stream.native(), args));
}
void tile_samples(Stream& stream, const TileSamples& args) {
  QSTAGE_DISPATCH(stream, cpu::tile_samples(args), detail::tile_samples_cuda(stream.native(), args));
}
void bucket_split(Stream& stream, const BucketSplit& args) {
  QSTAGE_DISPATCH(stream, cpu::bucket_split(args), detail::bucket_split_cuda(stream.native(), args));
}
void bucket_merge(Stream& stream, const BucketMerge& args) {
  QSTAGE_DISPATCH(stream, cpu::bucket_merge(args), detail::bucket_merge_cuda(stream.native(), args));
}
void sort_keys_plain(Stream& stream, const std::uint64_t* in, std::uint64_t* out, std::uint64_t n, Workspace work) {
  QSTAGE_DISPATCH(stream, (std::copy(in, in + n, out), std::sort(out, out + n)),
                  detail::sort_keys_plain_cuda(stream.native(), in, out, n, work));
}
void index_gather(Stream& stream, const IndexGather& args) {
  QSTAGE_DISPATCH(stream, cpu::index_gather(args), detail::index_gather_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
