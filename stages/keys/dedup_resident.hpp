#pragma once
// The sample sort's kernels called in turn on data that stays in device memory (host memory on
// the CPU backend): tile_unique over whole tiles as the rows arrive, then bucket_split into one
// bucket, bucket_merge and, for the reverse index, index_gather. One bucket and one merge batch:
// every sum is formed as the passes form it (tile by tile, in tile order), so the bytes are those
// of DedupRun's passes over any number of buckets, batches and ranks.
//
// Used where the records fit: keys.dedup's step on one rank (its whole input read once, no
// intermediate file), and sci.solve's selection and PT2 on resident data.
#include <cstdint>
#include <functional>

#include "backend/backend.hpp"
#include "kernels/keys/sort_unique.hpp"

namespace qstage::stages::keys {

class ResidentChain {
 public:
  // Where the chain's device memory comes from (the backend's pool, charged to its budget).
  using Take = std::function<Buffer(std::uint64_t bytes, const char* what)>;
  struct Unique {
    Buffer keys, counts, values;  // `unique` keys (words each, ascending), their counts and summed values
    Buffer index;                 // with the origin layout: every row's position in keys
    std::uint64_t unique = 0, records = 0;  // (records: the tiles' distinct keys, summed over tiles)
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
  Take take_;
  Buffer records_, tile_counts_, local_, work_;
  kernels::Workspace workspace() const { return {work_.data(), work_.size()}; }
};

}  // namespace qstage::stages::keys
