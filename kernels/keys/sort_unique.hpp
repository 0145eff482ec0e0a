#pragma once
// Sort-based de-duplication of multi-word keys (seed 004, section 4.1: local sort and unique,
// regular samples, splitters, exchange, merge), as the kernels of the keys.dedup passes
// (stages/keys/dedup_passes.hpp).
//
// Keys are 1-4 uint64 words compared lexicographically, word 0 most significant (an (alpha, beta)
// determinant pair sorts as a 128-bit key). Everything here is sorted *stably*, so rows with
// equal keys keep their input order, and every float sum is a sequential sum in that order:
// the CPU twin (kernels/keys/sort_unique.cpp) and the GPU (kernels/keys/sort_unique.cu) give the same bytes.
//
// A *record* is one row of uint64 columns (RecordLayout): the key words, the float64 value's bits
// (if any), the count of rows it stands for, and (for the reverse index) its origin: the id of the
// (tile, tile-local unique key) it came from, first_row_of_tile + local position. Pointers are
// device memory on cuda and host memory on cpu; calls are queued on `stream`.
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/common.hpp"

namespace qstage::kernels {

constexpr std::uint32_t kMaxKeyWords = 4;

// Device memory a call works in: its *_scratch_bytes, the arrays it sorts through plus a share
// for CUB's temporary storage (4 bytes a row and kCubFixedBytes; CUB says what it needs only at
// run time, and the .cu checks that it fits). The CPU twins do not use it: their temporaries are
// host memory, which is what a cpu "device" is.
constexpr std::uint64_t kCubFixedBytes = 64 << 10;
struct Workspace {
  void* scratch = nullptr;
  std::uint64_t scratch_bytes = 0;
};

struct RecordLayout {
  std::uint32_t words = 1;  // key words, 1..4
  bool value = false;       // a float64 (its bits) follows the key
  bool origin = false;      // a trailing origin id (reverse index)
  QSTAGE_HD std::uint32_t value_col() const { return words; }
  QSTAGE_HD std::uint32_t count_col() const { return words + (value ? 1u : 0u); }
  QSTAGE_HD std::uint32_t origin_col() const { return count_col() + 1; }
  QSTAGE_HD std::uint32_t cols() const { return count_col() + 1 + (origin ? 1u : 0u); }
};

// -1, 0, 1 as key a (words at a) is below, equal to or above key b.
QSTAGE_HD int compare_keys(const std::uint64_t* a, const std::uint64_t* b, std::uint32_t words) {
  for (std::uint32_t w = 0; w < words; ++w)
    if (a[w] != b[w]) return a[w] < b[w] ? -1 : 1;
  return 0;
}

// How every value sum here is formed (both twins): pairwise, in a fixed shape over the terms in
// input order. n terms split into aligned full binary trees by the binary digits of n, largest
// first (n = 6: terms 0-3 and 4-5), each summed as a complete binary tree of adjacent pairs, and
// those folded from the right (S4 + S2). The shape depends on n only, so a long run of equal keys
// can be summed by a whole GPU block and still give the bits of one thread's sequential add();
// and the rounding error grows with log n, not n.
struct PairwiseSum {
  static constexpr int kLevels = 48;  // runs below 2^48 terms
  double part[kLevels];               // part[l]: the complete tree of 2^l terms, where bit l of n is set
  std::uint64_t n = 0;
  QSTAGE_HD void add(double x) {
    int level = 0;
    for (; (n >> level) & 1; ++level) x = part[level] + x;  // carries: (left subtree) + (right)
    part[level] = x;
    ++n;
  }
  // A complete tree of 2^level terms that follows the n terms so far (n a multiple of 2^level).
  QSTAGE_HD void add_tree(double x, int level) {
    const std::uint64_t terms = std::uint64_t{1} << level;
    for (; (n >> level) & 1; ++level) x = part[level] + x;
    part[level] = x;
    n += terms;
  }
  QSTAGE_HD double total() const {  // (the levels of n's set bits, ascending)
    if (n == 0) return 0;
    double acc = part[lowest_bit(n)];
    for (std::uint64_t rest = n & (n - 1); rest; rest &= rest - 1) acc = part[lowest_bit(rest)] + acc;
    return acc;
  }
};

// The bucket of a key: how many of the (ascending) splitters are <= it, so bucket b holds the
// keys in [splitter b-1, splitter b) and every copy of a key falls in one bucket.
QSTAGE_HD std::uint32_t bucket_of(const std::uint64_t* key, const std::uint64_t* splitters, std::uint32_t count,
                                  std::uint32_t words) {
  std::uint32_t lo = 0, hi = count;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (compare_keys(splitters + static_cast<std::uint64_t>(mid) * words, key, words) <= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// A batch's input rows: each row's key words at keys[row * stride], and its value either in a
// separate column (values) or interleaved after the key (column `words` of the row, the float64's
// bits: SCI's {alpha, beta, value} candidate records), or none.
struct KeyRows {
  const std::uint64_t* keys = nullptr;
  std::uint32_t words = 1;
  std::uint32_t stride = 1;  // uint64 per row: words, or words + 1 with an interleaved value
  const double* values = nullptr;
  bool interleaved = false;
  std::uint64_t rows = 0;
  bool has_value() const { return values != nullptr || interleaved; }
  // Rows of `words` key words, each followed by its value's bits.
  static KeyRows interleaved_rows(const std::uint64_t* keys, std::uint32_t words, std::uint64_t rows) {
    return {keys, words, words + 1, nullptr, true, rows};
  }
};

// Per tile (rows [t * tile_rows, ...) of the batch; a batch is whole tiles of the pass, so tiles do
// not depend on the batch size): its rows sorted stably by key and reduced to one record per
// distinct key (count, value: a PairwiseSum in input order, origin), ascending. Tile t's records go to
// records[t * tile_rows ...] (a record never outnumbers its tile's rows), their count to
// tile_unique[t]. With `local`, local[i] = the position of row i's key among its tile's records.
struct TileUnique {
  KeyRows in;
  RecordLayout layout;           // of the records: in.words, in.has_value(), origin as wanted
  std::uint64_t tile_rows = 1;
  std::uint64_t first_row = 0;   // the pass row of input row 0 (origins count from it)
  std::uint64_t* records = nullptr;      // in.rows records of layout.cols() words
  std::uint64_t* tile_unique = nullptr;  // one per tile
  std::uint64_t* local = nullptr;        // optional: one per input row
  Workspace work;  // tile_unique_scratch_bytes(in.rows, in.words)
};
std::uint64_t tiles_of(std::uint64_t rows, std::uint64_t tile_rows);
std::uint64_t tile_unique_scratch_bytes(std::uint64_t rows, std::uint32_t words);
void tile_unique(Stream& stream, const TileUnique& args);

// Jittered regular samples of each tile's records (TileUnique's layout): partial t gets
// [taken, weight, taken keys], fixed size sample_partial_words(samples, words): the records at
// positions sample_position(j, u, samples, tile) (all u if u <= samples), and u, the records they
// stand for. Each tile's positions are shifted by its own phase in [0, 1) of the spacing, so
// tiles of alike keys do not all sample the same quantiles: with plain positions j * u / s, the
// s samples of every tile cluster at s points of the key space and no more than about s
// buckets can be told apart, whatever the number of tiles.
struct TileSamples {
  const std::uint64_t* records = nullptr;
  const std::uint64_t* tile_unique = nullptr;
  RecordLayout layout;
  std::uint64_t tiles = 0, tile_rows = 1;
  std::uint64_t first_tile = 0;  // the pass's index of tile 0 (its phase depends on it, not on batches)
  std::uint32_t samples = 1;
  std::uint64_t* partials = nullptr;  // tiles * sample_partial_words(...) words
};
QSTAGE_HD std::uint64_t sample_partial_words(std::uint32_t samples, std::uint32_t words) {
  return 2 + static_cast<std::uint64_t>(samples) * words;
}
// floor((j + phase) * u / samples), phase = the top 32 bits of fmix64(tile + 1) over 2^32; below u.
QSTAGE_HD std::uint64_t sample_position(std::uint64_t j, std::uint64_t u, std::uint32_t samples, std::uint64_t tile) {
  const std::uint64_t phase = fmix64(tile + 1) >> 32;
  return (j * u + ((phase * (u & 0xffffffffu)) >> 32) + phase * (u >> 32)) / samples;
}
void tile_samples(Stream& stream, const TileSamples& args);

// TileUnique's records, grouped by bucket (bucket_of the splitters): bucket 0's first, and within
// a bucket tile after tile, each tile's records ascending (the exchange keeps that order, so a
// bucket arrives in tile order whatever the batches were). counts[b] = bucket b's records.
struct BucketSplit {
  const std::uint64_t* records = nullptr;
  const std::uint64_t* tile_unique = nullptr;
  RecordLayout layout;
  std::uint64_t rows = 0, tile_rows = 1;
  const std::uint64_t* splitters = nullptr;  // buckets - 1 keys, ascending
  std::uint32_t buckets = 1;
  std::uint64_t* out = nullptr;     // rows records at most; the CPU twin's may be `records` (in place:
                                    // with one bucket, without a temporary)
  std::uint64_t* counts = nullptr;  // buckets
  Workspace work;  // bucket_split_scratch_bytes(rows)
};
std::uint64_t bucket_split_scratch_bytes(std::uint64_t rows);
void bucket_split(Stream& stream, const BucketSplit& args);

// One bucket's records (from every tile, in tile order) sorted stably by key and reduced: the
// distinct keys ascending with their counts summed and values a PairwiseSum in order, and their number
// in *unique. With layout.origin, every record also leaves a pair (origin, batch, position of its
// key among this batch's keys), grouped by row bucket (origin / rows_per_row_bucket), each group
// in key order, and pair_counts[r] = row bucket r's pairs: the reverse index, still to be put in
// row order (IndexGather).
struct BucketMerge {
  const std::uint64_t* records = nullptr;
  std::uint64_t rows = 0;
  RecordLayout layout;
  std::uint64_t* keys = nullptr;    // rows * words at most
  std::uint64_t* counts = nullptr;  // rows at most
  double* values = nullptr;         // with layout.value
  std::uint64_t* unique = nullptr;  // one
  std::uint64_t batch = 0;
  std::uint64_t* pairs = nullptr;   // with layout.origin: rows * 3 words
  std::uint64_t* pair_counts = nullptr;
  std::uint32_t row_buckets = 1;
  std::uint64_t rows_per_row_bucket = 1;
  Workspace work;  // bucket_merge_scratch_bytes(rows, words)
};
std::uint64_t bucket_merge_scratch_bytes(std::uint64_t rows, std::uint32_t words);
void bucket_merge(Stream& stream, const BucketMerge& args);

// The reverse index of a batch of pass rows [first_row, first_row + rows) (whole tiles): the
// pairs of the origins in that range (any order; origins are distinct) give each (tile, local)
// its batch and position there, and index[i] = prefix[batch] + position for the origin
// first_row_of_tile(i) + local[i]. prefix: the exclusive prefix sums of every merge batch's keys.
struct IndexGather {
  const std::uint64_t* local = nullptr;
  std::uint64_t rows = 0, first_row = 0, tile_rows = 1;
  const std::uint64_t* pairs = nullptr;
  std::uint64_t pair_count = 0;
  const std::uint64_t* prefix = nullptr;
  std::uint64_t* index = nullptr;
  Workspace work;  // index_gather_scratch_bytes(rows)
};
std::uint64_t index_gather_scratch_bytes(std::uint64_t rows);
void index_gather(Stream& stream, const IndexGather& args);

// The yardstick the dedup is measured against (qstage_bench dedup): a plain sort of n single-word
// keys, CUB's DeviceRadixSort::SortKeys on the GPU (std::sort on the CPU). work: n * 8 bytes and CUB's.
void sort_keys_plain(Stream& stream, const std::uint64_t* in, std::uint64_t* out, std::uint64_t n, Workspace work);

namespace cpu {

// The CPU's dedup of one bucket in one call (selected CI's on resident data): for rows of `words`
// key words and an interleaved value, the keys, counts and values that tile_unique, bucket_split
// into one bucket and bucket_merge give (no origin), bit for bit, and tile_unique's record count.
// A stable radix sort of the whole (least significant digit first, over only the bytes in which
// some keys differ) takes the place of a comparison sort per tile and a merge of the tiles (2 of a
// semistochastic group's 3 seconds on 16 cores): it leaves each key's rows in input order, so a
// key's value is still formed as the chain forms it, a PairwiseSum over its tiles, in tile order,
// of each tile's PairwiseSum of its rows. The result does not depend on the thread count.
struct RadixUniqueArgs {
  std::uint64_t* records = nullptr;  // rows of words + 1 (the key, the value's bits); sorted through: consumed
  std::uint64_t* spare = nullptr;    // rows * (words + 1): the sort's other half
  double* values = nullptr;          // rows: the values, taken out of the records
  std::uint64_t rows = 0;
  std::uint32_t words = 1;           // 1..4
  std::uint64_t tile_rows = 1;       // tile_unique's tiles: they shape the sums
};
class RadixUnique {
 public:
  explicit RadixUnique(const RadixUniqueArgs& args);  // sorts, and counts what write() writes
  // Where the sorted rows are: the other of records and spare is free once this is built.
  bool sorted_in_spare() const { return sorted_ == args_.spare; }
  std::uint64_t unique() const { return unique_; }
  std::uint64_t tile_records() const { return tile_records_; }  // (each key's distinct tiles, summed)
  // unique() keys (words each, ascending), counts and values, into memory apart from the args' arrays;
  // with `index` (rows), every row's key's position among them (keys.dedup's reverse index).
  void write(std::uint64_t* keys, std::uint64_t* counts, double* values, std::uint64_t* index = nullptr) const;
  // Or tile_records() records of tile_unique's layout ({words, value}: the key, the tile's
  // PairwiseSum of its rows' values, their count), key after key and each key's tiles in tile
  // order: the records tile_unique makes, sorted stably by key, which is what bucket_split leaves
  // of them in a bucket once sorted (and bucket_merge then sums them as write() does).
  // With `record_of_row` (rows), the records take the origin layout ({words, value, origin}), the
  // origin of record k being first_origin + k, and record_of_row[row] = the record its row went
  // into: a reverse index through whatever positions the records' keys get (unique_over_ranks).
  void write_tile_records(std::uint64_t* records, std::uint64_t* record_of_row = nullptr,
                          std::uint64_t first_origin = 0) const;

 private:
  RadixUniqueArgs args_;
  const std::uint64_t* sorted_ = nullptr;
  std::vector<std::uint64_t> part_first_, part_first_key_;  // parts of the sorted rows, each a whole number of keys
  std::vector<std::uint64_t> part_first_tile_record_;       // each part's first (key, tile) record
  std::uint64_t unique_ = 0, tile_records_ = 0;
};

void tile_unique(const TileUnique& args);
void tile_samples(const TileSamples& args);
void bucket_split(const BucketSplit& args);
void bucket_merge(const BucketMerge& args);
void index_gather(const IndexGather& args);
}  // namespace cpu

namespace detail {
void tile_unique_cuda(void* cuda_stream, const TileUnique& args);
void tile_samples_cuda(void* cuda_stream, const TileSamples& args);
void bucket_split_cuda(void* cuda_stream, const BucketSplit& args);
void bucket_merge_cuda(void* cuda_stream, const BucketMerge& args);
void index_gather_cuda(void* cuda_stream, const IndexGather& args);
void sort_keys_plain_cuda(void* cuda_stream, const std::uint64_t* in, std::uint64_t* out, std::uint64_t n, Workspace work);
}  // namespace detail

}  // namespace qstage::kernels
