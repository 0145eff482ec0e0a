#pragma once
// The sample sort's kernels called in turn on data that stays in device memory (host memory on
// the CPU backend): tile_unique over whole tiles as the rows arrive, then bucket_split into one
// bucket, bucket_merge and, for the reverse index, index_gather. One bucket and one merge batch:
// every sum is formed as the passes form it (tile by tile, in tile order), so the bytes are those
// of DedupRun's passes over any number of buckets, batches and ranks.
//
// Used where the records fit: keys.dedup's step on one rank (its whole input read once, no
// intermediate file), and sci.solve's selection and PT2 on resident data. On the CPU backend, with
// the reverse index, the rows are kept as they come and sorted once, stably, by
// kernels::cpu::RadixUnique, which gives the chain's bytes and the index from the rows it carries
// (40 million two-word rows on 2 cores: the unit 7.3 s against the chain's 11.6 s, 2.24 against
// 4.02 GB; without the index the chain was the faster, 5.9-6.3 s against 6.6-7.8 s, for keys that
// vary in every byte).
//
// HostChain is the tier below: the records in host memory where the device cannot hold them.
// unique_over_ranks is the chain divided between ranks: each reduces its own tiles, and the
// buckets, one a rank, are exchanged before the merge.
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "kernels/keys/sort_unique.hpp"

namespace qstage::stages::keys {

// The keys that tiles' samples hold (tile_samples' partials packed end to end, [taken, weight,
// taken keys] each), each weighing weight / taken records: the records they stand for, and
// buckets - 1 splitters at equal quantiles of the weight, distinct and ascending (a key that
// spans several quantiles gives one splitter: its bucket is then the larger).
class SampledKeys {
 public:
  SampledKeys(const std::vector<std::uint64_t>& packed, std::uint32_t words);
  std::uint64_t records() const { return records_; }
  std::vector<std::uint64_t> splitters(std::uint64_t buckets) const;

 private:
  struct Sample {
    const std::uint64_t* key;
    double weight;
  };
  std::uint32_t words_;
  std::vector<Sample> samples_;  // ascending by key
  std::uint64_t records_ = 0;
};

class ResidentChain {
 public:
  // Where the chain's device memory comes from (the backend's pool, charged to its budget).
  using Take = std::function<Buffer(std::uint64_t bytes, const char* what)>;
  struct Unique {
    Buffer keys, counts, values;  // `unique` keys (words each, ascending), their counts and summed values
    Buffer index;                 // with the origin layout: every row's position in keys
    std::uint64_t unique = 0, records = 0;  // (records: the tiles' distinct keys, summed over tiles)
    std::uint64_t first = 0;                // (unique_over_ranks) the position of keys[0] among every rank's keys
    bool on_host = false;                   // the buffers are host memory (HostChain's), not the device's
    std::uint32_t buckets = 1;              // buckets merged
  };

  // `rows` rows in tiles of tile_rows, added at most `block_rows` at a time (whole tiles).
  ResidentChain(Backend& backend, Stream& stream, kernels::RecordLayout layout, std::uint64_t rows,
                std::uint64_t tile_rows, std::uint64_t block_rows, Take take);
  // The most device bytes the chain holds at once (its own buffers; not the caller's input blocks).
  static std::uint64_t peak_bytes(bool cuda, kernels::RecordLayout layout, std::uint64_t rows, std::uint64_t tile_rows,
                                  std::uint64_t block_rows);
  // The next in.rows rows, from pass row `first_row` (a multiple of tile_rows; in.rows whole tiles
  // but at the end). The input may be reused once the stream has run this far.
  void add(const kernels::KeyRows& in, std::uint64_t first_row);
  // Once every row was added: the unique keys (the chain's other buffers freed first).
  Unique finish();

 private:
  Backend& backend_;
  Stream& stream_;
  kernels::RecordLayout layout_;
  std::uint64_t rows_, tile_rows_, added_ = 0;
  bool cuda_;
  bool radix_;  // (the CPU's reverse index: RadixUnique at finish over the rows kept in records_)
  Take take_;
  Buffer records_, tile_counts_, local_, work_;
  kernels::Workspace workspace() const { return {work_.data(), work_.size()}; }
  Unique finish_radix();
};

// The same chain with its records in host memory, for data the device cannot hold but the host
// can (keys.dedup within a device budget): no file, each record crossing the bus once each way.
//   add:    tile_unique on the device, one block of whole tiles at a time; each tile's records
//           (ascending) and, for the reverse index, every row's local id go down into host arrays.
//   finish: buckets cut from exact counts of the tiles' sorted records (a binary search a tile),
//           each as large as the device's bucket buffer takes; a bucket's records are gathered
//           tile after tile into pinned memory (the next bucket while the device merges this one),
//           merged on the device, and its keys, counts and values go down in bucket order, that
//           is in key order. With the index, the merge's pairs fill a table by origin, and each
//           row's index is read from it through its local id.
// A key's records all fall in one bucket, in tile order there: every sum is formed as the passes
// form it, so the bytes are theirs (and ResidentChain's) for any bucket size.
class HostChain {
 public:
  // block_rows: whole tiles, the most rows add() takes; it is also the bucket buffer's records.
  HostChain(Backend& backend, Stream& stream, kernels::RecordLayout layout, std::uint64_t rows, std::uint64_t tile_rows,
            std::uint64_t block_rows);
  // Device bytes it holds at once (not the caller's input block), host bytes (its arrays, charged
  // to the host budget; pageable) and pinned bytes on cuda: its landing for blocks and buckets, and
  // two staging buffers of block_rows records (the caller's for its input blocks, then the
  // buckets').
  static std::uint64_t device_bytes(bool cuda, kernels::RecordLayout layout, std::uint64_t tile_rows,
                                    std::uint64_t block_rows);
  static std::uint64_t host_bytes(kernels::RecordLayout layout, std::uint64_t rows);
  static std::uint64_t staging_bytes(kernels::RecordLayout layout, std::uint64_t block_rows);
  static std::uint64_t input_staging_bytes(kernels::RecordLayout layout, std::uint64_t block_rows) {
    return block_rows * layout.cols() * 8;  // (one of the two)
  }
  static std::uint64_t landing_bytes(kernels::RecordLayout layout, std::uint64_t block_rows);
  // As ResidentChain::add: in is device memory, in.rows <= block_rows.
  void add(const kernels::KeyRows& in, std::uint64_t first_row);
  // Once every row was added: the unique keys, counts, values and index in host memory (on_host:
  // pageable arrays charged to the host budget), and the number of buckets merged.
  using Unique = ResidentChain::Unique;
  Unique finish();
  // Where its host-side time went (for the log): waiting for each block's tiles to come down,
  // spreading them into the arrays; finding the buckets' bounds, gathering buckets, in merge()
  // (queueing on cuda, the merge itself on the cpu), waiting for their merges to come down,
  // spreading their outputs.
  struct Seconds {
    double tiles_down = 0, tiles_spread = 0, bounds = 0, gather = 0, merge = 0, merge_wait = 0, spread = 0;
  };
  const Seconds& seconds() const { return seconds_; }

 private:
  class Cutter;  // (dedup_resident.cpp) where each bucket ends in each tile
  // A bucket's `records` records, staged in pinned memory, up and merged (queued); then
  // downloaded (waits for the merge); then spread: its keys, counts and values appended to out's,
  // its pairs written into the index table.
  struct Landed {
    const std::uint64_t *keys = nullptr, *counts = nullptr, *values = nullptr, *pairs = nullptr;
    std::uint64_t unique = 0, records = 0;
  };
  void merge(const std::uint64_t* staged, std::uint64_t records);
  Landed download();
  void spread(const Landed& landed, Unique& out, std::uint64_t* table);

  Backend& backend_;
  Stream& stream_;
  kernels::RecordLayout layout_;
  std::uint64_t rows_, tile_rows_, block_rows_, added_ = 0;
  bool cuda_;
  // host: every tile's records, packed tile after tile (tile t's from record tile_first_[t]), and
  // the rows' local ids (origin layout)
  Buffer records_, local_;
  std::vector<std::uint64_t> tile_first_, tile_count_;
  std::uint64_t held_records_ = 0;
  // device: a block's records, tile counts and local ids, and the merge's buffers
  Buffer block_records_, block_counts_, block_local_, work_;
  Buffer bucket_, merged_keys_, merged_counts_, merged_values_, merged_pairs_, merged_unique_;
  std::uint64_t merging_ = 0;  // the records of the bucket merge() queued
  // pinned (cuda): a block's records and local ids come down here, then a bucket's outputs
  Buffer landing_;
  kernels::Workspace workspace() const { return {work_.data(), work_.size()}; }
  Seconds seconds_;
};

// This rank's rows for unique_over_ranks: whole tiles of the pass rows from first_row (device
// memory; host memory on the cpu backend), in `holder`, which is freed once they are reduced.
struct RankRows {
  kernels::KeyRows rows;
  Buffer holder;
  std::uint64_t first_row = 0;
};

// The rows of the `shares` equal shares of `rows` rows in whole tiles: share s holds [s * width,
// (s + 1) * width) (the last ones shorter or empty), width = ceil(tiles / shares) tiles. Equal
// widths, so that a row's share is its row over the width (the reverse index's row buckets).
std::uint64_t share_width(std::uint64_t rows, std::uint64_t tile_rows, std::uint64_t shares);

// ResidentChain's work divided between ranks. Rank r holds whole tiles of the pass rows, the
// ranks' rows end to end in rank order (the last rank's may end in a partial tile; a rank may hold
// none). Each rank reduces its tiles to records (cuda: tile_unique; cpu: one radix sort,
// kernels::cpu::RadixUnique, which leaves them key after key); splitters from every rank's
// samples cut them into one bucket a rank; the buckets are
// exchanged (comm::Communicator: NCCL between GPUs, MPI otherwise) and each rank merges what it
// received. A key's records arrive in tile order, so every sum is formed as one rank forms it:
// rank r's keys are the r-th key range of ResidentChain's, with its counts and values, bit for bit
// (Unique::first: where they start). With `index` (on cuda, every rank's rows at rank *
// share_width(...)), each record's position goes back to the rank its rows came from, and
// Unique::index holds this rank's rows' positions among every rank's keys: ResidentChain's index,
// cut by rank. Collective.
// nullopt on every rank when what some rank would receive and merge passes `room` bytes.
std::optional<ResidentChain::Unique> unique_over_ranks(Backend& backend, Stream& stream, comm::Communicator& ranks,
                                                       RankRows mine, std::uint64_t tile_rows, std::uint32_t samples,
                                                       bool index, std::uint64_t room, const ResidentChain::Take& take);

}  // namespace qstage::stages::keys
