#include "stages/keys/dedup_resident.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "core/parallel.hpp"
#include "core/stopwatch.hpp"

namespace qstage::stages::keys {

namespace {
std::uint64_t workspace_bytes(bool cuda, const kernels::RecordLayout& L, std::uint64_t rows, std::uint64_t block_rows) {
  if (!cuda) return 0;  // (the CPU twins sort in host temporaries)
  std::uint64_t bytes = std::max({kernels::tile_unique_scratch_bytes(block_rows, L.words), kernels::bucket_split_scratch_bytes(rows),
                                  kernels::bucket_merge_scratch_bytes(rows, L.words)});
  if (L.origin) bytes = std::max(bytes, kernels::index_gather_scratch_bytes(rows));
  return bytes;
}
// in's rows as RadixUnique takes them, into `to` (rows of words + 1): each key, then its value's
// bits (interleaved or apart), zero without values.
void interleave_rows(const kernels::KeyRows& in, std::uint64_t* to) {
  const std::uint32_t W = in.words, S = W + 1;
  parallel_for_pieces(in.rows, 1 << 16, [&](std::uint64_t begin, std::uint64_t end) {
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint64_t* key = in.keys + i * in.stride;
      std::copy_n(key, W, to + i * S);
      std::uint64_t value = 0;
      if (in.interleaved)
        value = key[W];
      else if (in.values)
        std::memcpy(&value, in.values + i, 8);
      to[i * S + W] = value;
    }
  });
}
// The merge's outputs for `records` records: keys, counts, values and, with the origin, the pairs.
std::uint64_t merged_bytes(const kernels::RecordLayout& L, std::uint64_t records) {
  return records * (L.words * 8ull + 8 + (L.value ? 8 : 0) + (L.origin ? 24 : 0)) + 16;
}
}  // namespace

ResidentChain::ResidentChain(Backend& backend, Stream& stream, kernels::RecordLayout layout, std::uint64_t rows,
                             std::uint64_t tile_rows, std::uint64_t block_rows, Take take)
    : backend_(backend),
      stream_(stream),
      layout_(layout),
      rows_(rows),
      tile_rows_(tile_rows),
      cuda_(backend.kind() == BackendKind::cuda),
      radix_(!cuda_ && layout.origin),
      take_(std::move(take)) {
  if (rows == 0 || tile_rows == 0 || block_rows == 0 || block_rows % tile_rows)
    throw std::logic_error("ResidentChain: rows, and blocks of whole tiles");
  if (radix_) {  // (the rows, a key and a value's bits each, for one radix sort at finish)
    records_ = take_(rows * (layout.words + 1) * 8, "keys rows (resident)");
    return;
  }
  records_ = take_(rows * layout.cols() * 8, "keys records (resident)");
  tile_counts_ = take_(kernels::tiles_of(rows, tile_rows) * 8, "keys tile counts (resident)");
  if (layout.origin) local_ = take_(rows * 8, "keys local ids (resident)");
  const std::uint64_t work = workspace_bytes(cuda_, layout, rows, std::min(block_rows, rows));
  if (work) work_ = take_(work, "keys dedup workspace (resident)");
}

std::uint64_t ResidentChain::peak_bytes(bool cuda, kernels::RecordLayout L, std::uint64_t rows, std::uint64_t tile_rows,
                                        std::uint64_t block_rows) {
  if (!cuda &&
      L.origin) {  // (radix: the rows, the sort's other half and values; then one half, the outputs, the index)
    const std::uint64_t half = rows * (L.words + 1) * 8, values = rows * 8;
    const std::uint64_t outputs = rows * (L.words * 8 + 16 + 8) + 24;  // (keys, counts, sums; the index)
    return std::max(2 * half + values, half + values + outputs);
  }
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
  if (radix_) {  // (the rows kept: each key and its value's bits, zero without values)
    interleave_rows(in, records_.as<std::uint64_t>() + first_row * (layout_.words + 1));
    added_ += in.rows;
    return;
  }
  const std::uint64_t tile = first_row / tile_rows_;
  kernels::tile_unique(stream_, {in, layout_, tile_rows_, first_row, records_.as<std::uint64_t>() + first_row * layout_.cols(),
                                 tile_counts_.as<std::uint64_t>() + tile,
                                 layout_.origin ? local_.as<std::uint64_t>() + first_row : nullptr, workspace()});
  added_ += in.rows;
}

ResidentChain::Unique ResidentChain::finish_radix() {
  const std::uint32_t W = layout_.words;
  Buffer spare = take_(rows_ * (W + 1) * 8, "keys rows sorted (resident)");
  Buffer values = take_(rows_ * 8, "keys row values (resident)");
  const kernels::cpu::RadixUnique sorted(
      {records_.as<std::uint64_t>(), spare.as<std::uint64_t>(), values.as<double>(), rows_, W, tile_rows_});
  (sorted.sorted_in_spare() ? records_ : spare).reset();
  Unique out;
  out.unique = sorted.unique(), out.records = sorted.tile_records();
  const std::uint64_t unique = std::max<std::uint64_t>(out.unique, 1);
  out.keys = take_(unique * W * 8, "keys unique (resident)");
  out.counts = take_(unique * 8, "keys unique counts (resident)");
  out.values = take_(unique * 8, layout_.value ? "keys summed values (resident)" : "keys sums, unused (resident)");
  if (layout_.origin) out.index = take_(rows_ * 8, "keys index (resident)");
  sorted.write(out.keys.as<std::uint64_t>(), out.counts.as<std::uint64_t>(), out.values.as<double>(),
               layout_.origin ? out.index.as<std::uint64_t>() : nullptr);
  if (!layout_.value) out.values.reset();
  return out;
}

ResidentChain::Unique ResidentChain::finish() {
  if (added_ != rows_) throw std::logic_error("ResidentChain::finish before every row was added");
  if (radix_) return finish_radix();
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

SampledKeys::SampledKeys(const std::vector<std::uint64_t>& packed, std::uint32_t words) : words_(words) {
  for (std::size_t at = 0; at < packed.size();) {
    const std::uint64_t taken = packed[at], weight = packed[at + 1];
    records_ += weight;
    for (std::uint64_t j = 0; j < taken; ++j)
      samples_.push_back(
          {packed.data() + at + 2 + j * words, static_cast<double>(weight) / static_cast<double>(taken)});
    at += 2 + taken * words;
  }
  std::stable_sort(samples_.begin(), samples_.end(),
                   [&](const Sample& a, const Sample& b) { return kernels::compare_keys(a.key, b.key, words_) < 0; });
}

std::vector<std::uint64_t> SampledKeys::splitters(std::uint64_t buckets) const {
  std::vector<std::uint64_t> out;
  double cumulative = 0;
  std::uint64_t b = 1;
  const double total = static_cast<double>(records_);
  for (const Sample& x : samples_) {
    while (b < buckets && cumulative >= total * static_cast<double>(b) / static_cast<double>(buckets)) {
      if (out.empty() || kernels::compare_keys(out.data() + out.size() - words_, x.key, words_) < 0)
        out.insert(out.end(), x.key, x.key + words_);
      ++b;
    }
    cumulative += x.weight;
  }
  return out;
}

std::uint64_t share_width(std::uint64_t rows, std::uint64_t tile_rows, std::uint64_t shares) {
  const std::uint64_t tiles = kernels::tiles_of(rows, tile_rows);
  return std::max<std::uint64_t>(1, (tiles + shares - 1) / shares) * tile_rows;
}

std::optional<ResidentChain::Unique> unique_over_ranks(Backend& backend, Stream& stream, comm::Communicator& ranks,
                                                       RankRows mine, std::uint64_t tile_rows, std::uint32_t samples,
                                                       bool index, std::uint64_t room,
                                                       const ResidentChain::Take& take) {
  const std::uint64_t rows = mine.rows.rows, first_row = mine.first_row;
  if (tile_rows == 0 || (rows && first_row % tile_rows)) throw std::logic_error("unique_over_ranks: whole tiles");
  const bool cuda = backend.kind() == BackendKind::cuda;
  const std::uint32_t W = mine.rows.words;
  // (cpu: one radix sort, whose records always carry a value, zero where the rows have none)
  const bool radix = !cuda;
  const kernels::RecordLayout layout{W, radix || mine.rows.has_value(), index};
  const std::uint64_t cols = layout.cols();
  const auto P = static_cast<std::size_t>(ranks.size()), me = static_cast<std::size_t>(ranks.rank());
  // (the index: the merge groups its pairs by the rank their records came from, origin over
  // `row_bucket`: on cuda the origins are pass rows, a rank's share the ranks' equal width; on the
  // cpu they are record numbers from rank << 40)
  std::uint64_t width = 0;
  constexpr std::uint64_t kRankOrigins = std::uint64_t{1} << 40;
  if (index && !radix) {
    std::uint64_t total = 0;
    for (const std::uint64_t n : ranks.allgather(rows)) total += n;
    width = share_width(total, tile_rows, P);
    if ((rows && first_row != me * width) || rows > width)
      throw std::logic_error("unique_over_ranks: the index needs rank r's rows at r * share_width(...)");
  }
  // (where the time goes, for the debug log: reduce, exchange, merge, index)
  const Stopwatch started;
  double reduced = 0, exchanged = 0, merged = 0;
  // This rank's tiles' records grouped by bucket, one bucket a rank, and what goes to each.
  comm::Counts send(P, 0);
  Buffer grouped, local;  // (local: cuda, each row's tile-local id; cpu, each row's record)
  std::uint64_t grouped_records = 0;
  if (!radix) {  // tile_unique, samples, splitters, bucket_split on the device
    const std::uint64_t tiles = rows ? kernels::tiles_of(rows, tile_rows) : 0;
    const std::uint64_t sample_words = kernels::sample_partial_words(samples, W);
    Buffer records, tile_counts, work;
    std::vector<std::uint64_t> tile_samples(tiles * sample_words);
    const std::uint64_t work_bytes =
        std::max(kernels::tile_unique_scratch_bytes(rows, W), kernels::bucket_split_scratch_bytes(rows));
    if (rows) {
      records = take(rows * cols * 8, "keys records (resident, this rank's tiles)");
      tile_counts = take(tiles * 8, "keys tile counts (resident)");
      if (index) local = take(rows * 8, "keys local ids (resident)");
      work = take(work_bytes, "keys dedup workspace (resident)");
      kernels::tile_unique(stream, {mine.rows,
                                    layout,
                                    tile_rows,
                                    first_row,
                                    records.as<std::uint64_t>(),
                                    tile_counts.as<std::uint64_t>(),
                                    index ? local.as<std::uint64_t>() : nullptr,
                                    {work.data(), work.size()}});
      Buffer partials = take(tile_samples.size() * 8, "keys tile samples (resident)");
      kernels::tile_samples(stream, {records.as<std::uint64_t>(), tile_counts.as<std::uint64_t>(), layout, tiles,
                                     tile_rows, first_row / tile_rows, samples, partials.as<std::uint64_t>()});
      backend.copy_to_host(tile_samples.data(), partials.data(), tile_samples.size() * 8, stream);
      stream.synchronize();
    }
    mine.holder.reset();  // (the stream has run past its last reader)
    std::vector<std::uint64_t> packed;
    for (std::uint64_t t = 0; t < tiles; ++t) {
      const std::uint64_t* partial = tile_samples.data() + t * sample_words;
      packed.insert(packed.end(), partial, partial + 2 + partial[0] * W);
    }
    const std::vector<std::uint64_t> splitters =
        SampledKeys(ranks.allgatherv(comm::HostSpan<const std::uint64_t>(packed.data(), packed.size())).data, W)
            .splitters(static_cast<std::uint64_t>(P));
    const auto buckets = static_cast<std::uint32_t>(splitters.size() / W + 1);
    if (rows) {
      grouped = take(rows * cols * 8, "keys records grouped by rank (resident)");
      Buffer counts = take(buckets * 8, "keys bucket counts (resident)");
      Buffer splitters_on_device = take(std::max<std::uint64_t>(splitters.size(), 1) * 8, "keys splitters (resident)");
      if (!splitters.empty())
        backend.copy_to_device(splitters_on_device.data(), splitters.data(), splitters.size() * 8, stream);
      kernels::bucket_split(stream, {records.as<std::uint64_t>(),
                                     tile_counts.as<std::uint64_t>(),
                                     layout,
                                     rows,
                                     tile_rows,
                                     splitters_on_device.as<std::uint64_t>(),
                                     buckets,
                                     grouped.as<std::uint64_t>(),
                                     counts.as<std::uint64_t>(),
                                     {work.data(), work.size()}});
      backend.copy_to_host(send.data(), counts.data(), buckets * 8, stream);
      stream.synchronize();
    }
    for (const std::uint64_t c : send) grouped_records += c;
  } else {  // one radix sort gives the tiles' records key after key: the buckets are runs of them
    if (rows) {
      // (the sort's rows: each key and its value's bits, zero without values; consumed)
      Buffer sorted_rows =
          mine.rows.interleaved ? std::move(mine.holder) : take(rows * (W + 1) * 8, "keys rows (resident)");
      if (!mine.rows.interleaved) {
        interleave_rows(mine.rows, sorted_rows.as<std::uint64_t>());
        mine.holder.reset();
      }
      Buffer spare = take(rows * (W + 1) * 8, "keys rows sorted (resident)");
      Buffer values = take(rows * 8, "keys row values (resident)");
      const kernels::cpu::RadixUnique sorted(
          {sorted_rows.as<std::uint64_t>(), spare.as<std::uint64_t>(), values.as<double>(), rows, W, tile_rows});
      grouped_records = sorted.tile_records();
      grouped = take(grouped_records * cols * 8, "keys records grouped by rank (resident)");
      if (index) local = take(rows * 8, "keys each row's record (resident)");
      sorted.write_tile_records(grouped.as<std::uint64_t>(), index ? local.as<std::uint64_t>() : nullptr,
                                me * kRankOrigins);
    }
    mine.holder.reset();
    // (samples at regular places of the sorted records, each standing for an equal share)
    const std::uint64_t taken = std::min<std::uint64_t>(grouped_records, std::uint64_t{samples} * 64);
    std::vector<std::uint64_t> packed;
    if (taken) {
      packed = {taken, grouped_records};
      for (std::uint64_t j = 0; j < taken; ++j) {
        const std::uint64_t* key = grouped.as<std::uint64_t>() + j * grouped_records / taken * cols;
        packed.insert(packed.end(), key, key + W);
      }
    }
    const std::vector<std::uint64_t> splitters =
        SampledKeys(ranks.allgatherv(comm::HostSpan<const std::uint64_t>(packed.data(), packed.size())).data, W)
            .splitters(static_cast<std::uint64_t>(P));
    // (bucket b: the records from the first at or above splitter b - 1 to the first at or above splitter b)
    const std::uint64_t* records = grouped.as<std::uint64_t>();
    std::uint64_t begin = 0;
    for (std::size_t b = 0; b < send.size(); ++b) {
      std::uint64_t end = grouped_records;
      if ((b + 1) * W <= splitters.size()) {
        const std::uint64_t* splitter = splitters.data() + b * W;
        std::uint64_t lo = begin, hi = grouped_records;
        while (lo < hi) {
          const std::uint64_t mid = lo + (hi - lo) / 2;
          if (kernels::compare_keys(records + mid * cols, splitter, W) < 0)
            lo = mid + 1;
          else
            hi = mid;
        }
        end = lo;
      }
      send[b] = end - begin;
      begin = end;
    }
  }
  reduced = started.seconds();
  for (std::uint64_t& c : send) c *= cols;  // (records -> words)
  const comm::Counts receive = ranks.alltoall_counts(send);
  std::uint64_t received = 0;
  for (const std::uint64_t c : receive) received += c / cols;
  // (with the index: then the pairs that come back, the index and its gather's workspace, beside the local ids)
  const std::uint64_t index_bytes =
      index ? rows * 24 + 16 * P + rows * 8 + (cuda ? kernels::index_gather_scratch_bytes(rows) : 0) : 0;
  const std::uint64_t need = received * cols * 8 + merged_bytes(layout, received) +
                             (cuda ? kernels::bucket_merge_scratch_bytes(received, W) : 0) + index_bytes;
  for (const std::uint64_t over : ranks.allgather<std::uint64_t>(need > room ? 1 : 0))
    if (over) return std::nullopt;
  Buffer bucket = take(std::max<std::uint64_t>(received, 1) * cols * 8, "keys bucket from every rank (resident)");
  ranks.alltoallv(comm::DeviceSpan<const std::uint64_t>(grouped.as<std::uint64_t>(), grouped_records * cols), send,
                  comm::DeviceSpan<std::uint64_t>(bucket.as<std::uint64_t>(), received * cols), receive, stream);
  grouped.reset();
  stream.synchronize();
  exchanged = started.seconds();
  // This rank's bucket merged: its records came rank after rank, that is tile after tile.
  ResidentChain::Unique out;
  out.records = received;
  const std::uint64_t at_least_one = std::max<std::uint64_t>(received, 1);
  out.keys = take(at_least_one * W * 8, "keys unique (resident)");
  out.counts = take(at_least_one * 8, "keys unique counts (resident)");
  if (layout.value) out.values = take(at_least_one * 8, "keys summed values (resident)");
  // (the merge's unique count, then with the index its pairs' counts by the rank of their rows)
  Buffer counts = take((1 + P) * 8, "keys unique count (resident)");
  Buffer pairs = index ? take(at_least_one * 24, "keys index pairs (resident)") : Buffer{};
  std::vector<std::uint64_t> pair_counts(P, 0);
  if (received) {
    const std::uint64_t merge_work = cuda ? kernels::bucket_merge_scratch_bytes(received, W) : 0;
    Buffer merge_space = merge_work ? take(merge_work, "keys merge workspace (resident)") : Buffer{};
    kernels::BucketMerge m;
    m.records = bucket.as<std::uint64_t>();
    m.rows = received;
    m.layout = layout;
    m.keys = out.keys.as<std::uint64_t>();
    m.counts = out.counts.as<std::uint64_t>();
    m.values = out.values.as<double>();
    m.unique = counts.as<std::uint64_t>();
    if (index) {
      m.batch = me;  // (the pairs' batch: this rank, whose keys start at its prefix)
      m.pairs = pairs.as<std::uint64_t>();
      m.pair_counts = counts.as<std::uint64_t>() + 1;
      m.row_buckets = static_cast<std::uint32_t>(P);
      m.rows_per_row_bucket = radix ? kRankOrigins : width;
    }
    m.work = {merge_space.data(), merge_space.size()};
    kernels::bucket_merge(stream, m);
    backend.copy_to_host(&out.unique, counts.data(), 8, stream);
    if (index) backend.copy_to_host(pair_counts.data(), counts.as<std::uint64_t>() + 1, P * 8, stream);
    stream.synchronize();
  }
  bucket.reset();
  const std::vector<std::uint64_t> unique_of = ranks.allgather(out.unique);
  std::vector<std::uint64_t> prefix(P, 0);
  for (std::size_t r = 1; r < P; ++r) prefix[r] = prefix[r - 1] + unique_of[r - 1];
  out.first = prefix[me];
  merged = started.seconds();
  const auto say = [&] {
    spdlog::debug(
        "keys: rank {} of {}: {} rows to {} records in {:.3f} s, {} records exchanged in {:.3f} s, merged to {} "
        "keys in {:.3f} s{}",
        me, P, rows, grouped_records, reduced, received, exchanged - reduced, out.unique, merged - exchanged,
        index ? fmt::format(", the index in {:.3f} s", started.seconds() - merged) : std::string());
  };
  if (!index) {
    say();
    return out;
  }
  // Each pair (origin, batch = the merging rank, position) back to the rank of its origin's rows.
  comm::Counts pairs_out(P), pairs_in;
  for (std::size_t r = 0; r < P; ++r) pairs_out[r] = pair_counts[r] * 3;
  pairs_in = ranks.alltoall_counts(pairs_out);
  std::uint64_t back = 0;
  for (const std::uint64_t c : pairs_in) back += c / 3;
  if (back > rows) throw std::logic_error("unique_over_ranks: more pairs came back than this rank has rows");
  Buffer returned = take(std::max<std::uint64_t>(back, 1) * 24, "keys index pairs, this rank's rows (resident)");
  ranks.alltoallv(comm::DeviceSpan<const std::uint64_t>(pairs.as<std::uint64_t>(), received * 3), pairs_out,
                  comm::DeviceSpan<std::uint64_t>(returned.as<std::uint64_t>(), back * 3), pairs_in, stream);
  pairs.reset();
  out.index = take(std::max<std::uint64_t>(rows, 1) * 8, "keys index (resident)");
  if (rows && radix) {  // each record's position, then each row's through its record
    std::vector<std::uint64_t> position(grouped_records, ~std::uint64_t{0});
    const std::uint64_t* pair = returned.as<std::uint64_t>();
    for (std::uint64_t k = 0; k < back; ++k, pair += 3)
      position.at(pair[0] - me * kRankOrigins) = prefix[pair[1]] + pair[2];
    const std::uint64_t* record_of = local.as<std::uint64_t>();
    std::uint64_t* to = out.index.as<std::uint64_t>();
    parallel_for_pieces(rows, 1 << 16, [&](std::uint64_t begin, std::uint64_t end) {
      for (std::uint64_t i = begin; i < end; ++i) to[i] = position[record_of[i]];
    });
  } else if (rows) {  // (cuda: the pass rows' tile-local ids, through index_gather)
    Buffer prefix_on_device = take(P * 8, "keys index offsets (resident)");
    backend.copy_to_device(prefix_on_device.data(), prefix.data(), P * 8, stream);
    Buffer gather_space = take(kernels::index_gather_scratch_bytes(rows), "keys index workspace (resident)");
    kernels::index_gather(stream, {local.as<std::uint64_t>(),
                                   rows,
                                   first_row,
                                   tile_rows,
                                   returned.as<std::uint64_t>(),
                                   back,
                                   prefix_on_device.as<std::uint64_t>(),
                                   out.index.as<std::uint64_t>(),
                                   {gather_space.data(), gather_space.size()}});
    stream.synchronize();
  }
  say();
  return out;
}

}  // namespace qstage::stages::keys

// ------------------------------------------------------------------------------ HostChain

namespace qstage::stages::keys {

namespace {
// Pageable host memory charged to the host budget, as a Buffer (freed and released with it).
Buffer host_array(Backend& backend, std::uint64_t bytes, const char* what) {
  bytes = std::max<std::uint64_t>(bytes, 8);
  backend.charge_host(bytes, what);
  std::uint64_t* p = nullptr;
  try {
    p = new std::uint64_t[(bytes + 7) / 8];  // (default-initialized: pages are touched as they are written)
  } catch (...) {
    backend.host_budget().release(bytes);
    throw;
  }
  return Buffer(p, bytes, &backend.host_budget(), [](void* q) { delete[] static_cast<std::uint64_t*>(q); });
}
// words from `from` to `to`, in pieces on the threads
void parallel_copy(std::uint64_t* to, const std::uint64_t* from, std::uint64_t words) {
  parallel_for_pieces(words, 1 << 18, [&](std::uint64_t begin, std::uint64_t end) {
    std::memcpy(to + begin, from + begin, (end - begin) * 8);
  });
}
std::uint64_t block_phase_bytes(const kernels::RecordLayout& L, std::uint64_t tile_rows, std::uint64_t block_rows) {
  return block_rows * L.cols() * 8 + kernels::tiles_of(block_rows, tile_rows) * 8 + (L.origin ? block_rows * 8 : 0);
}
std::uint64_t host_workspace_bytes(bool cuda, const kernels::RecordLayout& L, std::uint64_t block_rows) {
  if (!cuda) return 0;
  return std::max(kernels::tile_unique_scratch_bytes(block_rows, L.words),
                  kernels::bucket_merge_scratch_bytes(block_rows, L.words));
}
}  // namespace

// Where each bucket ends in each tile. Candidate bounds are keys at regular positions of every
// tile's records (s a tile, s chosen so that fewer than half a bucket's records lie between two
// neighbouring candidates); a bucket ends at the largest candidate below which at most `capacity`
// records remain, counted exactly (a binary search in each tile). Which candidates are counted is
// guessed from their estimated ranks (each sample stands for the records up to the next one of its
// tile): a bucket's end is found in a few exact counts instead of a bisection over all candidates
// (each count misses the caches in thousands of tiles). The ends are the same either way.
class HostChain::Cutter {
 public:
  Cutter(const std::uint64_t* records, const kernels::RecordLayout& L, const std::vector<std::uint64_t>& first,
         const std::vector<std::uint64_t>& count, std::uint64_t capacity)
      : records_(records),
        cols_(L.cols()),
        words_(L.words),
        first_(first),
        count_(count),
        capacity_(capacity),
        at_(count.size(), 0),
        end_(count.size(), 0),
        below_(count.size(), 0) {
    std::uint64_t total = 0, largest = 1;
    for (const std::uint64_t n : count) total += n, largest = std::max(largest, n);
    left_ = total;
    const std::uint64_t per_tile = std::clamp<std::uint64_t>((4 * total + capacity - 1) / capacity, 1, largest);
    // (copied out of the records, words apart: sorting pointers into them missed the caches at every
    // comparison, hundreds of thousands of candidates)
    std::vector<Sample> samples;
    for (std::size_t t = 0; t < count.size(); ++t)
      for (std::uint64_t j = 0; j < per_tile && count[t]; ++j) {
        Sample x{};
        const std::uint64_t at = j * count[t] / per_tile;
        std::copy_n(key(t, at), words_, x.key.begin());
        x.records = (j + 1) * count[t] / per_tile - at;
        samples.push_back(x);
      }
    const auto below = [&](const Sample& a, const Sample& b) {
      return kernels::compare_keys(a.key.data(), b.key.data(), words_) < 0;
    };
    std::sort(samples.begin(), samples.end(), below);
    // A candidate's estimated rank: the records that the samples below it stand for.
    std::uint64_t ahead = 0;
    for (std::size_t i = 0; i < samples.size(); ahead += samples[i].records, ++i)
      if (i == 0 || below(samples[i - 1], samples[i])) {
        candidates_.push_back(samples[i].key);
        estimated_.push_back(ahead);
      }
  }
  bool done() const { return left_ == 0; }
  // The next bucket: end() gives its end in each tile (at() its start); its records.
  std::uint64_t next() {
    at_.swap(end_);  // (the last bucket's ends are this one's starts; at first zeros)
    std::uint64_t records = 0;
    if (left_ <= capacity_) {
      end_ = count_;
      records = left_;
    } else {
      // The largest candidate past the last bound below which at most capacity_ records remain. In
      // candidates taken (index + 1): lo fits (at first the last bound: no records), hi does not
      // (at first past the last candidate: every record left, more than capacity_). Each count is
      // at the candidate whose estimated rank lies where capacity_ lies between lo's and hi's
      // exact counts (above lo's by the room left while hi is not counted), kept inside the
      // window; every third a bisection, so that a poor estimate costs at most three times the
      // bisection's counts.
      std::size_t lo = candidates_taken_, hi = candidates_.size() + 1;
      std::uint64_t lo_records = 0, hi_records = 0;
      const auto estimate = [&](std::size_t taken) {
        return taken == 0 ? 0.0 : static_cast<double>(estimated_[taken - 1]);
      };
      for (int probe = 0; hi - lo > 1; ++probe) {
        std::size_t mid = lo + (hi - lo) / 2;
        if (probe % 3 != 2) {
          const double room = static_cast<double>(capacity_ - lo_records),
                       aim = estimate(lo) + (hi_records == 0 ? room
                                                             : room / static_cast<double>(hi_records - lo_records) *
                                                                   (estimate(hi) - estimate(lo)));
          // (the candidates whose estimate is at most aim, taken)
          const auto past = std::upper_bound(estimated_.begin(), estimated_.end(), aim,
                                             [](double a, std::uint64_t e) { return a < static_cast<double>(e); });
          mid = std::clamp<std::size_t>(static_cast<std::size_t>(past - estimated_.begin()), lo + 1, hi - 1);
        }
        const std::uint64_t n = count_below(candidates_[mid - 1].data());
        if (n <= capacity_)
          lo = mid, lo_records = n, end_ = below_;  // (lo's ends kept: the bucket's, when lo is the last)
        else
          hi = mid, hi_records = n;
      }
      if (lo == candidates_taken_) throw std::logic_error("HostChain: no bucket bound fits");
      records = lo_records;
      candidates_taken_ = lo;
      if (records == 0) throw std::logic_error("HostChain: an empty bucket");
    }
    left_ -= records;
    return records;
  }
  const std::vector<std::uint64_t>& at() const { return at_; }
  const std::vector<std::uint64_t>& end() const { return end_; }

 private:
  const std::uint64_t* key(std::size_t tile, std::uint64_t i) const { return records_ + (first_[tile] + i) * cols_; }
  // Records from the bucket's start below `bound`, summed over the tiles (each tile's end in below_).
  // (The tiles' binary searches on the threads: each misses the caches at every probe, thousands
  // of tiles a bound, a few bounds a bucket.)
  std::uint64_t count_below(const std::uint64_t* bound) {
    parallel_for(static_cast<std::int64_t>(count_.size()), [&](std::int64_t i) {
      const auto t = static_cast<std::size_t>(i);
      std::uint64_t lo = at_[t], hi = count_[t];
      while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (kernels::compare_keys(key(t, mid), bound, words_) < 0)
          lo = mid + 1;
        else
          hi = mid;
      }
      below_[t] = lo;
    });
    std::uint64_t n = 0;
    for (std::size_t t = 0; t < count_.size(); ++t) n += below_[t] - at_[t];
    return n;
  }
  const std::uint64_t* records_;
  std::uint64_t cols_;
  std::uint32_t words_;
  const std::vector<std::uint64_t>& first_;
  const std::vector<std::uint64_t>& count_;
  std::uint64_t capacity_, left_ = 0;
  using Key = std::array<std::uint64_t, 4>;  // (at most four words; the rest zero)
  struct Sample {
    Key key;
    std::uint64_t records;  // its tile's records from it to the next sample
  };
  std::vector<Key> candidates_;           // the samples' keys, ascending, each once
  std::vector<std::uint64_t> estimated_;  // each candidate's estimated rank among all records
  std::size_t candidates_taken_ = 0;
  std::vector<std::uint64_t> at_, end_, below_;
};

HostChain::HostChain(Backend& backend, Stream& stream, kernels::RecordLayout layout, std::uint64_t rows,
                     std::uint64_t tile_rows, std::uint64_t block_rows)
    : backend_(backend),
      stream_(stream),
      layout_(layout),
      rows_(rows),
      tile_rows_(tile_rows),
      block_rows_(block_rows),
      cuda_(backend.kind() == BackendKind::cuda) {
  if (rows == 0 || tile_rows == 0 || block_rows == 0 || block_rows % tile_rows)
    throw std::logic_error("HostChain: rows, and blocks of whole tiles");
  const std::uint64_t tiles = kernels::tiles_of(rows, tile_rows);
  if (block_rows < 8 * tiles) throw std::logic_error("HostChain: a bucket must hold eight records of every tile");
  records_ = host_array(backend, rows * layout.cols() * 8, "keys records (host)");
  if (layout.origin) local_ = host_array(backend, rows * 8, "keys local ids (host)");
  tile_first_.assign(tiles, 0);
  tile_count_.assign(tiles, 0);
  block_records_ = backend.alloc_device(block_rows * layout.cols() * 8, "keys block records (host chain)");
  block_counts_ =
      backend.alloc_device(kernels::tiles_of(block_rows, tile_rows) * 8, "keys block tile counts (host chain)");
  if (layout.origin) block_local_ = backend.alloc_device(block_rows * 8, "keys block local ids (host chain)");
  if (const std::uint64_t work = host_workspace_bytes(cuda_, layout, block_rows))
    work_ = backend.alloc_device(work, "keys dedup workspace (host chain)");
  if (cuda_) landing_ = backend.alloc_host(landing_bytes(layout, block_rows), "keys landing (host chain)");
}

std::uint64_t HostChain::device_bytes(bool cuda, kernels::RecordLayout L, std::uint64_t tile_rows,
                                      std::uint64_t block_rows) {
  return host_workspace_bytes(cuda, L, block_rows) +
         std::max(block_phase_bytes(L, tile_rows, block_rows), block_rows * L.cols() * 8 + merged_bytes(L, block_rows));
}
std::uint64_t HostChain::host_bytes(kernels::RecordLayout L, std::uint64_t rows) {
  // records (and local ids, which become the index), then the outputs at their largest and the
  // index table beside them
  const std::uint64_t records = rows * L.cols() * 8 + (L.origin ? rows * 8 : 0);
  return records + rows * (L.words * 8 + 8 + (L.value ? 8 : 0)) + (L.origin ? rows * 8 : 0);
}
std::uint64_t HostChain::landing_bytes(kernels::RecordLayout L, std::uint64_t block_rows) {
  // (a block's records and local ids; later a bucket's keys, counts, values and pairs of three)
  return block_rows * std::max(L.cols() + (L.origin ? 1 : 0), L.words + 1 + (L.value ? 1 : 0) + (L.origin ? 3 : 0)) * 8;
}
std::uint64_t HostChain::staging_bytes(kernels::RecordLayout L, std::uint64_t block_rows) {
  return 2 * input_staging_bytes(L, block_rows) + landing_bytes(L, block_rows);
}

void HostChain::add(const kernels::KeyRows& in, std::uint64_t first_row) {
  if (first_row != added_ || first_row % tile_rows_ || first_row + in.rows > rows_ || in.rows > block_rows_ ||
      (in.rows % tile_rows_ && first_row + in.rows != rows_))
    throw std::logic_error("HostChain::add: rows out of order, too many or not whole tiles");
  const std::uint64_t cols = layout_.cols(), first_tile = first_row / tile_rows_,
                      tiles = kernels::tiles_of(in.rows, tile_rows_);
  kernels::tile_unique(stream_, {in, layout_, tile_rows_, first_row, block_records_.as<std::uint64_t>(),
                                 block_counts_.as<std::uint64_t>(),
                                 layout_.origin ? block_local_.as<std::uint64_t>() : nullptr, workspace()});
  std::uint64_t* counts = tile_count_.data() + first_tile;
  backend_.copy_to_host(counts, block_counts_.data(), tiles * 8, stream_);
  // On cuda the block comes down whole into pinned memory (one copy at the bus's rate; a copy a
  // tile into the pageable arrays ran at a fraction of it, on one thread faulting their pages in).
  const std::uint64_t* records = block_records_.as<std::uint64_t>();
  const std::uint64_t* local = block_local_.as<std::uint64_t>();
  if (cuda_) {
    std::uint64_t* to = landing_.as<std::uint64_t>();
    backend_.copy_to_host(to, records, in.rows * cols * 8, stream_);
    if (layout_.origin) backend_.copy_to_host(to + block_rows_ * cols, local, in.rows * 8, stream_);
    records = to, local = to + block_rows_ * cols;
  }
  Stopwatch watch;
  stream_.synchronize();
  seconds_.tiles_down += watch.lap();
  for (std::uint64_t t = 0; t < tiles; ++t)  // (each tile's records, packed after the last tile's)
    tile_first_[first_tile + t] = held_records_, held_records_ += counts[t];
  std::uint64_t* held = records_.as<std::uint64_t>();
  std::uint64_t* local_ids = layout_.origin ? local_.as<std::uint64_t>() + first_row : nullptr;
  parallel_for(static_cast<std::int64_t>(tiles), [&](std::int64_t t) {
    const auto u = static_cast<std::uint64_t>(t);
    std::memcpy(held + tile_first_[first_tile + u] * cols, records + u * tile_rows_ * cols, counts[u] * cols * 8);
    if (local_ids)
      std::memcpy(local_ids + u * tile_rows_, local + u * tile_rows_,
                  (std::min(in.rows, (u + 1) * tile_rows_) - u * tile_rows_) * 8);
  });
  seconds_.tiles_spread += watch.lap();
  added_ += in.rows;
}

void HostChain::merge(const std::uint64_t* staged, std::uint64_t records) {
  backend_.copy_to_device(bucket_.data(), staged, records * layout_.cols() * 8, stream_);
  kernels::BucketMerge m;
  m.records = bucket_.as<std::uint64_t>();
  m.rows = records;
  m.layout = layout_;
  m.keys = merged_keys_.as<std::uint64_t>();
  m.counts = merged_counts_.as<std::uint64_t>();
  m.values = merged_values_.as<double>();
  m.unique = merged_unique_.as<std::uint64_t>();
  if (layout_.origin) {
    m.pairs = merged_pairs_.as<std::uint64_t>();
    m.pair_counts = merged_unique_.as<std::uint64_t>() + 1;
    m.row_buckets = 1;
    m.rows_per_row_bucket = rows_;
  }
  m.work = workspace();
  kernels::bucket_merge(stream_, m);
  merging_ = records;
}

HostChain::Landed HostChain::download() {
  Landed l;
  l.records = merging_;
  backend_.copy_to_host(&l.unique, merged_unique_.data(), 8, stream_);
  stream_.synchronize();
  // On cuda the bucket's keys, counts, values and pairs come down into the landing at the bus's
  // rate, and the device is free for the next bucket; on the cpu they are read where they are.
  const std::uint64_t words = layout_.words;
  std::uint64_t* to = landing_.as<std::uint64_t>();
  const auto down = [&](const Buffer& from, std::uint64_t n) -> const std::uint64_t* {
    if (!cuda_) return from.as<std::uint64_t>();
    backend_.copy_to_host(to, from.data(), n * 8, stream_);
    return std::exchange(to, to + n);
  };
  l.keys = down(merged_keys_, l.unique * words);
  l.counts = down(merged_counts_, l.unique);
  if (layout_.value) l.values = down(merged_values_, l.unique);
  if (layout_.origin) l.pairs = down(merged_pairs_, l.records * 3);
  stream_.synchronize();
  merging_ = 0;
  return l;
}

void HostChain::spread(const Landed& l, Unique& out, std::uint64_t* table) {
  const std::uint64_t words = layout_.words;
  parallel_copy(out.keys.as<std::uint64_t>() + out.unique * words, l.keys, l.unique * words);
  parallel_copy(out.counts.as<std::uint64_t>() + out.unique, l.counts, l.unique);
  if (layout_.value) parallel_copy(out.values.as<std::uint64_t>() + out.unique, l.values, l.unique);
  if (layout_.origin) {  // (pair: origin, batch, position among the bucket's keys; origins apart)
    const std::uint64_t first = out.unique;
    parallel_for_pieces(l.records, 1 << 16, [&](std::uint64_t begin, std::uint64_t end) {
      for (std::uint64_t p = begin; p < end; ++p) table[l.pairs[3 * p]] = first + l.pairs[3 * p + 2];
    });
  }
  out.unique += l.unique;
  ++out.buckets;
}

HostChain::Unique HostChain::finish() {
  if (added_ != rows_) throw std::logic_error("HostChain::finish before every row was added");
  block_records_.reset(), block_counts_.reset(), block_local_.reset();
  const std::uint64_t cols = layout_.cols(), words = layout_.words, held = std::max<std::uint64_t>(held_records_, 1);
  Unique out;
  out.on_host = true;
  out.buckets = 0;
  out.records = held_records_;
  out.keys = host_array(backend_, held * words * 8, "keys unique (host)");
  out.counts = host_array(backend_, held * 8, "keys unique counts (host)");
  if (layout_.value) out.values = host_array(backend_, held * 8, "keys summed values (host)");
  Buffer table = layout_.origin ? host_array(backend_, rows_ * 8, "keys index table (host)") : Buffer{};
  bucket_ = backend_.alloc_device(block_rows_ * cols * 8, "keys bucket (host chain)");
  merged_keys_ = backend_.alloc_device(block_rows_ * words * 8, "keys merged keys (host chain)");
  merged_counts_ = backend_.alloc_device(block_rows_ * 8, "keys merged counts (host chain)");
  if (layout_.value) merged_values_ = backend_.alloc_device(block_rows_ * 8, "keys merged values (host chain)");
  if (layout_.origin) {
    merged_pairs_ = backend_.alloc_device(block_rows_ * 24, "keys merged pairs (host chain)");
  }
  merged_unique_ = backend_.alloc_device(16, "keys merged counts (host chain)");
  Buffer staging[2];
  for (Buffer& b : staging) b = backend_.alloc_host(block_rows_ * cols * 8, "keys bucket staging (host chain)");

  Stopwatch watch;
  Cutter cut(records_.as<std::uint64_t>(), layout_, tile_first_, tile_count_, block_rows_);
  std::vector<std::uint64_t> offset(tile_count_.size());
  // One bucket's records, tile after tile, into staging (the tiles' copies on the threads).
  const auto gather = [&](std::uint64_t* to) {
    const std::vector<std::uint64_t>&at = cut.at(), &end = cut.end();
    std::uint64_t n = 0;
    for (std::size_t t = 0; t < offset.size(); ++t) offset[t] = n, n += end[t] - at[t];
    const std::uint64_t* from = records_.as<std::uint64_t>();
    parallel_for(static_cast<std::int64_t>(offset.size()), [&](std::int64_t t) {
      if (end[t] > at[t])
        std::memcpy(to + offset[t] * cols, from + (tile_first_[t] + at[t]) * cols, (end[t] - at[t]) * cols * 8);
    });
  };
  std::uint64_t records = cut.next(), k = 0;
  seconds_.bounds += watch.lap();
  gather(staging[0].as<std::uint64_t>());
  seconds_.gather += watch.lap();
  merge(staging[0].as<std::uint64_t>(), records);
  seconds_.merge += watch.lap();
  for (;; ++k) {
    const bool more = !cut.done();
    if (more) {  // (the next bucket gathered while the device merges this one)
      records = cut.next();
      seconds_.bounds += watch.lap();
      gather(staging[(k + 1) % 2].as<std::uint64_t>());
    }
    seconds_.gather += watch.lap();
    const Landed landed = download();
    seconds_.merge_wait += watch.lap();
    // On cuda the next bucket merges while this one spreads from the landing; on the cpu this
    // one's outputs are the merge's buffers, read before the next merge overwrites them.
    if (more && cuda_) merge(staging[(k + 1) % 2].as<std::uint64_t>(), records);
    seconds_.merge += watch.lap();
    spread(landed, out, table.as<std::uint64_t>());
    seconds_.spread += watch.lap();
    if (!more) break;
    if (!cuda_) merge(staging[(k + 1) % 2].as<std::uint64_t>(), records);
    seconds_.merge += watch.lap();
  }
  for (Buffer& b : staging) b.reset();
  bucket_.reset(), merged_keys_.reset(), merged_counts_.reset(), merged_values_.reset(), merged_pairs_.reset();
  merged_unique_.reset(), work_.reset();
  records_.reset();
  if (layout_.origin) {  // every row's (tile, local) id -> its key's position, in place of the local ids
    std::uint64_t* local = local_.as<std::uint64_t>();
    const std::uint64_t* position = table.as<std::uint64_t>();
    parallel_for(static_cast<std::int64_t>(tile_count_.size()), [&](std::int64_t t) {
      const std::uint64_t first = static_cast<std::uint64_t>(t) * tile_rows_, end = std::min(rows_, first + tile_rows_);
      for (std::uint64_t i = first; i < end; ++i) local[i] = position[first + local[i]];
    });
    out.index = std::move(local_);
  }
  return out;
}

}  // namespace qstage::stages::keys
