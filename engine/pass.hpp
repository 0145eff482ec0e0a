#pragma once
// What a stage hands the streaming engine: a *pass* over a row space (axis 0 of its datasets).
//
// The engine cuts [0, rows) into batches of whole tiles, reads each batch's rows of every input
// into pinned host buffers, copies them to the device, calls PassKernel::process, computes the
// outputs' checksums on the device, copies outputs back and writes them to HDF5 - with reads,
// copies, compute and writes of different batches overlapped. Batches are spread over MPI ranks.
//
// Reductions across batches are deterministic: a kernel writes one partial per *tile* (a fixed
// block of tile_rows rows), and a Reduction folds the partials in a fixed tree over the tiles.
// Tile boundaries do not depend on the batch size or the rank count, so neither does the result.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/layout.hpp"
#include "codec/codec.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"

namespace qstage::engine {

struct RowRange {
  std::uint64_t begin = 0, end = 0;
  std::uint64_t size() const { return end - begin; }
};

// How an input's rows reach a batch.
enum class InputKind {
  rows,           // the batch's own rows
  row_ranges,     // a range of rows per batch (StreamedInput::ranges), e.g. a K-way merge of
                  // sorted runs reads from each run (one input per run) the range its keys cover
  stored_chunks,  // the dataset's chunks as stored (still compressed), for a kernel that decodes
                  // them: chunks of tile_rows whole rows; each tile of a batch gets a slot of
                  // tile_rows * row_bytes bytes holding a StoredChunk header and the chunk's bytes
};

// A dataset read batch by batch.
struct StreamedInput {
  std::string name;                      // the stage's slot name, for messages
  const h5::Dataset* dataset = nullptr;  // opened read-only by the runner
  std::uint64_t row_bytes = 0;
  InputKind kind = InputKind::rows;
  // row_ranges: batch i reads rows ranges[i] of the dataset (explicit batches, one range each;
  // empty ranges are allowed). The buffers are sized for the longest.
  std::vector<RowRange> ranges = {};
  // Where the kernel reads it: the device (BatchView::inputs) or only the host's pinned copy
  // (BatchView::host_inputs; inputs[i] is null): a scan the host does as it reads, such as a
  // value range, copies nothing to the device and takes no device memory.
  enum class Place { device, host } place = Place::device;
  // Instead of `dataset`: rows kept in plain files (an earlier pass's exchanged output, read in
  // place; kind rows or row_ranges).
  const h5::RowFiles* files = nullptr;
  std::uint64_t rows() const;  // of the dataset or the files
};

// Where a pass's output goes, chosen per output (the engine's OutputSinks).
enum class OutputKind {
  rows,          // one row per pass row, at the batch's rows (segments, merged at the end)
  coded_chunks,  // the same rows, stored as streams of qstage's codec (HDF5 filter 32881)
  appended,      // any number of rows per batch, in batch order (a chunked writer's output)
};

// A dataset the pass writes batch by batch.
struct OutputDecl {
  std::string name;  // dataset path in the step's output file
  // rows and coded_chunks: shape[0] == the pass's rows and chunk[0] divides its tile_rows;
  // appended: shape[0] is the most rows (the dataset gets what the batches appended), any chunk.
  Layout layout;
  // coded_chunks (float32 and complex64 only): the engine codes each chunk on the device right
  // after the kernel, so only the coded chunks leave it; rank 0 appends them to a spool in the
  // work directory (durable at each checkpoint) and writes them into the output at the end.
  std::optional<codec::Settings> codec = std::nullopt;
  // coded_chunks with relative bounds: the value range they are fractions of (the whole
  // output's, measured by an earlier pass); without it, each chunk's own range.
  std::optional<double> codec_range = std::nullopt;
  OutputKind kind = OutputKind::rows;
  // appended: the most rows one pass row may append (the buffers are sized for it). The kernel
  // writes a batch's rows from the start of its output buffer and their count to
  // BatchView::appended[o]; the output's rows are every batch's, in batch order, and the
  // journal keeps each batch's count (PassOutcome::outputs[o].batch_rows).
  std::uint64_t max_rows_per_row = 0;
  // appended, exchanged between ranks: the kernel writes a batch's rows grouped by bucket
  // (bucket 0's first) and each bucket's count to BatchView::appended[o][0 .. buckets). After
  // every round, each bucket's rows move to the rank that owns it (bucket b: rank b mod P),
  // which keeps them in the work directory; the output holds the buckets one after the other,
  // each in batch order, so it is the same for any rank count (OutputReport::bucket_rows tells
  // where each starts). A key range per bucket makes this a sample sort's exchange, and a later
  // pass with a batch per bucket finds bucket r's rows on rank r. 0: not exchanged.
  std::uint32_t buckets = 0;
  std::uint64_t row_bytes() const { return layout.row_bytes(); }
  bool compressed() const { return kind == OutputKind::coded_chunks; }
};

// What a pass wrote into one output, once it is complete.
struct OutputReport {
  std::string name;
  OutputKind kind = OutputKind::rows;
  std::uint64_t rows = 0;                // rows of the dataset
  std::vector<std::uint64_t> batch_rows; // appended: rows each batch appended, in batch order
  std::vector<std::uint64_t> bucket_rows;  // exchanged: rows per bucket, in bucket order
  std::uint64_t stored_bytes = 0;        // coded_chunks: bytes of the streams
  std::uint64_t chunks = 0;              // coded_chunks: streams
  // The checksum the manifest records: qsum64 of the values (rows, appended) or the XXH64 of
  // the stored bytes (coded_chunks), as hex.
  std::string checksum;
};

struct PassSpec {
  std::uint64_t rows = 0;       // length of the batch axis
  std::uint64_t tile_rows = 1;  // batches are whole tiles; the reduction unit
  std::vector<StreamedInput> inputs;
  std::vector<OutputDecl> outputs;
  std::uint64_t resident_device_bytes = 0;         // kept by the kernel for the whole pass
  std::uint64_t scratch_device_bytes_per_row = 0;  // per batch row, per slot
  std::size_t tile_partial_bytes = 0;              // 0: no reduction
  // The kernel writes its partials into host memory (BatchView::partials is host memory and is
  // not copied): for results the host finishes.
  bool partials_on_host = false;
  std::uint64_t prepare_host_bytes = 0;            // host memory PassKernel::prepare needs briefly
  bool uses_blas = false;                          // the kernel calls kernels::gemm (cuda: a cuBLAS handle per slot)
  // Explicit batches, e.g. key ranges over key-sorted rows (key_range_batches): consecutive
  // non-empty ranges covering [0, rows). Empty: batches of whole tiles, sized by the budgets.
  // With explicit batches each batch is one reduction unit (one partial), the largest must fit
  // the budgets, and every boundary must be a multiple of each output's chunk rows.
  std::vector<RowRange> batches;
  // Scale for progress and throughput: bytes the pass moves per row (in + out by default).
  std::uint64_t progress_bytes_per_row() const;
  // What one row is for the user, when bytes say little (a row of tn.contract is one slice of one
  // amplitude, of tn.statevector one amplitude): progress then counts rows in this unit
  // ("slices", "amplitudes") instead of bytes. Empty: bytes.
  std::string progress_unit;
};

// One batch as the kernel sees it. Pointers are device memory (host memory on cpu).
struct BatchView {
  std::uint64_t index = 0;  // batch number within this run (global over ranks)
  RowRange rows;            // rows of the pass
  std::vector<const void*> inputs;  // one per PassSpec::inputs: input_rows[i].size() rows each
  std::vector<RowRange> input_rows;  // per input: its rows in this batch (`rows` unless row_ranges)
  std::vector<const void*> host_inputs;  // the same bytes in (pinned) host memory, for the host's share
  std::vector<void*> outputs;       // one per PassSpec::outputs
  // Per output: appended ones, where the kernel stores how many rows it appended (a u64 in
  // device memory, host memory on cpu; exchanged outputs: one per bucket); null for the others.
  std::vector<std::uint64_t*> appended;
  void* scratch = nullptr;          // scratch_device_bytes_per_row * rows.size() bytes
  void* partials = nullptr;         // tiles * tile_partial_bytes (explicit batches: one partial)
  Stream* stream = nullptr;
};

// The stage's per-batch work (Ginkgo's apply_impl: the framework did the validation and moves
// the data; this only computes). Must be deterministic for a given batch.
class PassKernel {
 public:
  virtual ~PassKernel() = default;
  // Once per rank before the first batch, on the I/O thread: load resident data (e.g. a matrix
  // that every batch multiplies with) into device memory charged to the device budget.
  virtual void prepare(Backend& backend, Stream& stream) {}
  // Enqueue the batch's work on batch.stream (cpu: do it now).
  virtual void process(const BatchView& batch) = 0;
};

// Folds the partials of the pass's reduction units (tiles, or explicit batches) in a fixed tree
// (engine/tree_fold.hpp), so the result is the same for any rank count and batch size. The
// tree's state is saved at every checkpoint (a binary side file the journal names), so a resumed
// pass continues the same fold. Once the pass is done, every rank's Reduction holds the result.
class Reduction {
 public:
  virtual ~Reduction() = default;
  // An empty fold of the same kind: merge's identity, a node of the tree.
  virtual std::unique_ptr<Reduction> empty() const = 0;
  // This empty fold takes the partial of reduction unit `unit` (a leaf of the tree).
  virtual void fold(std::uint64_t unit, const std::byte* partial) = 0;
  // this = this + right, where right folds the units just after this one's.
  virtual void merge(const Reduction& right) = 0;
  virtual std::string save() const = 0;            // bytes
  virtual void load(const std::string& state) = 0;
};

// The common reduction: its state is one partial (a trivially copyable struct whose default
// value is the identity), and folding two is `Combine(into, from)` (sums, extremes, counts).
template <typename Partial, void (*Combine)(Partial&, const Partial&)>
class PartialFold final : public Reduction {
 public:
  std::unique_ptr<Reduction> empty() const override { return std::make_unique<PartialFold>(); }
  void fold(std::uint64_t, const std::byte* partial) override {
    Partial p;
    std::memcpy(&p, partial, sizeof p);
    Combine(acc_, p);
  }
  void merge(const Reduction& right) override { Combine(acc_, static_cast<const PartialFold&>(right).acc_); }
  std::string save() const override { return std::string(reinterpret_cast<const char*>(&acc_), sizeof acc_); }
  void load(const std::string& state) override {
    if (state.size() != sizeof acc_) throw std::runtime_error("a reduction's saved state has the wrong size");
    std::memcpy(&acc_, state.data(), sizeof acc_);
  }
  const Partial& result() const { return acc_; }

 private:
  Partial acc_{};
};

// Element-wise sums of a fixed number of doubles (a partial is `size` doubles; zeros are the
// identity): per-batch sums of a score, the gradient of a network's parameters.
class ElementwiseSums final : public Reduction {
 public:
  explicit ElementwiseSums(std::size_t size) : sums_(size, 0.0) {}
  std::unique_ptr<Reduction> empty() const override { return std::make_unique<ElementwiseSums>(sums_.size()); }
  void fold(std::uint64_t, const std::byte* partial) override {
    std::memcpy(sums_.data(), partial, sums_.size() * sizeof(double));
  }
  void merge(const Reduction& right) override {
    const auto& r = static_cast<const ElementwiseSums&>(right);
    for (std::size_t i = 0; i < sums_.size(); ++i) sums_[i] += r.sums_[i];
  }
  std::string save() const override {
    return std::string(reinterpret_cast<const char*>(sums_.data()), sums_.size() * sizeof(double));
  }
  void load(const std::string& state) override {
    if (state.size() != sums_.size() * sizeof(double)) throw std::runtime_error("a reduction's saved state has the wrong size");
    std::memcpy(sums_.data(), state.data(), state.size());
  }
  const std::vector<double>& sums() const { return sums_; }

 private:
  std::vector<double> sums_;
};

}  // namespace qstage::engine
