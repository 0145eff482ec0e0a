#pragma once
// The streaming engine: runs a PassSpec over datasets larger than device memory.
//
// Per rank, a pipeline of `slots` (>= 2) buffer sets, each {pinned host in/out buffers, device
// in/out buffers, a Stream}. The main thread does all HDF5 and MPI calls (parallel HDF5 is not
// thread-safe): it reads batch i+1.. into free slots while a compute thread enqueues
// copy-in / kernel / checksum / copy-out for batch i on that slot's stream, and it writes batch
// i-1's outputs. On cuda, the slots' streams overlap copies with compute; on cpu the compute
// thread overlaps with the main thread's HDF5 I/O.
//
// Batches are dealt to ranks in rounds (round j: batches jP .. jP+P-1). After each round all
// ranks agree whether to stop (a signal anywhere) or checkpoint (interval elapsed on rank 0).
// A checkpoint closes the current *segment* file, makes it durable, and updates the journal; the
// final output is built from the segments at the end (or is the one segment, renamed).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "backend/backend.hpp"
#include "core/mpi.hpp"
#include "engine/journal.hpp"
#include "engine/pass.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"

namespace qstage::engine {

struct EngineOptions {
  int slots = 3;
  std::optional<double> checkpoint_seconds = 120.0;  // nullopt: never; 0: after every round
  std::uint64_t max_batch_bytes = 512ull << 20;       // cap on one batch's in+out bytes
  std::uint64_t max_batch_rows = 0;                   // 0: no cap (tests use it to force many batches)
};

// A size class: n rounded up to one of 8 steps per power of two (at most 1/8 more). A slot's
// buffers are sized for the class of their rows when the budgets allow it, so that passes of
// about the same size (sci.solve's, a few percent larger each iteration) ask the backend's
// pools for the same bytes, which the pools then hand back without pinning anew.
std::uint64_t size_class(std::uint64_t n);

struct BatchPlan {
  std::uint64_t batch_rows = 0;
  // Rows each slot's buffers hold: the batch's size class where the budgets allow it (passes of
  // about the same size then take the same bytes, which the pools hand back), else batch_rows.
  std::uint64_t buffer_rows = 0;
  bool size_classes = false;  // (row_ranges inputs' buffers too)
  std::uint64_t device_bytes = 0;  // predicted peak device memory of the pass
  std::uint64_t host_bytes = 0;    // predicted peak host (pinned) memory of the pass
};

struct PhaseTimes {
  double read = 0, h2d = 0, compute = 0, d2h = 0, write = 0;  // summed over this rank's batches
  double setup = 0;  // resident data (prepare) and the slots' buffers (pinning is slow)
  double prepare = 0;  // of setup: the kernel's resident data
  double loop = 0;   // the batch loop: reads, compute, writes, checkpoints
  double commit = 0, finalize = 0, wall = 0;
};

// A complete pass's output file, closed under its temporary name: the caller annotates it
// (open() on every rank) and then commits it (commit() on every rank). The engine calls no one
// back; the runner adds provenance and the stage's small results between the two.
class StagedOutput {
 public:
  StagedOutput() = default;
  StagedOutput(std::filesystem::path temp, std::filesystem::path final_path, const mpi::Comm& comm)
      : temp_(std::move(temp)), final_(std::move(final_path)), comm_(&comm) {}
  bool empty() const { return comm_ == nullptr; }
  const std::filesystem::path& temp() const { return temp_; }
  // Collective: the file opened read-write on every rank.
  h5::File open() const;
  // Collective: rank 0 renames it into place (durably), once every rank has closed it.
  void commit() const;

 private:
  std::filesystem::path temp_, final_;
  const mpi::Comm* comm_ = nullptr;
};

struct PassOutcome {
  bool complete = false;      // false: stopped early, progress committed
  Journal journal;            // committed state (every rank has it after completion)
  PhaseTimes times;           // this rank, this run
  BatchPlan plan;
  std::uint64_t rows_run = 0;     // rows processed in this run (all ranks)
  std::uint64_t resumed_from = 0; // committed rows found at the start
  double earlier_wall_seconds = 0;  // the pass's wall time in earlier runs (its journal's, at the start)
  StagedOutput staged;            // complete: the output, to annotate and commit
  std::vector<OutputReport> outputs;  // complete: per output (rank 0's checksums of coded ones)
};

// Receives progress on rank 0 after every round.
using ProgressFn = std::function<void(std::uint64_t rows_done, std::uint64_t rows_total)>;

// An exchanged output (OutputDecl::buckets) of a complete pass is not copied into the pass's
// HDF5 file: its buckets stay in the files the exchange wrote, in the pass's work folder, and the
// file names them in attributes ("<name>.bucket_rows", ".row_bytes", ".output_index",
// ".bucket_folder"). A later pass streams them in place (StreamedInput::files). nullopt if the
// file holds no such output of that name.
std::optional<h5::RowFiles> exchanged_output(const h5::File& output, const std::string& name);

class StreamEngine {
 public:
  StreamEngine(Backend& backend, const mpi::Comm& comm, EngineOptions options);

  // Chooses the batch size: the largest whole number of tiles whose slots fit both budgets.
  // Throws InputError naming the budget and the minimum it needs if not even one tile fits.
  BatchPlan plan(const PassSpec& spec) const;

  // Runs the rows not yet committed in `work`'s journal. On completion, builds the output that
  // becomes `output` once the caller commits the staged file (PassOutcome::staged). Collective.
  PassOutcome run(const PassSpec& spec, PassKernel& kernel, Reduction* reduction, StepWork& work,
                  const std::filesystem::path& output, const ProgressFn& progress);

 private:
  Backend& backend_;
  const mpi::Comm& comm_;
  EngineOptions options_;
};

}  // namespace qstage::engine
