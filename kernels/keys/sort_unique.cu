// The GPU versions of kernels/keys/sort_unique.hpp. Multi-word keys sort as LSD passes of CUB's stable
// DeviceRadixSort::SortPairs over one word each (the least significant word first), carrying a
// permutation; a last pass on the tile number (the most significant position) makes the sort
// segmented per tile, and since a tile's rows stay within its own positions, tile t's sorted rows
// are rows [t * tile_rows, ...) of the permutation. Runs of equal keys are found by head flags and
// an inclusive scan; a run's values are summed in sorted (= input) order in PairwiseSum's fixed
// shape: by one thread when the run is short, by a whole block when it is long (a skewed input has
// runs of 10^5 copies, which one thread took milliseconds to add up). The CPU twin adds the same
// terms one by one into a PairwiseSum: the same bits. No atomics reach the output: the long runs'
// list is filled by an atomic counter, but each entry's block writes only its own run; counts per
// bucket come from binary searches in the sorted bucket numbers.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <stdexcept>
#include <string>

#include "backend/cuda_check.hpp"
#include "kernels/keys/sort_unique.hpp"

namespace qstage::kernels::detail {
namespace {

using u32 = std::uint32_t;
using u64 = std::uint64_t;
constexpr int kThreads = 256;

unsigned blocks_for(u64 n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// Cuts the scratch into aligned arrays; the rest is CUB's.
class Carve {
 public:
  explicit Carve(const Workspace& w) : at_(static_cast<char*>(w.scratch)), left_(w.scratch_bytes) {}
  template <typename T>
  T* take(u64 count) {
    const u64 bytes = (count * sizeof(T) + 255) / 256 * 256;
    if (bytes > left_) throw std::logic_error("sort_unique: the scratch is smaller than *_scratch_bytes");
    T* p = reinterpret_cast<T*>(at_);
    at_ += bytes;
    left_ -= bytes;
    return p;
  }
  void* rest() const { return at_; }
  u64 rest_bytes() const { return left_; }

 private:
  char* at_;
  u64 left_;
};

int bits_for(u64 values) {  // bits that hold 0 .. values - 1
  int b = 1;
  while (b < 64 && (u64{1} << b) < values) ++b;
  return b;
}

// Stable sort of (key, value) pairs in double buffers; the sorted ones end in Current().
template <typename K, typename V>
void sort_pairs(cub::DoubleBuffer<K>& keys, cub::DoubleBuffer<V>& values, u64 n, int end_bit, Carve& c,
                cudaStream_t stream) {
  std::size_t need = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, need, keys, values, static_cast<int>(n), 0, end_bit, stream));
  if (need > c.rest_bytes())
    throw std::runtime_error("sort_unique: CUB needs " + std::to_string(need) + " bytes of temporary storage for " +
                             std::to_string(n) + " items; the scratch leaves " + std::to_string(c.rest_bytes()));
  QSTAGE_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(c.rest(), need, keys, values, static_cast<int>(n), 0, end_bit, stream));
}

void inclusive_sum(const u32* in, u32* out, u64 n, Carve& c, cudaStream_t stream) {
  std::size_t need = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, need, in, out, static_cast<int>(n), stream));
  if (need > c.rest_bytes())
    throw std::runtime_error("sort_unique: CUB's scan needs " + std::to_string(need) + " bytes; the scratch leaves " +
                             std::to_string(c.rest_bytes()));
  QSTAGE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(c.rest(), need, in, out, static_cast<int>(n), stream));
}

__global__ void iota_kernel(u32* p, u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = static_cast<u32>(i);
}

__global__ void gather_word(const u64* keys, u32 stride, u32 word, const u32* perm, u64* out, u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = keys[u64(perm[i]) * stride + word];
}

__global__ void tile_of_kernel(const u32* perm, u64 tile_rows, u32* out, u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<u32>(perm[i] / tile_rows);
}

// Sorts the permutation of n keys (row i at keys[i * stride]) stably by key, and with tile_rows,
// by (tile, key). Returns where the sorted permutation is (perm or perm_alt).
u32* sort_permutation(const u64* keys, u32 stride, u32 words, u64 n, u64 tile_rows, u32* perm, u32* perm_alt,
                      u64* kw, u64* kw_alt, Carve& c, cudaStream_t stream) {
  iota_kernel<<<blocks_for(n), kThreads, 0, stream>>>(perm, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
  cub::DoubleBuffer<u32> values(perm, perm_alt);
  for (int w = static_cast<int>(words) - 1; w >= 0; --w) {
    gather_word<<<blocks_for(n), kThreads, 0, stream>>>(keys, stride, static_cast<u32>(w), values.Current(), kw, n);
    QSTAGE_CUDA_CHECK_LAUNCH();
    cub::DoubleBuffer<u64> k(kw, kw_alt);
    sort_pairs(k, values, n, 64, c, stream);
  }
  if (tile_rows > 0 && n > tile_rows) {
    auto* tk = reinterpret_cast<u32*>(kw);
    auto* tk_alt = reinterpret_cast<u32*>(kw_alt);
    tile_of_kernel<<<blocks_for(n), kThreads, 0, stream>>>(values.Current(), tile_rows, tk, n);
    QSTAGE_CUDA_CHECK_LAUNCH();
    cub::DoubleBuffer<u32> k(tk, tk_alt);
    sort_pairs(k, values, n, bits_for((n + tile_rows - 1) / tile_rows), c, stream);
  }
  return values.Current();
}

// flags[i] = 1 where sorted position i starts a run: a tile's first row or a new key.
__global__ void head_flags(const u64* keys, u32 stride, u32 words, const u32* perm, u64 tile_rows, u32* flags, u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  flags[i] = (i % tile_rows == 0 || compare_keys(keys + u64(perm[i]) * stride, keys + u64(perm[i - 1]) * stride, words) != 0)
                 ? 1u
                 : 0u;
}

// start[run] = its first sorted position; local[row] = its run's position in its tile.
__global__ void run_starts(const u32* g, const u32* flags, const u32* perm, u64 tile_rows, u32* start, u64* local,
                           u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  if (flags[i]) start[g[i] - 1] = static_cast<u32>(i);
  if (local) local[perm[i]] = g[i] - g[i / tile_rows * tile_rows];
}

// Runs longer than this are summed by a block (kLongRunBlocks of them take the list in turn).
constexpr u64 kLongRun = 256;
constexpr unsigned kLongRunBlocks = 264;
constexpr int kBlockTreeLevels = 12;  // a block sums a complete tree of at most 2^12 terms per round

// The complete tree of 2^level terms term(first ..), by the whole block: each thread sums its
// 2^level / kThreads adjacent terms (a complete tree), then adjacent pairs of the threads' sums
// level by level. The result is in thread 0 (the same bits as PairwiseSum::add of every term).
template <typename Term>
__device__ double block_complete_tree(const Term& term, u64 first, int level, double* shared) {
  const u64 terms = u64{1} << level;
  const u32 t = threadIdx.x;
  const u64 leaves = terms < kThreads ? terms : kThreads;
  const u64 per = terms / leaves;
  if (t < leaves) {
    PairwiseSum s;
    for (u64 j = 0; j < per; ++j) s.add(term(first + t * per + j));
    shared[t] = s.total();
  }
  __syncthreads();
  for (u64 width = leaves; width > 1; width /= 2) {
    double v = 0;
    if (t < width / 2) v = shared[2 * t] + shared[2 * t + 1];
    __syncthreads();
    if (t < width / 2) shared[t] = v;
    __syncthreads();
  }
  const double x = shared[0];
  __syncthreads();
  return x;
}

// The PairwiseSum of term(s .. e - 1), by the whole block (the total in thread 0): complete trees
// by the binary digits of the remaining count, largest first, each added as a subtree.
template <typename Term>
__device__ double block_pairwise_sum(const Term& term, u64 s, u64 e, double* shared) {
  PairwiseSum sum;  // (thread 0's is the one that counts)
  for (u64 at = s; at < e;) {
    int level = 63 - __clzll(static_cast<long long>(e - at));
    if (level > kBlockTreeLevels) level = kBlockTreeLevels;
    const double x = block_complete_tree(term, at, level, shared);
    if (threadIdx.x == 0) sum.add_tree(x, level);
    at += u64{1} << level;
  }
  return sum.total();
}

__device__ double value_at(const KeyRows& in, u64 row) {
  if (in.values) return in.values[row];
  return __longlong_as_double(static_cast<long long>(in.keys[row * in.stride + in.words]));
}

// One thread per run (distinct key of a tile): its record, the value summed in sorted (= input)
// order; a long run's value is left to long_tile_values (its run number goes to the list).
__global__ void tile_records(KeyRows in, RecordLayout L, u64 tile_rows, u64 first_row, const u32* perm, const u32* g,
                             const u32* start, u64* records, u64 n, u32* long_runs, u32* long_count) {
  const u64 u = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  const u64 runs = g[n - 1];
  if (u >= runs) return;
  const u64 s = start[u], e = u + 1 < runs ? start[u + 1] : n;
  const u64 tile = s / tile_rows * tile_rows;
  const u64 local = g[s] - g[tile];
  u64* rec = records + (tile + local) * L.cols();
  const u64* key = in.keys + u64(perm[s]) * in.stride;
  for (u32 w = 0; w < in.words; ++w) rec[w] = key[w];
  if (L.value) {
    if (e - s > kLongRun) {
      long_runs[atomicAdd(long_count, 1u)] = static_cast<u32>(u);
    } else {
      PairwiseSum sum;
      for (u64 j = s; j < e; ++j) sum.add(value_at(in, perm[j]));
      rec[L.value_col()] = static_cast<u64>(__double_as_longlong(sum.total()));
    }
  }
  rec[L.count_col()] = e - s;
  if (L.origin) rec[L.origin_col()] = first_row + tile + local;
}

// A block per long run (taking the list in turn): the value tile_records left.
__global__ void long_tile_values(KeyRows in, RecordLayout L, u64 tile_rows, const u32* perm, const u32* g,
                                 const u32* start, u64* records, u64 n, const u32* long_runs, const u32* long_count) {
  __shared__ double shared[kThreads];
  const u64 runs = g[n - 1];
  for (u32 i = blockIdx.x; i < *long_count; i += gridDim.x) {
    const u64 u = long_runs[i];
    const u64 s = start[u], e = u + 1 < runs ? start[u + 1] : n;
    const double sum = block_pairwise_sum([&](u64 j) { return value_at(in, perm[j]); }, s, e, shared);
    if (threadIdx.x == 0) {
      const u64 tile = s / tile_rows * tile_rows;
      records[(tile + g[s] - g[tile]) * L.cols() + L.value_col()] = static_cast<u64>(__double_as_longlong(sum));
    }
  }
}

__global__ void tile_counts(const u32* g, u64 tile_rows, u64* tile_unique, u64 tiles, u64 n) {
  const u64 t = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (t >= tiles) return;
  const u64 first = t * tile_rows, last = (t + 1) * tile_rows < n ? (t + 1) * tile_rows - 1 : n - 1;
  tile_unique[t] = g[last] - g[first] + 1;
}

__global__ void samples_kernel(TileSamples a) {
  const u64 t = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (t >= a.tiles) return;
  const u32 cols = a.layout.cols(), words = a.layout.words;
  const u64 pw = sample_partial_words(a.samples, words);
  const u64 u = a.tile_unique[t];
  const u64 taken = u < a.samples ? u : a.samples;
  u64* p = a.partials + t * pw;
  for (u64 k = 0; k < pw; ++k) p[k] = 0;
  p[0] = taken;
  p[1] = u;
  for (u64 j = 0; j < taken; ++j) {
    const u64 pos = u <= a.samples ? j : sample_position(j, u, a.samples, a.first_tile + t);
    const u64* rec = a.records + (t * a.tile_rows + pos) * cols;
    for (u32 w = 0; w < words; ++w) p[2 + j * words + w] = rec[w];
  }
}

__global__ void bucket_keys(BucketSplit a, u32* bucket, u32* index) {
  const u64 r = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (r >= a.rows) return;
  const u64 t = r / a.tile_rows, j = r % a.tile_rows;
  bucket[r] = j < a.tile_unique[t] ? bucket_of(a.records + r * a.layout.cols(), a.splitters, a.buckets - 1, a.layout.words)
                                   : a.buckets;
  index[r] = static_cast<u32>(r);
}

// counts[b] = how many of the n sorted values equal b, by binary search (no atomics).
__device__ u64 lower_bound_u32(const u32* v, u64 n, u32 x) {
  u64 lo = 0, hi = n;
  while (lo < hi) {
    const u64 mid = (lo + hi) / 2;
    if (v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
__global__ void counts_of_sorted(const u32* v, u64 n, u64* counts, u32 values) {
  const u64 b = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (b < values) counts[b] = lower_bound_u32(v, n, static_cast<u32>(b + 1)) - lower_bound_u32(v, n, static_cast<u32>(b));
}

__global__ void gather_records(const u64* records, u32 cols, const u32* bucket, const u32* index, u32 buckets, u64* out,
                               u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i >= n || bucket[i] >= buckets) return;
  const u64* rec = records + u64(index[i]) * cols;
  for (u32 c = 0; c < cols; ++c) out[i * cols + c] = rec[c];
}

__global__ void merge_heads(const u64* records, u32 cols, u32 words, const u32* perm, u32* flags, u64 n) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  flags[i] = (i == 0 || compare_keys(records + u64(perm[i]) * cols, records + u64(perm[i - 1]) * cols, words) != 0) ? 1u : 0u;
}

// One thread per run (distinct key of a bucket): key, count and value summed in tile order; a
// long run's count and value are left to long_merge_runs.
__global__ void merge_runs(BucketMerge a, const u32* perm, const u32* g, const u32* start, u32* long_runs,
                           u32* long_count) {
  const u64 u = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  const u64 n = a.rows, runs = g[n - 1];
  if (u == 0) *a.unique = runs;
  if (u >= runs) return;
  const RecordLayout L = a.layout;
  const u32 cols = L.cols();
  const u64 s = start[u], e = u + 1 < runs ? start[u + 1] : n;
  const u64* key = a.records + u64(perm[s]) * cols;
  for (u32 w = 0; w < L.words; ++w) a.keys[u * L.words + w] = key[w];
  if (e - s > kLongRun) {
    long_runs[atomicAdd(long_count, 1u)] = static_cast<u32>(u);
    return;
  }
  u64 count = 0;
  PairwiseSum sum;
  for (u64 j = s; j < e; ++j) {
    const u64* rec = a.records + u64(perm[j]) * cols;
    count += rec[L.count_col()];
    if (L.value) sum.add(__longlong_as_double(static_cast<long long>(rec[L.value_col()])));
  }
  a.counts[u] = count;
  if (L.value) a.values[u] = sum.total();
}

__global__ void long_merge_runs(BucketMerge a, const u32* perm, const u32* g, const u32* start, const u32* long_runs,
                                const u32* long_count) {
  __shared__ double shared[kThreads];
  __shared__ unsigned long long counts[kThreads];
  const u64 n = a.rows, runs = g[n - 1];
  const RecordLayout L = a.layout;
  const u32 cols = L.cols();
  for (u32 i = blockIdx.x; i < *long_count; i += gridDim.x) {
    const u64 u = long_runs[i];
    const u64 s = start[u], e = u + 1 < runs ? start[u + 1] : n;
    u64 count = 0;  // (integers: any order)
    for (u64 j = s + threadIdx.x; j < e; j += blockDim.x) count += a.records[u64(perm[j]) * cols + L.count_col()];
    counts[threadIdx.x] = count;
    __syncthreads();
    if (L.value) {
      const double sum = block_pairwise_sum(
          [&](u64 j) { return __longlong_as_double(static_cast<long long>(a.records[u64(perm[j]) * cols + L.value_col()])); },
          s, e, shared);
      if (threadIdx.x == 0) a.values[u] = sum;
    }
    if (threadIdx.x == 0) {
      u64 total = 0;
      for (u32 t = 0; t < blockDim.x; ++t) total += counts[t];
      a.counts[u] = total;
    }
    __syncthreads();
  }
}

__global__ void row_bucket_keys(BucketMerge a, const u32* perm, u32* rb, u32* index) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i >= a.rows) return;
  rb[i] = static_cast<u32>(a.records[u64(perm[i]) * a.layout.cols() + a.layout.origin_col()] / a.rows_per_row_bucket);
  index[i] = static_cast<u32>(i);
}

__global__ void write_pairs(BucketMerge a, const u32* perm, const u32* g, const u32* index) {
  const u64 k = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (k >= a.rows) return;
  const u64 i = index[k];
  a.pairs[3 * k] = a.records[u64(perm[i]) * a.layout.cols() + a.layout.origin_col()];
  a.pairs[3 * k + 1] = a.batch;
  a.pairs[3 * k + 2] = g[i] - 1;
}

__global__ void scatter_pairs(IndexGather a, u64* table) {
  const u64 p = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (p >= a.pair_count) return;
  const u64* pair = a.pairs + 3 * p;
  if (pair[0] >= a.first_row && pair[0] - a.first_row < a.rows) table[pair[0] - a.first_row] = a.prefix[pair[1]] + pair[2];
}

__global__ void gather_index(IndexGather a, const u64* table) {
  const u64 i = blockIdx.x * u64(blockDim.x) + threadIdx.x;
  if (i < a.rows) a.index[i] = table[i / a.tile_rows * a.tile_rows + a.local[i]];
}

void check_rows(u64 n, const char* what) {
  if (n >= (u64{1} << 32))
    throw std::runtime_error(std::string(what) + ": " + std::to_string(n) +
                             " rows in one batch; the GPU sorts index at most 2^32 - 1");
}

}  // namespace

void tile_unique_cuda(void* cuda_stream, const TileUnique& a) {
  const u64 n = a.in.rows;
  if (n == 0) return;
  check_rows(n, "tile_unique");
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  Carve c(a.work);
  u32* perm = c.take<u32>(n);
  u32* perm_alt = c.take<u32>(n);
  u64* kw = c.take<u64>(n);
  u64* kw_alt = c.take<u64>(n);
  u32* start = c.take<u32>(n);
  u32* long_runs = c.take<u32>(n / kLongRun + 2);  // (the last word: their count)
  u32* long_count = long_runs + n / kLongRun + 1;
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(long_count, 0, sizeof(u32), stream));
  const u32* sorted = sort_permutation(a.in.keys, a.in.stride, a.in.words, n, a.tile_rows, perm, perm_alt, kw, kw_alt, c,
                                       stream);
  auto* flags = reinterpret_cast<u32*>(kw);  // (the key words are sorted: their arrays are free)
  auto* g = reinterpret_cast<u32*>(kw_alt);
  head_flags<<<blocks_for(n), kThreads, 0, stream>>>(a.in.keys, a.in.stride, a.in.words, sorted, a.tile_rows, flags, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
  inclusive_sum(flags, g, n, c, stream);
  run_starts<<<blocks_for(n), kThreads, 0, stream>>>(g, flags, sorted, a.tile_rows, start, a.local, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
  tile_records<<<blocks_for(n), kThreads, 0, stream>>>(a.in, a.layout, a.tile_rows, a.first_row, sorted, g, start,
                                                       a.records, n, long_runs, long_count);
  QSTAGE_CUDA_CHECK_LAUNCH();
  if (a.layout.value) {
    long_tile_values<<<kLongRunBlocks, kThreads, 0, stream>>>(a.in, a.layout, a.tile_rows, sorted, g, start, a.records,
                                                              n, long_runs, long_count);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
  const u64 tiles = tiles_of(n, a.tile_rows);
  tile_counts<<<blocks_for(tiles), kThreads, 0, stream>>>(g, a.tile_rows, a.tile_unique, tiles, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void tile_samples_cuda(void* cuda_stream, const TileSamples& a) {
  if (a.tiles == 0) return;
  samples_kernel<<<blocks_for(a.tiles), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void bucket_split_cuda(void* cuda_stream, const BucketSplit& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const u64 n = a.rows;
  if (n == 0) {
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, a.buckets * sizeof(u64), stream));
    return;
  }
  check_rows(n, "bucket_split");
  if (a.out == a.records) throw std::logic_error("bucket_split: the GPU's gathers, so out must not be records");
  Carve c(a.work);
  u32* bucket = c.take<u32>(n);
  u32* bucket_alt = c.take<u32>(n);
  u32* index = c.take<u32>(n);
  u32* index_alt = c.take<u32>(n);
  bucket_keys<<<blocks_for(n), kThreads, 0, stream>>>(a, bucket, index);
  QSTAGE_CUDA_CHECK_LAUNCH();
  cub::DoubleBuffer<u32> k(bucket, bucket_alt), v(index, index_alt);
  sort_pairs(k, v, n, bits_for(u64(a.buckets) + 1), c, stream);  // stable: tile-major within a bucket
  counts_of_sorted<<<blocks_for(a.buckets), kThreads, 0, stream>>>(k.Current(), n, a.counts, a.buckets);
  QSTAGE_CUDA_CHECK_LAUNCH();
  gather_records<<<blocks_for(n), kThreads, 0, stream>>>(a.records, a.layout.cols(), k.Current(), v.Current(), a.buckets,
                                                         a.out, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void bucket_merge_cuda(void* cuda_stream, const BucketMerge& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const u64 n = a.rows;
  if (n == 0) {
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.unique, 0, sizeof(u64), stream));
    if (a.layout.origin) QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.pair_counts, 0, a.row_buckets * sizeof(u64), stream));
    return;
  }
  check_rows(n, "bucket_merge");
  const u32 cols = a.layout.cols();
  Carve c(a.work);
  u32* perm = c.take<u32>(n);
  u32* perm_alt = c.take<u32>(n);
  u64* kw = c.take<u64>(n);
  u64* kw_alt = c.take<u64>(n);
  u32* start = c.take<u32>(n);
  u32* long_runs = c.take<u32>(n / kLongRun + 2);
  u32* long_count = long_runs + n / kLongRun + 1;
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(long_count, 0, sizeof(u32), stream));
  const u32* sorted = sort_permutation(a.records, cols, a.layout.words, n, 0, perm, perm_alt, kw, kw_alt, c, stream);
  auto* flags = reinterpret_cast<u32*>(kw);
  auto* g = reinterpret_cast<u32*>(kw_alt);
  merge_heads<<<blocks_for(n), kThreads, 0, stream>>>(a.records, cols, a.layout.words, sorted, flags, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
  inclusive_sum(flags, g, n, c, stream);
  run_starts<<<blocks_for(n), kThreads, 0, stream>>>(g, flags, sorted, n, start, nullptr, n);
  QSTAGE_CUDA_CHECK_LAUNCH();
  merge_runs<<<blocks_for(n), kThreads, 0, stream>>>(a, sorted, g, start, long_runs, long_count);
  QSTAGE_CUDA_CHECK_LAUNCH();
  long_merge_runs<<<kLongRunBlocks, kThreads, 0, stream>>>(a, sorted, g, start, long_runs, long_count);
  QSTAGE_CUDA_CHECK_LAUNCH();
  if (!a.layout.origin) return;
  // Pairs in key order, grouped stably by row bucket (flags and start are free again).
  u32* rb = flags;
  u32* rb_alt = start;
  u32* index = sorted == perm ? perm_alt : perm;
  u32* index_alt = c.take<u32>(n);
  row_bucket_keys<<<blocks_for(n), kThreads, 0, stream>>>(a, sorted, rb, index);
  QSTAGE_CUDA_CHECK_LAUNCH();
  cub::DoubleBuffer<u32> k(rb, rb_alt), v(index, index_alt);
  sort_pairs(k, v, n, bits_for(u64(a.row_buckets)), c, stream);
  counts_of_sorted<<<blocks_for(a.row_buckets), kThreads, 0, stream>>>(k.Current(), n, a.pair_counts, a.row_buckets);
  QSTAGE_CUDA_CHECK_LAUNCH();
  write_pairs<<<blocks_for(n), kThreads, 0, stream>>>(a, sorted, g, v.Current());
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void index_gather_cuda(void* cuda_stream, const IndexGather& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (a.rows == 0) return;
  Carve c(a.work);
  u64* table = c.take<u64>(a.rows);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(table, 0xff, a.rows * sizeof(u64), stream));
  if (a.pair_count) {
    scatter_pairs<<<blocks_for(a.pair_count), kThreads, 0, stream>>>(a, table);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
  gather_index<<<blocks_for(a.rows), kThreads, 0, stream>>>(a, table);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sort_keys_plain_cuda(void* cuda_stream, const u64* in, u64* out, u64 n, Workspace work) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  std::size_t need = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, need, in, out, static_cast<int>(n), 0, 64, stream));
  if (need > work.scratch_bytes)
    throw std::runtime_error("sort_keys_plain: CUB needs " + std::to_string(need) + " bytes; given " +
                             std::to_string(work.scratch_bytes));
  QSTAGE_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(work.scratch, need, in, out, static_cast<int>(n), 0, 64, stream));
}

}  // namespace qstage::kernels::detail
