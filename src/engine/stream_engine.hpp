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
#include <map>
#include <optional>

#include "backend/backend.hpp"
#include "core/mpi.hpp"
#include "engine/journal.hpp"
#include "engine/pass.hpp"

namespace qstage::engine {

struct EngineOptions {
  int slots = 3;
  std::optional<double> checkpoint_seconds = 120.0;  // nullopt: never; 0: after every round
  std::uint64_t max_batch_bytes = 512ull << 20;       // cap on one batch's in+out bytes
  std::uint64_t max_batch_rows = 0;                   // 0: no cap (tests use it to force many batches)
};

struct BatchPlan {
  std::uint64_t batch_rows = 0;
  std::uint64_t device_bytes = 0;  // predicted peak device memory of the pass
  std::uint64_t host_bytes = 0;    // predicted peak host (pinned) memory of the pass
};

struct PhaseTimes {
  double read = 0, h2d = 0, compute = 0, d2h = 0, write = 0;  // summed over this rank's batches
  double setup = 0;  // resident data (prepare) and the slots' buffers (pinning is slow)
  double loop = 0;   // the batch loop: reads, compute, writes, checkpoints
  double commit = 0, finalize = 0, wall = 0;
};

struct PassOutcome {
  bool complete = false;      // false: stopped early, progress committed
  Journal journal;            // committed state (every rank has it after completion)
  PhaseTimes times;           // this rank, this run
  BatchPlan plan;
  std::uint64_t rows_run = 0;     // rows processed in this run (all ranks)
  std::uint64_t resumed_from = 0; // committed rows found at the start
  // Rank 0: the XXH64 of each compressed output's stored bytes, as hex (its manifest checksum).
  std::map<std::string, std::string> stored_checksums;
};

// Called on every rank with the same arguments, while the output file is still under its
// temporary name: writes provenance attributes and small result datasets. Compressed outputs
// (OutputDecl::codec) exist by then.
using Annotate = std::function<void(class h5::File& output, const Journal& final_state)>;

// Called on rank 0 alone after every rank has closed the output, still under its temporary
// name: serial additions that parallel HDF5 cannot make from several ranks, such as datasets of
// directly written (compressed) chunks.
using FinishOutput = std::function<void(const std::filesystem::path& temp_output)>;

// Receives progress on rank 0 after every round.
using ProgressFn = std::function<void(std::uint64_t rows_done, std::uint64_t rows_total)>;

class StreamEngine {
 public:
  StreamEngine(Backend& backend, const mpi::Comm& comm, EngineOptions options);

  // Chooses the batch size: the largest whole number of tiles whose slots fit both budgets.
  // Throws InputError naming the budget and the minimum it needs if not even one tile fits.
  BatchPlan plan(const PassSpec& spec) const;

  // Runs the rows not yet committed in `work`'s journal. On completion, builds `output` (via a
  // temporary name), lets `annotate` decorate it, and commits it. Collective.
  PassOutcome run(const PassSpec& spec, PassKernel& kernel, Reduction* reduction, StepWork& work,
                  const std::filesystem::path& output, const Annotate& annotate, const ProgressFn& progress,
                  const FinishOutput& finish_output = {});

 private:
  Backend& backend_;
  const mpi::Comm& comm_;
  EngineOptions options_;
};

}  // namespace qstage::engine
