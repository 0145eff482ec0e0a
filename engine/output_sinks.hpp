#pragma once
// Where a pass's outputs go: one OutputSink per output, chosen by its OutputKind.
//
//   rows          RowsSink: one row per pass row, written by every rank into the open segment
//                 file (parallel HDF5) at the batch's rows; segments are merged at the end.
//   appended      RowsSink too, at rows the round's counts place: batch i's rows follow batch
//                 i-1's, so every rank learns the round's counts before it writes.
//   appended, exchanged  ExchangedSink: each round's rows go to their buckets' owning ranks
//                 (comm::Communicator's all-to-all-v), which keep them in a file per bucket; the
//                 owners write the output, bucket after bucket, at the end.
//   coded_chunks  CodedChunksSink: chunks coded on the device right after the kernel; rank 0
//                 spools the streams (the one place the codec meets the engine) and writes them
//                 into the output at the end.
//
// A sink does the same four things for each kind: move a batch's output off the device (on the
// compute thread), place a round's batches (collective), commit what the journal must know, and
// build its dataset in the staged output. The engine (stream_engine.cpp) only sequences them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/mpi.hpp"
#include "engine/journal.hpp"
#include "engine/pass.hpp"
#include "io/h5.hpp"

namespace qstage::kernels {
class ChunkCodec;
}
namespace qstage::h5 {
class ChunkSpool;
}
namespace qstage::comm {
class Communicator;
}

namespace qstage::engine::detail {

// One output's buffers in one slot of the pipeline.
struct SlotOutput {
  Buffer device, host;
  Buffer device_count, host_count;  // appended: the row count the kernel stores
  Buffer device_sum, host_sum;      // rows: the batch's qsum64, computed on the device
  std::uint64_t ready = 0;          // after the batch: rows (appended) or bytes (coded) in `host`
};

// The batches of one round, as every rank sees them.
struct Round {
  RowRange rows;                         // pass rows of the round
  std::vector<RowRange> batches;         // in batch order (rank order)
  int mine = -1;                         // this rank's batch in `batches`, -1 if none
};

// The segment file being written: every rows/appended output's rows since the last checkpoint.
class SegmentFile {
 public:
  explicit SegmentFile(const mpi::Comm& comm) : comm_(comm) {}
  bool open() const { return file_.id() >= 0; }
  void create(const std::filesystem::path& final_path);  // collective
  h5::File& file() { return file_; }
  const std::filesystem::path& temp() const { return temp_; }
  void close();  // collective: flushes (MPI_File_sync under MPI-IO; not while durability is deferred) and closes

 private:
  const mpi::Comm& comm_;
  h5::File file_;
  std::filesystem::path temp_;
};

class OutputSink {
 public:
  OutputSink(const OutputDecl& decl, std::size_t index) : decl_(decl), index_(index) {}
  virtual ~OutputSink() = default;
  const OutputDecl& decl() const { return decl_; }

  // Memory, per slot for a batch of `batch_rows` rows, and once per rank.
  virtual std::uint64_t device_bytes(std::uint64_t batch_rows) const = 0;
  virtual std::uint64_t host_bytes(std::uint64_t batch_rows) const = 0;
  virtual std::uint64_t fixed_device_bytes(BackendKind) const { return 0; }
  // Per slot besides the rows, on the device and again on the host (make_slot allocates them):
  // the kernel's row count (appended: one u64, exchanged: one per bucket) and the batch's
  // checksum (rows). The plan charges exactly these.
  std::uint64_t count_bytes() const;
  std::uint64_t sum_bytes() const;
  SlotOutput make_slot(Backend& backend, std::uint64_t batch_rows, const std::string& tag) const;
  virtual void prepare(Backend&) {}
  // The pointers the kernel sees: where it writes, and (appended) where it stores its count.
  void* kernel_output(SlotOutput& s) const { return s.device.data(); }
  std::uint64_t* kernel_count(SlotOutput& s) const { return s.device_count.as<std::uint64_t>(); }

  // Compute thread, once the kernel is queued on `stream`: brings the batch's output to s.host
  // (for the rows of `rows`). May synchronize `stream`.
  virtual void after_kernel(Backend& backend, Stream& stream, SlotOutput& s, const RowRange& rows) = 0;

  // Resume: continue from the journal's committed state.
  virtual void restore(const Journal& journal, const std::filesystem::path& work_dir, bool root) = 0;
  // Collective, every round: this output's rows of the round. Counts first (every rank gets
  // them), then the segment's datasets are written; what rank 0 needs goes into `record`.
  virtual bool in_segments() const { return false; }
  virtual std::uint64_t count(const SlotOutput& s, const RowRange& rows) const { return rows.size(); }
  virtual void open_segment(h5::File&) {}
  // The output rows the open segment holds (segment sinks).
  virtual RowRange segment_rows() const { return {}; }
  // Lets go of datasets in the segment or final file, before that file closes (collective).
  virtual void close_datasets() {}
  virtual void write_round(const Round& round, const std::vector<std::uint64_t>& counts, const SlotOutput* mine,
                           std::string& record) = 0;
  // Rank 0: this output's piece of one rank's record, at `off`; returns the offset after it.
  virtual std::size_t accept(const std::string& record, std::size_t off) = 0;
  // Collective, at a checkpoint: the state the journal records (the segment is closed already).
  virtual void commit(Journal& journal) = 0;
  // Rows in the output so far (rows: pass rows committed and written; appended: rows appended).
  virtual std::uint64_t rows_written() const = 0;
  // The qsum64 of the rows so far (rank 0's; rows and appended), or 0.
  virtual std::uint64_t checksum() const { return 0; }
  // Collective, at the end: the final dataset in `out` from the committed segments (segment
  // sinks), or nothing (coded chunks: write_serial, on rank 0 after `out` is closed).
  virtual void create_final(h5::File& out) {}
  virtual void copy_segment(h5::File& segment, const Segment& seg, Buffer& buffer, const mpi::Comm& comm) {}
  virtual void write_serial(const std::filesystem::path& file) {}
  // Collective, at the end, with the output open on every rank: what outputs not in segments
  // write into it on every rank (exchanged ones: the attributes naming their bucket files).
  // (`final_path`: where `out` will be once committed; it is still under its temporary name.)
  virtual bool writes_final() const { return false; }
  virtual void write_final(h5::File& out, const std::filesystem::path& final_path) {}
  virtual void report(OutputReport& r) const = 0;

 protected:
  // Rows a batch of `batch_rows` may leave (appended: max_rows_per_row each).
  std::uint64_t capacity(std::uint64_t batch_rows) const;
  // Appended outputs, after the kernel: its `counts` counts (summed), then that many rows, to the
  // slot's host buffer; s.ready = the rows.
  void bring_appended(Backend& backend, Stream& stream, SlotOutput& s, const RowRange& rows, std::size_t counts) const;

  const OutputDecl& decl_;
  std::size_t index_;
};

// Whether the pass has outputs exchanged between ranks (it then needs a comm::Communicator).
bool exchanges(const PassSpec& spec);
std::vector<std::unique_ptr<OutputSink>> make_sinks(const PassSpec& spec, const mpi::Comm& comm,
                                                    comm::Communicator* exchange);

}  // namespace qstage::engine::detail
