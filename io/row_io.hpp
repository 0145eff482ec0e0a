#pragma once
// Row I/O for the streaming engine: reading and writing whole rows of a dataset, in parallel
// where the file allows it.
//
// HDF5's data path runs on one thread (parallel HDF5 is not thread-safe), and one thread copies
// only 3-5 GB/s to or from the page cache (measured on the GPU machine) - a tenth of PCIe. When a
// dataset stores its rows as plain bytes (no filters, the native type, a contiguous layout or
// chunks spanning whole rows, storage already allocated), the byte ranges of a batch's rows are
// known from HDF5 (H5Dget_offset, H5Dget_chunk_info_by_coord) and are read or written with
// pread/pwrite from a small thread pool. Everything else (filters, conversions, MPI-IO writes,
// which must stay collective) goes through HDF5 as before. Each call returns when its I/O is
// done, so HDF5 never runs while raw I/O to the same file is in flight.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/h5.hpp"

namespace qstage::h5 {

// A fixed set of threads that run a batch of small jobs and block (no spinning) in between.
class IoPool {
 public:
  // Threads: QSTAGE_IO_THREADS if set, else min(8, hardware threads).
  static IoPool& shared();
  explicit IoPool(int threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;
  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs job(i) for every i in [0, n) on the pool and the calling thread; returns when all are
  // done and rethrows the first exception.
  void run(std::size_t n, const std::function<void(std::size_t)>& job);

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::vector<std::thread> workers_;
};

// A contiguous byte range in the file holding rows of a dataset.
struct Piece {
  std::uint64_t file_offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t buffer_offset = 0;
};

// Where a dataset's rows lie in its file, if it stores them as plain bytes; see the top.
class RowLocator {
 public:
  static std::optional<RowLocator> make(const Dataset& d);
  // Pieces of at most 16 MiB covering rows [row0, row0 + n).
  std::vector<Piece> pieces(std::uint64_t row0, std::uint64_t n) const;

 private:
  hid_t dataset_ = -1;
  std::uint64_t row_bytes_ = 0, chunk_rows_ = 0;  // chunk_rows_ == 0: contiguous layout
  std::uint64_t contiguous_offset_ = 0;
  std::uint64_t address(std::uint64_t chunk) const;
  mutable std::vector<std::uint64_t> chunk_address_;  // cached; 0: not looked up yet
};

// Reads rows of a dataset: in parallel when the layout allows, else through HDF5.
class RowReader {
 public:
  explicit RowReader(const Dataset& d);
  ~RowReader();
  void read(std::uint64_t row0, std::uint64_t n, void* buffer);
  bool parallel() const { return locator_.has_value(); }

 private:
  const Dataset& dataset_;
  std::optional<RowLocator> locator_;
  int fd_ = -1;
};

// Writes rows of a dataset: with pwrite from the I/O pool where the layout allows and the storage
// is allocated (DatasetCreate::early_allocation; MPI-IO always allocates early), else with HDF5
// (collective under MPI-IO). Under MPI-IO the pwrite path involves no other rank: each writes its
// own rows in place, and the file's MPI_File_sync (File::flush) makes them durable with the
// metadata. Call refresh() after the dataset's extent changed.
inline constexpr std::uint64_t kMaxCollectiveWriteBytes = std::uint64_t{1} << 30;

class RowWriter {
 public:
  // max_write_bytes: the most bytes of one collective HDF5 write (smaller in tests).
  explicit RowWriter(Dataset& d, std::uint64_t max_write_bytes = kMaxCollectiveWriteBytes);
  ~RowWriter();
  // Collective under MPI-IO when it goes through HDF5: every rank calls it, with the same
  // `most_rows`, the largest n any rank passes in this call (0 rows where a rank has none). The
  // rows go in HDF5 writes of at most max_write_bytes each, as many on every rank: OpenMPI's
  // two_phase component crashed on 2- and 4-rank writes of more than 2 GiB a rank (an int byte
  // count, we take it).
  void write(std::uint64_t row0, std::uint64_t n, const void* buffer, std::uint64_t most_rows);
  void refresh();
  bool parallel() const { return locator_.has_value(); }

 private:
  Dataset& dataset_;
  std::optional<RowLocator> locator_;
  int fd_ = -1;
  std::uint64_t max_write_bytes_;
};

// Rows kept in plain files outside HDF5, the files' rows one after the other in file order:
// the buckets an exchanged output leaves (engine/output_sinks.hpp), each file its bucket's rows
// as raw bytes. A later pass reads them in place instead of from a copy in HDF5.
struct RowFiles {
  std::vector<std::filesystem::path> paths;
  std::vector<std::uint64_t> rows;  // per file
  std::uint64_t row_bytes = 0;
  std::uint64_t total_rows() const;
};

// Reads rows of RowFiles with pread from the I/O pool.
class RowFilesReader {
 public:
  // Opens every file; throws CorruptInput naming a file whose size is not its rows' bytes.
  explicit RowFilesReader(const RowFiles& files);
  ~RowFilesReader();
  RowFilesReader(const RowFilesReader&) = delete;
  RowFilesReader& operator=(const RowFilesReader&) = delete;
  // Rows [row0, row0 + n) of the files taken as one table.
  void read(std::uint64_t row0, std::uint64_t n, void* buffer) const;

 private:
  const RowFiles& files_;
  std::vector<std::string> names_;  // the paths, for messages
  std::vector<int> fds_;
  std::vector<std::uint64_t> first_row_;  // per file, and the total at the end
};

// One chunk as it is stored, in a slot of a reader's buffer: this header, then `bytes` bytes.
struct StoredChunk {
  std::uint64_t bytes = 0;        // the chunk's stored (filtered) size
  std::uint32_t filter_mask = 0;  // HDF5's: bit k set means filter k was skipped for this chunk
  std::uint32_t reserved = 0;
};

// Reads the chunks of a chunked dataset whose chunks hold whole rows as they are stored (still
// filtered), with pread from the I/O pool, for a kernel that decodes them itself.
class StoredChunkReader {
 public:
  // Throws InputError if the dataset is not chunked or its chunks do not hold whole rows.
  explicit StoredChunkReader(const Dataset& d);
  ~StoredChunkReader();
  std::uint64_t chunk_rows() const { return chunk_rows_; }
  // Chunks [first, first + n), chunk k into buffer + k * slot_bytes (a StoredChunk header, then
  // the bytes). Throws CorruptInput naming the chunk if one is missing or does not fit its slot.
  void read(std::uint64_t first, std::uint64_t n, void* buffer, std::uint64_t slot_bytes);

 private:
  const Dataset& dataset_;
  std::uint64_t chunk_rows_ = 0;
  int fd_ = -1;
};

// The qsum64 (kernels/checksum.hpp) of a dataset's rows [0, rows), taken as rows [at, at + rows)
// of an output (a word's place in the sum is its place in the output: a segment's rows are
// summed where the merge puts them). Read in pieces of about 8 MiB. The words are 4 bytes wide,
// or 1 where the element size is not a multiple of 4, as every qsum64 qstage stores. A dataset of
// rank 0 is one row.
std::uint64_t qsum64_of_rows(const Dataset& d, std::uint64_t rows, std::uint64_t at = 0);
// The same over all its rows.
std::uint64_t qsum64_of(const Dataset& d);

// A dataset's checksum attribute against its data: qsum64 over its values, or stored_xxh64 (coded
// chunks) over its stored chunks in order; nullopt if it has neither (`qstage inspect --verify`).
struct ChecksumCheck {
  std::string attribute, recorded, computed;
  bool ok() const { return recorded == computed; }
};
std::optional<ChecksumCheck> recompute_checksum(const Dataset& d);

}  // namespace qstage::h5
