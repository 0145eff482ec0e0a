// The CPU twin of kernels/sort_unique.cu: std::stable_sort per tile (OpenMP over tiles), every
// run's terms added to a PairwiseSum in sorted order, which a stable sort makes input order: the
// same bytes as the GPU's.
#include "kernels/sort_unique.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/dispatch.hpp"

namespace qstage::kernels {

std::uint64_t tiles_of(std::uint64_t rows, std::uint64_t tile_rows) { return (rows + tile_rows - 1) / tile_rows; }

// The GPU versions' scratch (kernels/sort_unique.cu says what each array is), with CUB's share.
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

}  // namespace

namespace cpu {

void tile_unique(const TileUnique& a) {
  const KeyRows& in = a.in;
  const RecordLayout L = a.layout;
  const std::uint32_t cols = L.cols();
  const auto tiles = static_cast<std::int64_t>(tiles_of(in.rows, a.tile_rows));
  // (a tile's sort allocates: parallel_for lets its std::bad_alloc out)
  parallel_for(tiles, [&](std::int64_t t) {
    const std::uint64_t begin = static_cast<std::uint64_t>(t) * a.tile_rows;
    const std::uint64_t n = std::min(a.tile_rows, in.rows - begin);
    const std::vector<std::uint64_t> order = stable_order(in.keys + begin * in.stride, n, in.stride, in.words);
    std::uint64_t u = 0;
    for (std::uint64_t i = 0; i < n;) {
      const std::uint64_t* key = in.keys + (begin + order[i]) * in.stride;
      std::uint64_t* rec = a.records + (begin + u) * cols;
      std::copy(key, key + in.words, rec);
      PairwiseSum sum;
      std::uint64_t j = i;
      for (; j < n && compare_keys(in.keys + (begin + order[j]) * in.stride, key, in.words) == 0; ++j) {
        if (L.value) sum.add(value_of(in, begin + order[j]));
        if (a.local) a.local[begin + order[j]] = u;
      }
      if (L.value) rec[L.value_col()] = bits_of(sum.total());
      rec[L.count_col()] = j - i;
      if (L.origin) rec[L.origin_col()] = a.first_row + begin + u;
      ++u;
      i = j;
    }
    a.tile_unique[t] = u;
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
  // In place (out == records): the records move through a host temporary.
  std::vector<std::uint64_t> copy(a.out == a.records ? a.rows * cols : 0);
  std::copy(a.records, a.records + copy.size(), copy.begin());
  const std::uint64_t* records = copy.empty() ? a.records : copy.data();
  // Each record's bucket, then a stable counting sort by bucket: tile-major order within one.
  std::vector<std::uint32_t> bucket(a.rows, B);
  std::vector<std::uint64_t> counts(B, 0);
  for (std::uint64_t t = 0; t < tiles; ++t)
    for (std::uint64_t j = 0; j < a.tile_unique[t]; ++j) {
      const std::uint64_t r = t * a.tile_rows + j;
      bucket[r] = bucket_of(records + r * cols, a.splitters, B - 1, words);
      ++counts[bucket[r]];
    }
  std::vector<std::uint64_t> at(B, 0);
  for (std::uint32_t b = 1; b < B; ++b) at[b] = at[b - 1] + counts[b - 1];
  for (std::uint64_t r = 0; r < a.rows; ++r)
    if (bucket[r] < B) std::copy(records + r * cols, records + (r + 1) * cols, a.out + at[bucket[r]]++ * cols);
  std::copy(counts.begin(), counts.end(), a.counts);
}

void bucket_merge(const BucketMerge& a) {
  const RecordLayout L = a.layout;
  const std::uint32_t cols = L.cols(), words = L.words;
  const std::vector<std::uint64_t> order = stable_order(a.records, a.rows, cols, words);
  std::vector<std::uint64_t> position(L.origin ? a.rows : 0);  // of each record's key (sorted order)
  std::uint64_t u = 0;
  for (std::uint64_t i = 0; i < a.rows;) {
    const std::uint64_t* key = a.records + order[i] * cols;
    std::copy(key, key + words, a.keys + u * words);
    std::uint64_t count = 0, j = i;
    PairwiseSum sum;
    for (; j < a.rows && compare_keys(a.records + order[j] * cols, key, words) == 0; ++j) {
      const std::uint64_t* rec = a.records + order[j] * cols;
      count += rec[L.count_col()];
      if (L.value) sum.add(double_of(rec[L.value_col()]));
      if (L.origin) position[j] = u;
    }
    a.counts[u] = count;
    if (L.value) a.values[u] = sum.total();
    ++u;
    i = j;
  }
  *a.unique = u;
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
