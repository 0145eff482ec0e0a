#include "stages/keys/dedup_resident.hpp"

#include <algorithm>
#include <stdexcept>

namespace qstage::stages::keys {

namespace {
std::uint64_t workspace_bytes(bool cuda, const kernels::RecordLayout& L, std::uint64_t rows, std::uint64_t block_rows) {
  if (!cuda) return 0;  // (the CPU twins sort in host temporaries)
  std::uint64_t bytes = std::max({kernels::tile_unique_scratch_bytes(block_rows, L.words), kernels::bucket_split_scratch_bytes(rows),
                                  kernels::bucket_merge_scratch_bytes(rows, L.words)});
  if (L.origin) bytes = std::max(bytes, kernels::index_gather_scratch_bytes(rows));
  return bytes;
}
// The merge's outputs for `records` records: keys, counts, values and, with the origin, the pairs.
std::uint64_t merged_bytes(const kernels::RecordLayout& L, std::uint64_t records) {
  return records * (L.words * 8ull + 8 + (L.value ? 8 : 0) + (L.origin ? 24 : 0)) + 16;
}
}  // namespace

ResidentChain::ResidentChain(Backend& backend, Stream& stream, kernels::RecordLayout layout, std::uint64_t rows,
                             std::uint64_t tile_rows, std::uint64_t block_rows, Take take)
    : backend_(backend), stream_(stream), layout_(layout), rows_(rows), tile_rows_(tile_rows),
      cuda_(backend.kind() == BackendKind::cuda), take_(std::move(take)) {
  if (rows == 0 || tile_rows == 0 || block_rows == 0 || block_rows % tile_rows)
    throw std::logic_error("ResidentChain: rows, and blocks of whole tiles");
  records_ = take_(rows * layout.cols() * 8, "keys records (resident)");
  tile_counts_ = take_(kernels::tiles_of(rows, tile_rows) * 8, "keys tile counts (resident)");
  if (layout.origin) local_ = take_(rows * 8, "keys local ids (resident)");
  const std::uint64_t work = workspace_bytes(cuda_, layout, rows, std::min(block_rows, rows));
  if (work) work_ = take_(work, "keys dedup workspace (resident)");
}

std::uint64_t ResidentChain::peak_bytes(bool cuda, kernels::RecordLayout L, std::uint64_t rows, std::uint64_t tile_rows,
                                        std::uint64_t block_rows) {
  const std::uint64_t records = rows * L.cols() * 8;
  const std::uint64_t held = (L.origin ? rows * 8 : 0) + kernels::tiles_of(rows, tile_rows) * 8 + 8 +
                             workspace_bytes(cuda, L, rows, std::min(block_rows, rows));
  // (add: the records; split: them and (cuda) their copy grouped; merge: the copy and its outputs;
  // index: the outputs and the index)
  return held + std::max({(cuda ? 2 : 1) * records, records + merged_bytes(L, rows), merged_bytes(L, rows) + (L.origin ? rows * 8 : 0)});
}

void ResidentChain::add(const kernels::KeyRows& in, std::uint64_t first_row) {
  if (first_row != added_ || first_row % tile_rows_ || first_row + in.rows > rows_ ||
      (in.rows % tile_rows_ && first_row + in.rows != rows_))
    throw std::logic_error("ResidentChain::add: rows out of order or not whole tiles");
  const std::uint64_t tile = first_row / tile_rows_;
  kernels::tile_unique(stream_, {in, layout_, tile_rows_, first_row, records_.as<std::uint64_t>() + first_row * layout_.cols(),
                                 tile_counts_.as<std::uint64_t>() + tile,
                                 layout_.origin ? local_.as<std::uint64_t>() + first_row : nullptr, workspace()});
  added_ += in.rows;
}

ResidentChain::Unique ResidentChain::finish() {
  if (added_ != rows_) throw std::logic_error("ResidentChain::finish before every row was added");
  Unique out;
  // One bucket: the tiles' records in tile order (the CPU twin moves them down in place).
  Buffer split = cuda_ ? take_(rows_ * layout_.cols() * 8, "keys records grouped (resident)") : Buffer{};
  Buffer counts = take_(16, "keys record counts (resident)");
  auto* grouped = cuda_ ? split.as<std::uint64_t>() : records_.as<std::uint64_t>();
  kernels::bucket_split(stream_, {records_.as<std::uint64_t>(), tile_counts_.as<std::uint64_t>(), layout_, rows_, tile_rows_,
                                  nullptr, 1, grouped, counts.as<std::uint64_t>(), workspace()});
  backend_.copy_to_host(&out.records, counts.data(), 8, stream_);
  stream_.synchronize();
  tile_counts_.reset();
  if (cuda_) records_.reset();  // (each buffer freed once read: peak_bytes holds; the stream orders reuse)
  out.keys = take_(out.records * layout_.words * 8, "keys unique (resident)");
  out.counts = take_(out.records * 8, "keys unique counts (resident)");
  if (layout_.value) out.values = take_(out.records * 8, "keys summed values (resident)");
  Buffer pairs = layout_.origin ? take_(out.records * 24, "keys index pairs (resident)") : Buffer{};
  kernels::BucketMerge m;
  m.records = grouped;
  m.rows = out.records;
  m.layout = layout_;
  m.keys = out.keys.as<std::uint64_t>();
  m.counts = out.counts.as<std::uint64_t>();
  m.values = out.values.as<double>();
  m.unique = counts.as<std::uint64_t>();
  if (layout_.origin) {
    m.pairs = pairs.as<std::uint64_t>();
    m.pair_counts = counts.as<std::uint64_t>() + 1;
    m.row_buckets = 1;
    m.rows_per_row_bucket = rows_;
  }
  m.work = workspace();
  kernels::bucket_merge(stream_, m);
  backend_.copy_to_host(&out.unique, counts.data(), 8, stream_);
  stream_.synchronize();
  split.reset();
  records_.reset();
  if (layout_.origin) {  // every row's (tile, local) id -> its pair -> its position among the keys
    static const std::uint64_t kFirstBatch = 0;  // (the one merge batch's keys start at 0)
    Buffer prefix = take_(8, "keys index offsets (resident)");
    backend_.copy_to_device(prefix.data(), &kFirstBatch, 8, stream_);
    out.index = take_(rows_ * 8, "keys index (resident)");
    kernels::index_gather(stream_, {local_.as<std::uint64_t>(), rows_, 0, tile_rows_, pairs.as<std::uint64_t>(), out.records,
                                    prefix.as<std::uint64_t>(), out.index.as<std::uint64_t>(), workspace()});
    stream_.synchronize();
  }
  local_.reset();
  work_.reset();
  return out;
}

}  // namespace qstage::stages::keys
