#pragma once
// What a stage hands the streaming engine: a *pass* over a row space (axis 0 of its datasets).
//
// The engine cuts [0, rows) into batches of whole tiles, reads each batch's rows of every input
// into pinned host buffers, copies them to the device, calls PassKernel::process, computes the
// outputs' checksums on the device, copies outputs back and writes them to HDF5 - with reads,
// copies, compute and writes of different batches overlapped. Batches are spread over MPI ranks.
//
// Reductions across batches are deterministic: a kernel writes one partial per *tile* (a fixed
// block of tile_rows rows), and a Reduction folds the partials in tile order. Tile boundaries
// do not depend on the batch size or the rank count, so neither does the result.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/layout.hpp"
#include "io/codec/codec.hpp"
#include "io/h5.hpp"

namespace qstage::engine {

struct RowRange {
  std::uint64_t begin = 0, end = 0;
  std::uint64_t size() const { return end - begin; }
};

// A dataset read batch by batch (rows aligned with the pass's rows).
struct StreamedInput {
  std::string name;                      // the stage's slot name, for messages
  const h5::Dataset* dataset = nullptr;  // opened read-only by the runner
  std::uint64_t row_bytes = 0;
  // Read the dataset's chunks as they are stored (still compressed) instead of its values, for a
  // kernel that decodes them itself: the dataset's chunks must hold tile_rows whole rows, and
  // each tile of a batch gets a slot of tile_rows * row_bytes bytes holding a StoredChunk header
  // and then the chunk's bytes (h5::StoredChunkReader).
  bool stored_chunks = false;
};

// A dataset the pass writes batch by batch: layout.shape[0] == the pass's rows.
struct OutputDecl {
  std::string name;  // dataset path in the step's output file
  Layout layout;     // layout.chunk[0] must divide the pass's tile_rows
  // Written compressed (qstage's codec, HDF5 filter 32881; float32 and complex64 only) instead
  // of as values: the engine codes each chunk on the device right after the kernel, so only the
  // coded chunks leave it; rank 0 appends them to a spool in the work directory (durable at each
  // checkpoint) and writes them into the output at the end. Relative settings are fractions of
  // each chunk's value range (the whole output's is not known while it streams).
  std::optional<codec::Settings> codec;
  std::uint64_t row_bytes() const { return layout.row_bytes(); }
  bool compressed() const { return codec.has_value(); }
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
  // not copied): for results the host finishes, such as a compressed stream's framing.
  bool partials_on_host = false;
  // Each partial begins with a u64 count of the bytes after it that matter (a compressed stream
  // in a worst-case-sized partial): only those travel to rank 0, and fold() sees the same layout.
  bool sized_partials = false;
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
  std::vector<const void*> inputs;  // one per PassSpec::inputs, rows.size() rows each
  std::vector<const void*> host_inputs;  // the same bytes in (pinned) host memory, for the host's share
  std::vector<void*> outputs;       // one per PassSpec::outputs
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

// Folds per-tile partials in tile order on rank 0; its state is saved in the step's journal at
// every checkpoint, so a resumed pass continues the same fold.
//
// A fold whose state is too large for the journal (compressed chunks) keeps it in files of the
// step's work directory: attach() names the directory (every rank, before load), files() names
// the files so that a resume keeps them, and save() makes them durable and records how much of
// them is committed, so that a resumed fold first cuts off what an interrupted run added.
class Reduction {
 public:
  virtual ~Reduction() = default;
  virtual void fold(const std::byte* tile_partial) = 0;
  virtual std::string save() const = 0;            // bytes
  virtual void load(const std::string& state) = 0;
  virtual void attach(const std::filesystem::path& work_dir) {}
  virtual std::vector<std::string> files() const { return {}; }
};

}  // namespace qstage::engine
