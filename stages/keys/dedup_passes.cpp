// The passes of stages/keys/dedup_passes.hpp: their PassSpecs, kernels and the sample reduction.
#include "stages/keys/dedup_passes.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/stopwatch.hpp"
#include "io/row_io.hpp"

namespace qstage::stages::keys {

using json = nlohmann::json;
using kernels::RecordLayout;

namespace {

constexpr std::uint64_t kAlign = 256;
constexpr std::uint64_t kSlots = 3;       // the engine's buffer sets per rank, each holding one batch
constexpr double kMargin = 4;             // a batch plans at a quarter of the budget: samples only estimate
constexpr std::uint32_t kMaxBuckets = 1u << 16;
// A merge batch (one bucket's records and what it writes) about this much on average: the engine's slots
// then overlap one bucket's read with another's sort and write, and pin a few hundred MB of host
// memory, not the whole of it (2 buckets of 3 GB each took 3.9 s to pin on an H200).
constexpr double kMergeBatchBytes = 256.0 * (1 << 20);

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

// Cuts a batch's scratch into arrays, each 256-byte aligned (affine in the rows, so sizing
// per row at the smallest batch that gets this much scratch is enough: see scratch_per_row).
class Carve {
 public:
  Carve(void* base, std::uint64_t bytes) : at_(static_cast<char*>(base)), left_(bytes) {}
  template <typename T>
  T* take(std::uint64_t count) {
    const std::uint64_t bytes = ceil_div(count * sizeof(T), kAlign) * kAlign;
    if (bytes > left_) throw std::logic_error("keys.dedup: a kernel's scratch is smaller than planned");
    T* p = reinterpret_cast<T*>(at_);
    at_ += bytes;
    left_ -= bytes;
    return p;
  }
  kernels::Workspace rest() { return {at_, left_}; }

 private:
  char* at_;
  std::uint64_t left_;
};
std::uint64_t aligned(std::uint64_t bytes) { return ceil_div(bytes, kAlign) * kAlign; }

// Per-row scratch for a pass whose batches have at least `min_rows` rows (the engine sizes a slot's
// scratch for its largest batch, at least one tile): `bytes(rows)` is affine in rows.
template <typename F>
std::uint64_t scratch_per_row(std::uint64_t min_rows, F bytes) {
  return ceil_div(bytes(min_rows), min_rows);
}

kernels::KeyRows key_rows(const DedupSource& s, const engine::BatchView& b, bool with_value) {
  kernels::KeyRows in;
  in.keys = static_cast<const std::uint64_t*>(b.inputs[0]);
  in.words = s.words;
  in.stride = s.words + (s.interleaved_value ? 1 : 0);
  in.rows = b.rows.size();
  if (with_value) {
    in.interleaved = s.interleaved_value;
    if (s.values) in.values = static_cast<const double*>(b.inputs[1]);
  }
  return in;
}

std::uint64_t key_row_bytes(const DedupSource& s) { return 8ull * (s.words + (s.interleaved_value ? 1 : 0)); }

// ------------------------------------------------------------------------------ sample

// The kernels' own scratch is the GPU's (the CPU twins sort in host temporaries: a cpu "device"
// is host memory anyway), so on cpu a pass plans only the arrays it hands between kernels.
std::uint64_t gpu_only(bool cuda, std::uint64_t bytes) { return cuda ? bytes : 0; }

std::uint64_t sample_scratch(const DedupSource& s, std::uint64_t rows, bool cuda) {
  const RecordLayout L{s.words, false, false};
  return aligned(rows * L.cols() * 8) + aligned(kernels::tiles_of(rows, s.tile_rows) * 8) +
         gpu_only(cuda, kernels::tile_unique_scratch_bytes(rows, s.words));
}

class SampleKernel final : public engine::PassKernel {
 public:
  SampleKernel(DedupSource s, std::uint64_t per_row) : s_(std::move(s)), per_row_(per_row) {}
  void process(const engine::BatchView& b) override {
    const std::uint64_t rows = b.rows.size(), tiles = kernels::tiles_of(rows, s_.tile_rows);
    const RecordLayout L{s_.words, false, false};
    Carve c(b.scratch, per_row_ * std::max(rows, s_.tile_rows));
    auto* records = c.take<std::uint64_t>(rows * L.cols());
    auto* unique = c.take<std::uint64_t>(tiles);
    kernels::tile_unique(*b.stream, {key_rows(s_, b, false), L, s_.tile_rows, b.rows.begin, records, unique, nullptr,
                                     c.rest()});
    kernels::tile_samples(*b.stream, {records, unique, L, tiles, s_.tile_rows, b.rows.begin / s_.tile_rows, s_.samples,
                                      static_cast<std::uint64_t*>(b.partials)});
  }

 private:
  DedupSource s_;
  std::uint64_t per_row_;
};

// The samples of every tile, in tile order: [taken, weight, taken keys] each. Concatenation is
// the fold (the tree keeps tile order), so every rank ends with the same list.
class SampleReduction final : public engine::Reduction {
 public:
  SampleReduction(std::uint32_t samples, std::uint32_t words) : samples_(samples), words_(words) {}
  std::unique_ptr<engine::Reduction> empty() const override {
    return std::make_unique<SampleReduction>(samples_, words_);
  }
  void fold(std::uint64_t, const std::byte* partial) override {
    std::uint64_t head[2];
    std::memcpy(head, partial, sizeof head);
    const std::size_t at = data_.size();
    data_.resize(at + 2 + head[0] * words_);
    std::memcpy(data_.data() + at, partial, (2 + head[0] * words_) * 8);
  }
  void merge(const engine::Reduction& right) override {
    const auto& r = static_cast<const SampleReduction&>(right).data_;
    data_.insert(data_.end(), r.begin(), r.end());
  }
  std::string save() const override { return std::string(reinterpret_cast<const char*>(data_.data()), data_.size() * 8); }
  void load(const std::string& state) override {
    if (state.size() % 8) throw std::runtime_error("a sample reduction's saved state has the wrong size");
    data_.resize(state.size() / 8);
    std::memcpy(data_.data(), state.data(), state.size());
  }
  const std::vector<std::uint64_t>& data() const { return data_; }

 private:
  std::uint32_t samples_, words_;
  std::vector<std::uint64_t> data_;
};

// ------------------------------------------------------------------------------ partition

// The tile's records go to the scratch on the GPU, whose bucket_split gathers them into the
// `records` output; the CPU twin reorders them in that output itself (through a host temporary,
// as its sorts do), so on cpu the output is where tile_unique writes them and the scratch holds
// only the tiles' counts.
std::uint64_t partition_scratch(const DedupSource& s, std::uint64_t rows, bool cuda) {
  const RecordLayout L = s.record_layout();
  return gpu_only(cuda, aligned(rows * L.cols() * 8)) + aligned(kernels::tiles_of(rows, s.tile_rows) * 8) +
         gpu_only(cuda, std::max(kernels::tile_unique_scratch_bytes(rows, s.words), kernels::bucket_split_scratch_bytes(rows)));
}

class PartitionKernel final : public engine::PassKernel {
 public:
  PartitionKernel(DedupSource s, std::uint64_t per_row, std::vector<std::uint64_t> splitters, bool cuda)
      : s_(std::move(s)), per_row_(per_row), splitters_host_(std::move(splitters)), cuda_(cuda) {}
  void prepare(Backend& backend, Stream& stream) override {
    if (splitters_host_.empty()) return;
    splitters_ = backend.alloc_device(splitters_host_.size() * 8, "keys.dedup splitters");
    backend.copy_to_device(splitters_.data(), splitters_host_.data(), splitters_host_.size() * 8, stream);
    stream.synchronize();
  }
  void process(const engine::BatchView& b) override {
    const std::uint64_t rows = b.rows.size(), tiles = kernels::tiles_of(rows, s_.tile_rows);
    const RecordLayout L = s_.record_layout();
    Carve c(b.scratch, per_row_ * std::max(rows, s_.tile_rows));
    auto* out = static_cast<std::uint64_t*>(b.outputs[0]);
    auto* records = cuda_ ? c.take<std::uint64_t>(rows * L.cols()) : out;  // (partition_scratch)
    auto* unique = c.take<std::uint64_t>(tiles);
    const kernels::Workspace work = c.rest();
    kernels::tile_unique(*b.stream, {key_rows(s_, b, true), L, s_.tile_rows, b.rows.begin, records, unique,
                                     s_.index ? static_cast<std::uint64_t*>(b.outputs[1]) : nullptr, work});
    kernels::bucket_split(*b.stream, {records, unique, L, rows, s_.tile_rows,
                                      splitters_host_.empty() ? nullptr : splitters_.as<std::uint64_t>(),
                                      s_.buckets, out, b.appended[0], work});
  }

 private:
  DedupSource s_;
  std::uint64_t per_row_;
  std::vector<std::uint64_t> splitters_host_;
  bool cuda_;
  Buffer splitters_;
};

// ------------------------------------------------------------------------------ merge

class MergeKernel final : public engine::PassKernel {
 public:
  MergeKernel(DedupSource s, std::uint64_t per_row, std::uint64_t largest, std::vector<std::uint64_t> batch_begins,
              std::uint32_t row_buckets, std::uint64_t rows_per_row_bucket)
      : s_(std::move(s)), per_row_(per_row), largest_(largest), begins_(std::move(batch_begins)),
        row_buckets_(row_buckets), rows_per_row_bucket_(rows_per_row_bucket) {}
  void prepare(Backend& backend, Stream&) override { backend_ = &backend; }
  void process(const engine::BatchView& b) override {
    const RecordLayout L = s_.record_layout();
    // The merge batch's number in the pass (b.index counts from where this run started).
    const auto batch = static_cast<std::uint64_t>(std::upper_bound(begins_.begin(), begins_.end(), b.rows.begin) -
                                                  begins_.begin() - 1);
    kernels::BucketMerge m;
    m.records = static_cast<const std::uint64_t*>(b.inputs[0]);
    m.rows = b.rows.size();
    m.layout = L;
    m.keys = static_cast<std::uint64_t*>(b.outputs[0]);
    m.counts = static_cast<std::uint64_t*>(b.outputs[1]);
    std::size_t o = 2;
    if (L.value) m.values = static_cast<double*>(b.outputs[o++]);
    m.unique = b.appended[0];
    m.batch = batch;
    if (L.origin) {
      m.pairs = static_cast<std::uint64_t*>(b.outputs[o]);
      m.pair_counts = b.appended[o];
      m.row_buckets = row_buckets_;
      m.rows_per_row_bucket = rows_per_row_bucket_;
    }
    m.work = {b.scratch, per_row_ * largest_};
    kernels::bucket_merge(*b.stream, m);
    // keys, counts and values hold as many rows each
    backend_->copy_on_device(b.appended[1], b.appended[0], 8, *b.stream);
    if (L.value) backend_->copy_on_device(b.appended[2], b.appended[0], 8, *b.stream);
  }

 private:
  DedupSource s_;
  std::uint64_t per_row_, largest_;
  std::vector<std::uint64_t> begins_;
  std::uint32_t row_buckets_;
  std::uint64_t rows_per_row_bucket_;
  Backend* backend_ = nullptr;
};

// ------------------------------------------------------------------------------ finish

// The reverse index of a row bucket and/or a share of the unique keys copied into the output.
class FinishKernel final : public engine::PassKernel {
 public:
  struct Copy {
    std::size_t input, output;
    std::uint64_t row_bytes;
  };
  FinishKernel(bool index, std::uint64_t tile_rows, std::uint64_t per_row, std::uint64_t largest,
               std::vector<std::uint64_t> prefix, std::vector<Copy> copies, std::vector<std::uint64_t> batch_begins,
               std::vector<std::uint64_t> shares)
      : index_(index), tile_rows_(tile_rows), per_row_(per_row), largest_(largest), prefix_host_(std::move(prefix)),
        copies_(std::move(copies)), begins_(std::move(batch_begins)), shares_(std::move(shares)) {}
  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    if (!index_) return;
    prefix_ = backend.alloc_device(prefix_host_.size() * 8, "keys.dedup unique-key offsets");
    backend.copy_to_device(prefix_.data(), prefix_host_.data(), prefix_host_.size() * 8, stream);
    stream.synchronize();
  }
  void process(const engine::BatchView& b) override {
    if (index_)
      kernels::index_gather(*b.stream, {static_cast<const std::uint64_t*>(b.inputs[0]), b.rows.size(), b.rows.begin,
                                        tile_rows_, static_cast<const std::uint64_t*>(b.inputs[1]),
                                        b.input_rows[1].size(), prefix_.as<std::uint64_t>(),
                                        static_cast<std::uint64_t*>(b.outputs[0]), {b.scratch, per_row_ * largest_}});
    const auto batch = static_cast<std::size_t>(std::upper_bound(begins_.begin(), begins_.end(), b.rows.begin) -
                                                begins_.begin() - 1);
    for (const Copy& c : copies_) {
      const std::uint64_t rows = b.input_rows[c.input].size();
      if (rows) backend_->copy_on_device(b.outputs[c.output], b.inputs[c.input], rows * c.row_bytes, *b.stream);
      // (shares_ lives as long as the kernel: the copy may complete after this call returns)
      backend_->copy_to_device(b.appended[c.output], &shares_[batch], 8, *b.stream);
    }
  }

 private:
  bool index_;
  std::uint64_t tile_rows_, per_row_, largest_;
  std::vector<std::uint64_t> prefix_host_;
  std::vector<Copy> copies_;
  std::vector<std::uint64_t> begins_, shares_;
  Buffer prefix_;
  Backend* backend_ = nullptr;
};

// Where the output pass's share of the unique keys ends after pass row `row` of `rows`: batch
// [b, e) copies keys [U b / n, U e / n), never more than its rows, as U <= n.
__extension__ using Wide = unsigned __int128;  // (U * row may pass 64 bits)
std::uint64_t share_end(std::uint64_t unique, std::uint64_t row, std::uint64_t rows) {
  return static_cast<std::uint64_t>(static_cast<Wide>(unique) * row / rows);
}

// The output pass after run_resident: each batch's rows of the index and its share of the unique
// keys, counts and values, copied out of the resident buffers (device memory, or host memory
// where HostChain left them).
class ResidentFinishKernel final : public engine::PassKernel {
 public:
  struct Copy {
    const void* from;
    std::size_t output;
    std::uint64_t row_bytes;
  };
  ResidentFinishKernel(const std::uint64_t* index, std::vector<Copy> copies, std::uint64_t unique, std::uint64_t rows,
                       std::uint64_t tile_rows, bool on_host)
      : index_(index),
        copies_(std::move(copies)),
        unique_(unique),
        rows_(rows),
        tile_rows_(tile_rows),
        on_host_(on_host),
        shares_(kernels::tiles_of(rows, tile_rows)) {}
  void prepare(Backend& backend, Stream&) override { backend_ = &backend; }
  void process(const engine::BatchView& b) override {
    const auto copy = [&](void* to, const void* from, std::uint64_t bytes) {
      if (on_host_)
        backend_->copy_to_device(to, from, bytes, *b.stream);
      else
        backend_->copy_on_device(to, from, bytes, *b.stream);
    };
    if (index_) copy(b.outputs[0], index_ + b.rows.begin, b.rows.size() * 8);
    const std::uint64_t first = share_end(unique_, b.rows.begin, rows_), end = share_end(unique_, b.rows.end, rows_);
    // (kept per batch as long as the kernel lives: the count's copy may complete after this returns)
    std::uint64_t& share = shares_[b.rows.begin / tile_rows_];
    share = end - first;
    for (const Copy& c : copies_) {
      if (share) copy(b.outputs[c.output], static_cast<const char*>(c.from) + first * c.row_bytes, share * c.row_bytes);
      backend_->copy_to_device(b.appended[c.output], &share, 8, *b.stream);
    }
  }

 private:
  const std::uint64_t* index_;
  std::vector<Copy> copies_;
  std::uint64_t unique_, rows_, tile_rows_;
  bool on_host_;
  std::vector<std::uint64_t> shares_;  // by the batch's first tile
  Backend* backend_ = nullptr;
};

std::vector<engine::RowRange> ranges_of(const std::vector<std::uint64_t>& counts) {
  std::vector<engine::RowRange> r;
  std::uint64_t at = 0;
  for (const std::uint64_t c : counts) {
    r.push_back({at, at + c});
    at += c;
  }
  return r;
}

Layout keys_layout(const DedupSource& s, std::uint64_t rows) {
  const std::uint64_t chunk = std::max<std::uint64_t>(1, std::min<std::uint64_t>(rows, 1 << 16));
  if (s.keys_1d) return {DType::uint64, {rows}, {chunk}};
  return {DType::uint64, {rows, s.words}, {chunk, s.words}};
}
Layout column_layout(DType dtype, std::uint64_t rows) {
  return {dtype, {rows}, {std::max<std::uint64_t>(1, std::min<std::uint64_t>(rows, 1 << 16))}};
}

engine::OutputDecl appended(std::string name, Layout layout, std::uint32_t buckets = 0) {
  engine::OutputDecl o{std::move(name), std::move(layout)};
  o.kind = engine::OutputKind::appended;
  o.max_rows_per_row = 1;
  o.buckets = buckets;
  return o;
}

std::uint64_t device_budget(const StepContext& ctx) { return ctx.backend->device_budget().limit(); }
std::uint32_t ranks(const StepContext& ctx) { return ctx.comm ? static_cast<std::uint32_t>(ctx.comm->size()) : 1; }

}  // namespace

DedupRun::DedupRun(const StepContext& ctx, DedupSource source) : ctx_(ctx), source_(std::move(source)) {
  if (source_.words < 1 || source_.words > kernels::kMaxKeyWords)
    throw std::logic_error("DedupRun: keys of 1 to 4 words");
  if (source_.rows == 0) throw std::logic_error("DedupRun: no rows");
  if (source_.interleaved_value && source_.values) throw std::logic_error("DedupRun: two values");
  if (source_.keys_1d && source_.words != 1) throw std::logic_error("DedupRun: 1-D keys of several words");
}

DedupResult DedupRun::result() const {
  if (!done() || resident_) throw std::logic_error("DedupRun::result before the merge's passes are done");
  return {merge_pass_, "keys", "counts", "values", unique_};
}

StepPass DedupRun::next() const {
  const DedupSource& s = source_;
  const bool cuda = ctx_.backend && ctx_.backend->kind() == BackendKind::cuda;
  StepPass p;
  if (phase_ == Phase::sample) {
    p.name = "sample";
    p.pass.rows = s.rows;
    p.pass.tile_rows = s.tile_rows;
    p.pass.inputs.push_back({"keys", nullptr, key_row_bytes(s)});
    p.streamed_inputs = {s.keys};
    const std::uint64_t per_row = scratch_per_row(s.tile_rows, [&](std::uint64_t r) { return sample_scratch(s, r, cuda); });
    p.pass.scratch_device_bytes_per_row = per_row;
    p.pass.tile_partial_bytes = kernels::sample_partial_words(s.samples, s.words) * 8;
    p.kernel = std::make_unique<SampleKernel>(s, per_row);
    p.reduction = std::make_unique<SampleReduction>(s.samples, s.words);
    return p;
  }
  if (phase_ == Phase::partition) {
    DedupSource t = s;
    t.buckets = buckets_;
    const RecordLayout L = t.record_layout();
    p.name = "partition";
    p.pass.rows = s.rows;
    p.pass.tile_rows = s.tile_rows;
    p.pass.inputs.push_back({"keys", nullptr, key_row_bytes(s)});
    p.streamed_inputs = {s.keys};
    if (s.values) {
      p.pass.inputs.push_back({"values", nullptr, 8});
      p.streamed_inputs.push_back(*s.values);
    }
    const std::uint64_t chunk = std::min<std::uint64_t>(s.rows, 1 << 16);
    p.pass.outputs.push_back(appended("records", {DType::uint64, {s.rows, L.cols()}, {chunk, L.cols()}}, t.buckets));
    if (s.index) p.pass.outputs.push_back({"local", {DType::uint64, {s.rows}, {s.tile_rows}}});
    const std::uint64_t per_row = scratch_per_row(s.tile_rows, [&](std::uint64_t r) { return partition_scratch(t, r, cuda); });
    p.pass.scratch_device_bytes_per_row = per_row;
    p.pass.resident_device_bytes = aligned(splitters_.size() * 8);
    p.kernel = std::make_unique<PartitionKernel>(t, per_row, splitters_, cuda);
    return p;
  }
  if (phase_ == Phase::merge) {
    const RecordLayout L = s.record_layout();
    std::uint64_t rows = 0, largest = 1;
    std::vector<std::uint64_t> begins;
    for (const std::uint64_t r : bucket_rows_) {
      if (r == 0) continue;  // explicit batches are non-empty: an empty bucket has nothing to merge
      p.pass.batches.push_back({rows, rows + r});
      begins.push_back(rows);
      rows += r;
      largest = std::max(largest, r);
    }
    p.name = "merge";
    p.pass.rows = rows;
    p.pass.tile_rows = 1;
    p.pass.inputs.push_back({"records", nullptr, L.cols() * 8ull});
    p.streamed_inputs = {earlier_pass_input(partition_pass_, "records")};
    p.pass.outputs.push_back(appended("keys", keys_layout(s, rows)));
    p.pass.outputs.push_back(appended("counts", column_layout(DType::uint64, rows)));
    if (L.value) p.pass.outputs.push_back(appended("values", column_layout(DType::float64, rows)));
    if (L.origin)
      p.pass.outputs.push_back(appended("pairs", {DType::uint64, {rows, 3}, {std::min<std::uint64_t>(rows, 1 << 16), 3}},
                                        row_buckets_));
    const std::uint64_t per_row = ceil_div(gpu_only(cuda, kernels::bucket_merge_scratch_bytes(largest, s.words)), largest);
    p.pass.scratch_device_bytes_per_row = per_row;
    p.kernel = std::make_unique<MergeKernel>(s, per_row, largest, begins, row_buckets_, rows_per_row_bucket_);
    return p;
  }
  throw std::logic_error("DedupRun::next after the merge");
}

void DedupRun::finished(const StepPass& pass) {
  const DedupSource& s = source_;
  const int done_index = *ctx_.passes_done;  // this pass's number in the step
  if (phase_ == Phase::sample) {
    // Weighted samples: each stands for weight / taken of its tile's distinct keys.
    const SampledKeys sampled(static_cast<const SampleReduction&>(*pass.reduction).data(), s.words);
    const std::uint64_t records = sampled.records();
    // Buckets: each merge batch (its records, the merge's outputs and scratch) at a quarter of
    // what one of the engine's slots may take, about kMergeBatchBytes, and at least one per rank.
    const RecordLayout L = s.record_layout();
    const std::uint64_t budget = device_budget(ctx_);
    const double merge_bytes_per_record = L.cols() * 8.0 + s.words * 8.0 + 16 + (L.origin ? 24 : 0) +
                                          (ctx_.backend->kind() == BackendKind::cuda ? 44.0 : 0.0);  // (the GPU sort's arrays and CUB's share)
    const double merge_batch_bytes_per_record = L.cols() * 8.0 + s.words * 8.0 + 16 + (L.origin ? 24 : 0);  // (in and out)
    std::uint64_t buckets = s.buckets;
    if (buckets == 0) {
      const double want = std::max(
          kMargin * kSlots * merge_bytes_per_record * static_cast<double>(records) / static_cast<double>(budget),
          merge_batch_bytes_per_record * static_cast<double>(records) / kMergeBatchBytes);
      buckets = std::max<std::uint64_t>(ranks(ctx_), static_cast<std::uint64_t>(std::ceil(want)));
    }
    buckets = std::clamp<std::uint64_t>(buckets, 1, std::min<std::uint64_t>(kMaxBuckets, std::max<std::uint64_t>(1, records)));
    std::vector<std::uint64_t> splitters = sampled.splitters(buckets);
    // Row buckets of the reverse index: whole tiles, a finish batch (its local ids, index,
    // pairs, copies and scratch) at a quarter of a slot's share, at least one per rank.
    const std::uint64_t tiles = kernels::tiles_of(s.rows, s.tile_rows);
    const double finish_bytes_per_row = 8 + 8 + 24 + 2 * (s.words * 8.0 + 16) + 12;
    const double want_rows = static_cast<double>(budget) / (kMargin * kSlots * finish_bytes_per_row);
    std::uint64_t tiles_per = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(want_rows / static_cast<double>(s.tile_rows)));
    tiles_per = std::min(tiles_per, std::max<std::uint64_t>(1, tiles / std::min<std::uint64_t>(tiles, ranks(ctx_))));
    phase_ = Phase::partition;
    buckets_ = static_cast<std::uint32_t>(splitters.size() / s.words + 1);
    if (!ctx_.comm || ctx_.comm->root())
      spdlog::debug("keys.dedup: the sample stands for about {} records: {} buckets, {} row buckets of {} tiles", records,
                    buckets_, ceil_div(tiles, tiles_per), tiles_per);
    splitters_ = std::move(splitters);
    rows_per_row_bucket_ = tiles_per * s.tile_rows;
    row_buckets_ = static_cast<std::uint32_t>(ceil_div(tiles, tiles_per));
    return;
  }
  const auto report = [&](const std::string& name) -> const engine::OutputReport& {
    for (const auto& r : pass.outputs)
      if (r.name == name) return r;
    throw std::logic_error("keys.dedup: pass " + pass.name + " reported no output '" + name + "'");
  };
  if (phase_ == Phase::partition) {
    phase_ = Phase::merge;
    partition_pass_ = done_index;
    bucket_rows_ = report("records").bucket_rows;
    return;
  }
  if (phase_ == Phase::merge) {
    const engine::OutputReport& keys = report("keys");
    std::vector<std::uint64_t> prefix{0};
    for (const std::uint64_t u : keys.batch_rows) prefix.push_back(prefix.back() + u);
    phase_ = Phase::done;
    merge_pass_ = done_index;
    unique_ = keys.rows;
    unique_prefix_ = std::move(prefix);
    if (s.index) pair_rows_ = report("pairs").bucket_rows;
    return;
  }
  throw std::logic_error("DedupRun::finished: a pass it did not give: " + pass.name);
}

int DedupRun::first_live_pass(int none) const {
  if (resident_) return none;
  switch (phase_) {
    case Phase::sample:
    case Phase::partition: {
      int first = none;
      for (const std::optional<std::string>& input : {std::optional<std::string>(source_.keys), source_.values})
        if (input)
          if (const auto ref = parse_earlier_pass_input(*input)) first = std::min(first, ref->pass);
      return first;
    }
    case Phase::merge: return partition_pass_;
    case Phase::done: return source_.index ? partition_pass_ : merge_pass_;
  }
  return 0;
}

std::vector<std::uint64_t> DedupRun::merge_rows_per_rank(int ranks) const {
  // (divided: rank r merged bucket r; else, on resident data, every rank merged every record)
  if (divided_ && resident_) return bucket_rows_;
  if (resident_) return std::vector<std::uint64_t>(static_cast<std::size_t>(std::max(ranks, 1)), resident_->records);
  std::vector<std::uint64_t> load(static_cast<std::size_t>(std::max(ranks, 1)), 0);
  std::size_t batch = 0;
  for (const std::uint64_t r : bucket_rows_)
    if (r > 0) load[batch++ % load.size()] += r;  // (as the merge pass lists its batches)
  return load;
}

void DedupRun::save(Packer& out) const {
  if (resident_) return DedupRun(ctx_, source_).save(out);  // (the state before run_resident: its result is in memory)
  out.put(phase_);
  out.put(partition_pass_), out.put(merge_pass_), out.put(buckets_), out.put(row_buckets_);
  out.put_vector(splitters_);
  out.put(rows_per_row_bucket_);
  out.put_vector(bucket_rows_);
  out.put(unique_);
  out.put_vector(unique_prefix_);
  out.put_vector(pair_rows_);
}

void DedupRun::load(Unpacker& in) {
  phase_ = in.get<Phase>();
  if (phase_ > Phase::done) throw std::runtime_error("keys.dedup: a saved state of another layout");
  partition_pass_ = in.get<int>(), merge_pass_ = in.get<int>();
  buckets_ = in.get<std::uint32_t>(), row_buckets_ = in.get<std::uint32_t>();
  splitters_ = in.get_vector<std::uint64_t>();
  rows_per_row_bucket_ = in.get<std::uint64_t>();
  bucket_rows_ = in.get_vector<std::uint64_t>();
  unique_ = in.get<std::uint64_t>();
  unique_prefix_ = in.get_vector<std::uint64_t>();
  pair_rows_ = in.get_vector<std::uint64_t>();
}

StepPass DedupRun::finish_pass(bool copy_unique) const {
  const bool cuda = ctx_.backend && ctx_.backend->kind() == BackendKind::cuda;
  const DedupSource& s = source_;
  if (!done()) throw std::logic_error("DedupRun::finish_pass before the merge is done");
  if (!s.index && !copy_unique) throw std::logic_error("DedupRun::finish_pass with nothing to do");
  if (resident_) return resident_finish_pass(copy_unique);
  const int merge = merge_pass_;
  const std::uint64_t unique = unique_;
  const std::uint64_t per_bucket = rows_per_row_bucket_;
  StepPass p;
  p.name = "finish";
  p.pass.rows = s.rows;
  p.pass.tile_rows = s.tile_rows;
  std::vector<std::uint64_t> begins, shares;
  std::uint64_t largest = 1;
  for (std::uint64_t at = 0; at < s.rows; at += per_bucket) {
    const engine::RowRange r{at, std::min(s.rows, at + per_bucket)};
    p.pass.batches.push_back(r);
    begins.push_back(r.begin);
    largest = std::max(largest, r.size());
  }
  std::vector<engine::RowRange> share_ranges;
  for (const auto& r : p.pass.batches) {
    share_ranges.push_back({share_end(unique, r.begin, s.rows), share_end(unique, r.end, s.rows)});
    shares.push_back(share_ranges.back().size());
  }
  std::vector<FinishKernel::Copy> copies;
  std::uint64_t per_row = 0;
  if (s.index) {
    p.pass.inputs.push_back({"local", nullptr, 8});
    p.streamed_inputs.push_back(earlier_pass_input(partition_pass_, "local"));
    engine::StreamedInput pairs{"pairs", nullptr, 24, engine::InputKind::row_ranges, ranges_of(pair_rows_)};
    p.pass.inputs.push_back(pairs);
    p.streamed_inputs.push_back(earlier_pass_input(merge, "pairs"));
    p.pass.outputs.push_back({"index", {DType::uint64, {s.rows}, {s.tile_rows}}});
    per_row = ceil_div(gpu_only(cuda, kernels::index_gather_scratch_bytes(largest)), largest);
    p.pass.resident_device_bytes = aligned(unique_prefix_.size() * 8);
  }
  if (copy_unique) {
    auto copy = [&](const std::string& name, Layout layout) {
      const std::uint64_t row_bytes = layout.row_bytes();
      p.pass.inputs.push_back({name, nullptr, row_bytes, engine::InputKind::row_ranges, share_ranges});
      p.streamed_inputs.push_back(earlier_pass_input(merge, name));
      p.pass.outputs.push_back(appended(name, std::move(layout)));
      copies.push_back({p.pass.inputs.size() - 1, p.pass.outputs.size() - 1, row_bytes});
    };
    copy("keys", keys_layout(s, std::max<std::uint64_t>(unique, 1)));
    copy("counts", column_layout(DType::uint64, std::max<std::uint64_t>(unique, 1)));
    if (s.has_value()) copy("values", column_layout(DType::float64, std::max<std::uint64_t>(unique, 1)));
  }
  p.pass.scratch_device_bytes_per_row = per_row;
  p.kernel = std::make_unique<FinishKernel>(s.index, s.tile_rows, per_row, largest,
                                            s.index ? unique_prefix_ : std::vector<std::uint64_t>{}, std::move(copies),
                                            std::move(begins), std::move(shares));
  return p;
}

StepPass DedupRun::resident_finish_pass(bool copy_unique) const {
  const DedupSource& s = source_;
  const ResidentChain::Unique& u = *resident_;
  StepPass p;
  p.name = "finish";
  p.pass.rows = s.rows;
  p.pass.tile_rows = s.tile_rows;
  if (s.index) p.pass.outputs.push_back({"index", {DType::uint64, {s.rows}, {s.tile_rows}}});
  std::vector<ResidentFinishKernel::Copy> copies;
  if (copy_unique) {
    const std::uint64_t unique = std::max<std::uint64_t>(u.unique, 1);
    auto copy = [&](const char* name, const Buffer& from, Layout layout) {
      const std::uint64_t row_bytes = layout.row_bytes();
      p.pass.outputs.push_back(appended(name, std::move(layout)));
      copies.push_back({from.data(), p.pass.outputs.size() - 1, row_bytes});
    };
    copy("keys", u.keys, keys_layout(s, unique));
    copy("counts", u.counts, column_layout(DType::uint64, unique));
    if (s.has_value()) copy("values", u.values, column_layout(DType::float64, unique));
  }
  p.kernel = std::make_unique<ResidentFinishKernel>(s.index ? u.index.as<std::uint64_t>() : nullptr, std::move(copies),
                                                    u.unique, s.rows, s.tile_rows, u.on_host);
  return p;
}

bool DedupRun::run_resident(const h5::Dataset& keys, const h5::Dataset* values) {
  const DedupSource& s = source_;
  // (buckets given: the exchange and the merge the user asked for, through the passes)
  if (phase_ != Phase::sample || resident_ || s.buckets || s.interleaved_value ||
      s.values.has_value() != (values != nullptr))
    return false;
  Backend& backend = *ctx_.backend;
  const bool cuda = backend.kind() == BackendKind::cuda;
  const RecordLayout L = s.record_layout();
  // Blocks of whole tiles, about 4 Mi rows (about 100 MB of two-word keys and values).
  const std::uint64_t tiles = kernels::tiles_of(s.rows, s.tile_rows);
  std::uint64_t block =
      std::min(tiles, std::max<std::uint64_t>(1, (std::uint64_t{1} << 22) / s.tile_rows)) * s.tile_rows;
  const std::uint64_t key_bytes = key_row_bytes(s), row_bytes = key_bytes + (values ? 8 : 0);
  const std::uint64_t device_left = backend.device_budget().left() / 2, host_left = backend.host_budget().left() / 2;
  // Where the records go: the device when the chain fits half of what its budget has left (and the
  // host budget the staging blocks); else host memory (HostChain) when its arrays fit half of the
  // host budget's and a block and a bucket the device's; else nowhere: the passes run, through files.
  const auto device_fits = [&] {
    return ResidentChain::peak_bytes(cuda, L, s.rows, s.tile_rows, block) + block * row_bytes <= device_left &&
           (cuda ? 2 * block * row_bytes : 0) <= host_left;  // (pinned staging; on cpu the block is read in place)
  };
  const auto host_fits = [&](std::uint64_t b) {
    return b >= 8 * tiles && HostChain::device_bytes(cuda, L, s.tile_rows, b) + b * row_bytes <= device_left &&
           HostChain::host_bytes(L, s.rows) + (cuda ? HostChain::staging_bytes(L, b) : 0) <= host_left;
  };
  bool on_device = device_fits();
  std::uint64_t host_block = block;  // (halved until a block and a bucket fit the device)
  while (!host_fits(host_block) && host_block / 2 >= s.tile_rows)
    host_block = host_block / 2 / s.tile_rows * s.tile_rows;
  bool on_host = host_fits(host_block);
  // (several ranks: the unit divided between them where each could hold the chain on its device;
  // else each runs it whole on its own device, if every one of them can, the same way)
  if (ranks(ctx_) > 1) {
    on_device = !ctx_.comm->any(!on_device);
    on_host = !ctx_.comm->any(!on_host);
  }
  enum class Tier : std::uint8_t { device, host, none };
  const Tier tier = on_device ? Tier::device : on_host ? Tier::host : Tier::none;
  if (tier == Tier::host) block = host_block;
  if (tier == Tier::none) return false;

  const Stopwatch started;
  std::unique_ptr<Stream> stream = backend.make_stream(false);
  double read_seconds = 0;
  // Rows [first, first + count) into device memory (keys, then values at `values_to`), block by
  // block through pinned staging on cuda (the next block read while the last is copied).
  const ReadRows read_rows = [&](std::uint64_t first, std::uint64_t count, std::uint64_t rows_a_block, char* keys_to,
                                 char* values_to, Stream& on) {
    Buffer staging[2];
    if (cuda)
      for (Buffer& b : staging) b = backend.alloc_host(rows_a_block * row_bytes, "keys input staging (resident)");
    h5::RowReader key_reader(keys);
    std::optional<h5::RowReader> value_reader;
    if (values) value_reader.emplace(*values);
    for (std::uint64_t row0 = 0, k = 0; row0 < count; row0 += rows_a_block, ++k) {
      const std::uint64_t n = std::min(rows_a_block, count - row0);
      char* key_dst = cuda ? staging[k % 2].as<char>() : keys_to + row0 * key_bytes;
      char* value_dst = cuda ? staging[k % 2].as<char>() + n * key_bytes : values_to + row0 * 8;
      const Stopwatch read_started;
      key_reader.read(first + row0, n, key_dst);
      if (values) value_reader->read(first + row0, n, value_dst);
      read_seconds += read_started.seconds();
      if (!cuda) continue;
      on.synchronize();  // (the staging read two blocks ago has gone up)
      backend.copy_to_device(keys_to + row0 * key_bytes, key_dst, n * key_bytes, on);
      if (values) backend.copy_to_device(values_to + row0 * 8, value_dst, n * 8, on);
    }
    on.synchronize();
  };
  // (divided where every rank holds rows of the equal shares: not for a few tiles over many ranks)
  if (tier == Tier::device && ranks(ctx_) > 1 &&
      (ranks(ctx_) - 1) * share_width(s.rows, s.tile_rows, ranks(ctx_)) < s.rows) {
    if (run_divided(read_rows, block, device_left)) {
      spdlog::info(
          "keys.dedup: {} unique keys of {} rows on resident data divided between {} ranks in {:.2f} s (reading "
          "{:.2f} s; {} records merged)",
          unique_, s.rows, ranks(ctx_), started.seconds(), read_seconds, resident_->records);
      return true;
    }
    spdlog::info(
        "keys.dedup: the unit divided between {} ranks does not fit some rank's device budget; each runs it whole",
        ranks(ctx_));
  }
  // The input read block by block into the chain (on cuda each block is read into pinned staging
  // while the device works on the last; staging as large as HostChain's buckets, which reuse it).
  const auto read_into = [&](auto& chain, std::uint64_t staging_bytes) {
    Buffer in = backend.alloc_device(block * row_bytes, "keys input block (resident)");
    Buffer staging[2];
    if (cuda)
      for (Buffer& b : staging) b = backend.alloc_host(staging_bytes, "keys input staging (resident)");
    h5::RowReader key_reader(keys);
    std::optional<h5::RowReader> value_reader;
    if (values) value_reader.emplace(*values);
    for (std::uint64_t row0 = 0, k = 0; row0 < s.rows; row0 += block, ++k) {
      const std::uint64_t n = std::min(block, s.rows - row0);
      // (cuda: read while the device works on the last block; the wait below frees this staging's last use)
      char* to = static_cast<char*>(cuda ? staging[k % 2].data() : in.data());
      const Stopwatch read_started;
      key_reader.read(row0, n, to);
      if (values) value_reader->read(row0, n, to + block * key_bytes);
      read_seconds += read_started.seconds();
      stream->synchronize();
      if (cuda) {
        backend.copy_to_device(in.data(), to, n * key_bytes, *stream);
        if (values) backend.copy_to_device(in.as<char>() + block * key_bytes, to + block * key_bytes, n * 8, *stream);
      }
      kernels::KeyRows rows;
      rows.keys = in.as<std::uint64_t>();
      rows.words = s.words;
      rows.stride = s.words;
      rows.rows = n;
      if (values) rows.values = reinterpret_cast<const double*>(in.as<char>() + block * key_bytes);
      chain.add(rows, row0);
    }
    stream->synchronize();
  };
  double tiles_seconds = 0;
  ResidentChain::Unique u;
  std::string host_split;  // (the host chain's time, where it went)
  if (tier == Tier::device) {
    ResidentChain chain(backend, *stream, L, s.rows, s.tile_rows, block,
                        [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); });
    read_into(chain, block * row_bytes);
    tiles_seconds = started.seconds();
    u = chain.finish();
  } else {
    HostChain chain(backend, *stream, L, s.rows, s.tile_rows, block);
    read_into(chain, HostChain::input_staging_bytes(L, block));
    tiles_seconds = started.seconds();
    u = chain.finish();
    const HostChain::Seconds& t = chain.seconds();
    host_split = fmt::format(
        "; on the host: tiles down {:.2f} s, spread {:.2f} s; buckets bounded {:.2f} s, gathered {:.2f} s, merged "
        "{:.2f} s, merges waited for {:.2f} s, spread {:.2f} s",
        t.tiles_down, t.tiles_spread, t.bounds, t.gather, t.merge, t.merge_wait, t.spread);
  }
  phase_ = Phase::done;
  unique_ = u.unique;
  bucket_rows_ = {u.records};
  buckets_ = u.buckets;
  row_buckets_ = 1;
  resident_ = std::move(u);
  spdlog::info(
      "keys.dedup: {} unique keys of {} rows on resident data, {} in {:.2f} s (reading and sorting tiles {:.2f} s, "
      "of it reading {:.2f} s; merging {} records in {} bucket{} {:.2f} s{})",
      unique_, s.rows, resident_->on_host ? "records in host memory" : "in device memory", started.seconds(),
      tiles_seconds, read_seconds, bucket_rows_[0], buckets_, buckets_ == 1 ? "" : "s",
      started.seconds() - tiles_seconds, host_split);
  return true;
}

bool DedupRun::run_divided(const ReadRows& read, std::uint64_t block, std::uint64_t device_left) {
  const DedupSource& s = source_;
  Backend& backend = *ctx_.backend;
  comm::Communicator ranks(*ctx_.comm, &backend);
  const auto P = static_cast<std::uint64_t>(ranks.size()), me = static_cast<std::uint64_t>(ranks.rank());
  // Equal shares of whole tiles (the reverse index's row buckets); every rank must hold some rows.
  const std::uint64_t width = share_width(s.rows, s.tile_rows, P);
  if ((P - 1) * width >= s.rows) throw std::logic_error("DedupRun::run_divided: a rank without rows");
  const std::uint64_t first = me * width, rows = std::min(s.rows, first + width) - first;
  const std::uint64_t key_bytes = key_row_bytes(s), value_bytes = s.has_value() ? 8 : 0;
  std::unique_ptr<Stream> stream = backend.make_stream(false);
  const auto take = [&](std::uint64_t bytes, const char* what) { return backend.alloc_device(bytes, what); };
  Buffer in =
      take(std::max<std::uint64_t>(rows, 1) * (key_bytes + value_bytes), "keys input, this rank's share (resident)");
  read(first, rows, std::min(block, rows), in.as<char>(), in.as<char>() + rows * key_bytes, *stream);
  kernels::KeyRows mine{in.as<std::uint64_t>(), s.words, s.words, nullptr, false, rows};
  if (value_bytes) mine.values = reinterpret_cast<const double*>(in.as<char>() + rows * key_bytes);
  std::optional<ResidentChain::Unique> part = unique_over_ranks(backend, *stream, ranks, {mine, std::move(in), first},
                                                                s.tile_rows, s.samples, s.index, device_left, take);
  if (!part) return false;
  // Every rank's keys, counts, values and index on every rank, for the output pass as it is.
  const comm::Counts unique_of = ranks.allgather(part->unique), rows_of = ranks.allgather(rows);
  std::uint64_t unique = 0;
  for (const std::uint64_t u : unique_of) unique += u;
  const std::uint64_t whole =
      std::max<std::uint64_t>(unique, 1) * (key_bytes + 8 + value_bytes) + (s.index ? s.rows * 8 : 0);
  if (ctx_.comm->any(whole > backend.device_budget().left())) return false;
  ResidentChain::Unique out;
  out.unique = unique, out.buckets = static_cast<std::uint32_t>(P);
  const comm::Counts records_of = ranks.allgather(part->records);
  for (const std::uint64_t r : records_of) out.records += r;
  const auto gather = [&](Buffer& to, const Buffer& from, const comm::Counts& counts, std::uint64_t words,
                          std::uint64_t total, const char* what) {
    to = take(std::max<std::uint64_t>(total, 1) * words * 8, what);
    comm::Counts elements = counts;
    for (std::uint64_t& c : elements) c *= words;
    ranks.allgatherv(
        comm::DeviceSpan<const std::uint64_t>(from.as<std::uint64_t>(), std::max<std::uint64_t>(elements[me], 1)),
        comm::DeviceSpan<std::uint64_t>(to.as<std::uint64_t>(), std::max<std::uint64_t>(total, 1) * words), elements,
        *stream);
  };
  gather(out.keys, part->keys, unique_of, s.words, unique, "keys unique, every rank's (resident)");
  gather(out.counts, part->counts, unique_of, 1, unique, "keys unique counts, every rank's (resident)");
  if (value_bytes)
    gather(out.values, part->values, unique_of, 1, unique, "keys summed values, every rank's (resident)");
  if (s.index) gather(out.index, part->index, rows_of, 1, s.rows, "keys index, every rank's rows (resident)");
  stream->synchronize();
  phase_ = Phase::done;
  unique_ = unique;
  bucket_rows_ = records_of;  // (merge_rows_per_rank: what each rank merged)
  buckets_ = out.buckets;
  row_buckets_ = 1;
  resident_ = std::move(out);
  divided_ = true;
  return true;
}

}  // namespace qstage::stages::keys
