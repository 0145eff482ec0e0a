#include "io/row_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fmt/format.h>
#include <xxhash.h>
#include <mutex>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "kernels/checksum.hpp"

namespace qstage::h5 {

// ------------------------------------------------------------------------------ IoPool
// Every worker acknowledges every run, so no worker is ever still inside an old run when the
// next one starts.
struct IoPool::State {
  std::mutex mutex;
  std::condition_variable work_ready, work_done;
  const std::function<void(std::size_t)>* job = nullptr;
  std::size_t n = 0;
  std::atomic<std::size_t> next{0};
  std::uint64_t generation = 0;
  std::size_t finished = 0;  // workers done with the current generation
  bool quit = false;
  std::exception_ptr error;

  void drain(const std::function<void(std::size_t)>& f, std::size_t count) {
    for (std::size_t i = next++; i < count; i = next++) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
};

IoPool& IoPool::shared() {
  static IoPool pool([] {
    if (const char* env = std::getenv("QSTAGE_IO_THREADS")) return std::max(1, std::atoi(env));
    return std::max(1, std::min(8, static_cast<int>(std::thread::hardware_concurrency())));
  }());
  return pool;
}

IoPool::IoPool(int threads) : state_(std::make_unique<State>()) {
  for (int t = 1; t < threads; ++t)
    workers_.emplace_back([s = state_.get()] {
      std::uint64_t seen = 0;
      while (true) {
        const std::function<void(std::size_t)>* job;
        std::size_t n;
        {
          std::unique_lock lock(s->mutex);
          s->work_ready.wait(lock, [&] { return s->quit || s->generation != seen; });
          if (s->quit) return;
          seen = s->generation;
          job = s->job;
          n = s->n;
        }
        s->drain(*job, n);
        {
          std::lock_guard lock(s->mutex);
          ++s->finished;
        }
        s->work_done.notify_all();
      }
    });
}

IoPool::~IoPool() {
  {
    std::lock_guard lock(state_->mutex);
    state_->quit = true;
  }
  state_->work_ready.notify_all();
  for (auto& w : workers_) w.join();
}

void IoPool::run(std::size_t n, const std::function<void(std::size_t)>& job) {
  if (n == 0) return;
  State& s = *state_;
  if (n == 1 || workers_.empty()) {  // nothing to share
    s.next = 0;
    s.error = nullptr;
    s.drain(job, n);
    if (s.error) std::rethrow_exception(s.error);
    return;
  }
  {
    std::lock_guard lock(s.mutex);
    s.job = &job;
    s.n = n;
    s.next = 0;
    s.error = nullptr;
    s.finished = 0;
    ++s.generation;
  }
  s.work_ready.notify_all();
  s.drain(job, n);
  std::unique_lock lock(s.mutex);
  s.work_done.wait(lock, [&] { return s.finished == workers_.size(); });
  if (s.error) std::rethrow_exception(s.error);
}

// ------------------------------------------------------------------------------ RowLocator
namespace {

constexpr std::uint64_t kMaxPiece = 16u << 20;

struct ChunkNotAllocated {};

std::optional<DType> plain_dtype(hid_t dataset) {
  hid_t ftype = H5Dget_type(dataset);
  if (ftype < 0) return std::nullopt;
  auto dtype = dtype_of(ftype);
  bool same = false;
  if (dtype) {
    Id mtype = memory_type(*dtype);
    same = H5Tequal(ftype, mtype.get()) > 0;
  }
  H5Tclose(ftype);
  H5Eclear2(H5E_DEFAULT);
  return same ? dtype : std::nullopt;
}

}  // namespace

std::optional<RowLocator> RowLocator::make(const Dataset& d) {
  const Shape shape = d.shape();
  if (shape.empty() || !plain_dtype(d.id())) return std::nullopt;
  Id dcpl(H5Dget_create_plist(d.id()), H5Pclose);
  if (!dcpl.valid() || H5Pget_nfilters(dcpl.get()) != 0 || H5Pget_external_count(dcpl.get()) != 0) return std::nullopt;
  RowLocator loc;
  loc.dataset_ = d.id();
  loc.row_bytes_ = d.row_bytes();
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t offset = H5Dget_offset(d.id());
    H5Eclear2(H5E_DEFAULT);
    if (offset == HADDR_UNDEF) return std::nullopt;  // not allocated yet
    loc.contiguous_offset_ = offset;
    return loc;
  }
  if (layout != H5D_CHUNKED) return std::nullopt;
  const Shape chunk = d.chunk();
  for (size_t i = 1; i < shape.size(); ++i)
    if (chunk[i] != shape[i]) return std::nullopt;  // a chunk does not hold whole rows
  loc.chunk_rows_ = chunk[0];
  return loc;
}

std::uint64_t RowLocator::address(std::uint64_t c) const {
  if (c >= chunk_address_.size()) chunk_address_.resize(c + 1, 0);
  if (chunk_address_[c] == 0) {
    hsize_t offset[32] = {0};
    offset[0] = c * chunk_rows_;
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    const herr_t rc = H5Dget_chunk_info_by_coord(dataset_, offset, &mask, &addr, &size);
    H5Eclear2(H5E_DEFAULT);
    if (rc < 0 || addr == HADDR_UNDEF || addr == 0) throw ChunkNotAllocated{};
    chunk_address_[c] = addr;
  }
  return chunk_address_[c];
}

std::vector<Piece> RowLocator::pieces(std::uint64_t row0, std::uint64_t n) const {
  std::vector<Piece> raw;
  if (chunk_rows_ == 0) {
    raw.push_back({contiguous_offset_ + row0 * row_bytes_, n * row_bytes_, 0});
  } else {
    for (std::uint64_t r = row0; r < row0 + n;) {
      const std::uint64_t c = r / chunk_rows_, in_chunk = r - c * chunk_rows_;
      const std::uint64_t rows = std::min(chunk_rows_ - in_chunk, row0 + n - r);
      const Piece p{address(c) + in_chunk * row_bytes_, rows * row_bytes_, (r - row0) * row_bytes_};
      // Chunks allocated one after another form one piece.
      if (!raw.empty() && raw.back().file_offset + raw.back().bytes == p.file_offset &&
          raw.back().buffer_offset + raw.back().bytes == p.buffer_offset)
        raw.back().bytes += p.bytes;
      else
        raw.push_back(p);
      r += rows;
    }
  }
  std::vector<Piece> out;
  for (const auto& p : raw)
    for (std::uint64_t done = 0; done < p.bytes; done += kMaxPiece)
      out.push_back({p.file_offset + done, std::min(kMaxPiece, p.bytes - done), p.buffer_offset + done});
  return out;
}

// ------------------------------------------------------------------------------ readers, writers
namespace {

// A piece of one of several files.
struct FilePiece {
  int fd = -1;
  const std::string* file = nullptr;  // for messages
  Piece piece;
};

void transfer(const std::vector<FilePiece>& pieces, char* buffer, bool write) {
  IoPool::shared().run(pieces.size(), [&](std::size_t i) {
    const Piece& p = pieces[i].piece;
    const int fd = pieces[i].fd;
    const std::string& file = *pieces[i].file;
    std::uint64_t done = 0;
    while (done < p.bytes) {
      const auto off = static_cast<off_t>(p.file_offset + done);
      char* at = buffer + p.buffer_offset + done;
      const ssize_t k = write ? ::pwrite(fd, at, p.bytes - done, off) : ::pread(fd, at, p.bytes - done, off);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        throw RuntimeFailure(fmt::format("{} of {} bytes at offset {} of '{}' failed: {}", write ? "write" : "read",
                                         p.bytes - done, off, file, k == 0 ? "unexpected end of file" : std::strerror(errno)));
      done += static_cast<std::uint64_t>(k);
    }
  });
}

void transfer(int fd, const std::vector<Piece>& pieces, char* buffer, bool write, const std::string& file) {
  std::vector<FilePiece> all;
  all.reserve(pieces.size());
  for (const Piece& p : pieces) all.push_back({fd, &file, p});
  transfer(all, buffer, write);
}

}  // namespace

RowReader::RowReader(const Dataset& d) : dataset_(d), locator_(RowLocator::make(d)) {
  if (locator_) {
    fd_ = ::open(d.where().file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) locator_.reset();
  }
}

RowReader::~RowReader() {
  if (fd_ >= 0) ::close(fd_);
}

void RowReader::read(std::uint64_t row0, std::uint64_t n, void* buffer) {
  if (n == 0) return;
  if (locator_) {
    std::vector<Piece> pieces;
    try {
      pieces = locator_->pieces(row0, n);
    } catch (const ChunkNotAllocated&) {
      dataset_.read_rows(row0, n, buffer);  // unwritten chunks read as fill values through HDF5
      return;
    }
    transfer(fd_, pieces, static_cast<char*>(buffer), false, dataset_.where().file);
    return;
  }
  dataset_.read_rows(row0, n, buffer);
}

std::uint64_t RowFiles::total_rows() const {
  std::uint64_t n = 0;
  for (const std::uint64_t r : rows) n += r;
  return n;
}

RowFilesReader::RowFilesReader(const RowFiles& files) : files_(files) {
  if (files.rows.size() != files.paths.size()) throw std::logic_error("RowFiles: a row count per file");
  first_row_.push_back(0);
  try {
    for (std::size_t f = 0; f < files.paths.size(); ++f) {
      names_.push_back(files.paths[f].string());
      const std::string& path = names_.back();
      const int fd = files.rows[f] ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC) : -1;
      if (files.rows[f] && fd < 0)
        throw CorruptInput(fmt::format("cannot open '{}', which holds {} rows of an earlier pass: {}", path, files.rows[f],
                                       std::strerror(errno)));
      fds_.push_back(fd);
      if (fd >= 0) {
        struct stat st {};
        const std::uint64_t want = files.rows[f] * files.row_bytes;
        if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != want)
          throw CorruptInput(fmt::format("'{}' has {} bytes; expected {} ({} rows of {} bytes, as its pass recorded)", path,
                                         static_cast<std::uint64_t>(st.st_size), want, files.rows[f], files.row_bytes));
      }
      first_row_.push_back(first_row_.back() + files.rows[f]);
    }
  } catch (...) {  // (the files opened so far: no destructor runs)
    for (const int fd : fds_)
      if (fd >= 0) ::close(fd);
    throw;
  }
}

RowFilesReader::~RowFilesReader() {
  for (const int fd : fds_)
    if (fd >= 0) ::close(fd);
}

void RowFilesReader::read(std::uint64_t row0, std::uint64_t n, void* buffer) const {
  if (n == 0) return;
  if (row0 + n > first_row_.back())
    throw std::logic_error(fmt::format("rows [{}, {}) of files holding {}", row0, row0 + n, first_row_.back()));
  const std::uint64_t B = files_.row_bytes;
  std::vector<FilePiece> pieces;
  // The first file holding row0, then each file's share, in pieces of at most kMaxPiece bytes.
  auto f = static_cast<std::size_t>(std::upper_bound(first_row_.begin(), first_row_.end(), row0) - first_row_.begin()) - 1;
  for (std::uint64_t r = row0; r < row0 + n; ++f) {
    const std::uint64_t take = std::min(first_row_[f + 1], row0 + n) - r;
    if (take == 0) continue;
    for (std::uint64_t done = 0; done < take * B; done += kMaxPiece)
      pieces.push_back({fds_[f], &names_[f], {(r - first_row_[f]) * B + done, std::min(kMaxPiece, take * B - done), (r - row0) * B + done}});
    r += take;
  }
  transfer(pieces, static_cast<char*>(buffer), false);
}

RowWriter::RowWriter(Dataset& d, std::uint64_t max_write_bytes) : dataset_(d), max_write_bytes_(max_write_bytes) {
  // Under MPI-IO every rank must take the same path (the collective one needs them all): the
  // locator depends on the dataset alone, and a rank that cannot open the file fails loudly.
  locator_ = RowLocator::make(d);
  if (locator_) {
    fd_ = ::open(d.where().file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0 && d.parallel())
      throw RuntimeFailure(fmt::format("cannot open '{}' to write rows in place: {}", d.where().file, std::strerror(errno)));
    if (fd_ < 0) locator_.reset();
  }
}

RowWriter::~RowWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void RowWriter::refresh() {
  if (locator_) locator_ = RowLocator::make(dataset_);
}

void RowWriter::write(std::uint64_t row0, std::uint64_t n, const void* buffer, std::uint64_t most_rows) {
  if (n > most_rows) throw std::logic_error("RowWriter::write: more rows than the most any rank writes");
  if (locator_) {
    if (n == 0) return;
    try {
      transfer(fd_, locator_->pieces(row0, n), const_cast<char*>(static_cast<const char*>(buffer)), true,
               dataset_.where().file);
      return;
    } catch (const ChunkNotAllocated&) {
      // created without early allocation: let HDF5 allocate and write (MPI-IO always allocates early)
      if (dataset_.parallel()) throw std::logic_error("RowWriter: a chunk of a dataset under MPI-IO is not allocated");
    }
  }
  if (!dataset_.parallel()) {
    dataset_.write_rows(row0, n, buffer);
    return;
  }
  // (every rank takes the same number of calls: the pieces of the largest write)
  const std::uint64_t row_bytes = std::max<std::uint64_t>(dataset_.row_bytes(), 1);
  const std::uint64_t piece = std::max<std::uint64_t>(1, max_write_bytes_ / row_bytes);
  const std::uint64_t calls = std::max<std::uint64_t>(1, (most_rows + piece - 1) / piece);
  for (std::uint64_t i = 0; i < calls; ++i) {
    const std::uint64_t first = std::min(n, i * piece), rows = std::min(piece, n - first);
    dataset_.write_rows(row0 + first, rows, rows ? static_cast<const char*>(buffer) + first * row_bytes : nullptr);
  }
}

// ------------------------------------------------------------------------------ StoredChunkReader
StoredChunkReader::StoredChunkReader(const Dataset& d) : dataset_(d) {
  const Shape shape = d.shape(), chunk = d.chunk();
  const std::string name = d.where().object, file = d.where().file;
  if (chunk.empty())
    throw InputError(fmt::format("dataset '{}' in '{}' is not chunked; expected the chunked, compressed dataset a "
                                 "compress step writes",
                                 name, file));
  for (size_t i = 1; i < shape.size(); ++i)
    if (chunk[i] != shape[i])
      throw InputError(fmt::format("dataset '{}' in '{}' has chunks of [{}] that do not hold whole rows of [{}]; "
                                   "expected chunks spanning every axis but the first",
                                   name, file, fmt::join(chunk, ", "), fmt::join(shape, ", ")));
  chunk_rows_ = chunk[0];
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw RuntimeFailure(fmt::format("cannot open '{}' to read its chunks: {}", file, std::strerror(errno)));
}

StoredChunkReader::~StoredChunkReader() {
  if (fd_ >= 0) ::close(fd_);
}

void StoredChunkReader::read(std::uint64_t first, std::uint64_t n, void* buffer, std::uint64_t slot_bytes) {
  // Locate every chunk first (HDF5 calls stay on this thread), then read them in parallel.
  std::vector<Piece> pieces;
  auto* out = static_cast<char*>(buffer);
  const std::uint64_t rank = dataset_.shape().size();
  for (std::uint64_t k = 0; k < n; ++k) {
    hsize_t offset[32] = {0};
    offset[0] = (first + k) * chunk_rows_;
    StoredChunk head;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    const herr_t rc = rank ? H5Dget_chunk_info_by_coord(dataset_.id(), offset, &head.filter_mask, &addr, &size) : -1;
    H5Eclear2(H5E_DEFAULT);
    if (rc < 0 || addr == HADDR_UNDEF)
      throw CorruptInput(fmt::format("chunk {} (rows from {}) of dataset '{}' in '{}' was never written; expected "
                                   "every chunk of a compressed dataset to be stored",
                                   first + k, offset[0], dataset_.where().object, dataset_.where().file));
    head.bytes = size;
    if (sizeof head + size > slot_bytes)
      throw CorruptInput(fmt::format("chunk {} of dataset '{}' in '{}' is stored in {} bytes, more than a compressed "
                                   "chunk of its size can take ({}); expected a chunk written by qstage's codec",
                                   first + k, dataset_.where().object, dataset_.where().file, size,
                                   slot_bytes - sizeof head));
    std::memcpy(out + k * slot_bytes, &head, sizeof head);
    if (size) pieces.push_back({addr, size, k * slot_bytes + sizeof head});
  }
  transfer(fd_, pieces, out, false, dataset_.where().file);
}

std::uint64_t qsum64_of_rows(const Dataset& d, std::uint64_t rows, std::uint64_t at) {
  const auto dtype = d.dtype();
  if (!dtype) throw InputError(fmt::format("dataset has element type {}; expected one qstage writes", d.type_description()));
  const unsigned word = dtype_size(*dtype) % 4 == 0 ? 4 : 1;
  const h5::Shape shape = d.shape();
  std::uint64_t sum = 0;
  if (shape.empty()) {  // a scalar
    std::vector<char> value(dtype_size(*dtype));
    d.read_all(value.data());
    kernels::checksum_cpu({value.data(), value.size(), word, at * value.size() / word, &sum});
    return sum;
  }
  const std::uint64_t row_bytes = d.row_bytes();
  if (row_bytes == 0 || rows == 0) return 0;
  const std::uint64_t piece = std::max<std::uint64_t>(1, (std::uint64_t{8} << 20) / row_bytes);
  std::vector<char> buffer(std::min(piece, rows) * row_bytes);
  for (std::uint64_t r = 0; r < rows; r += piece) {
    const std::uint64_t n = std::min(piece, rows - r);
    d.read_rows(r, n, buffer.data());
    std::uint64_t part = 0;
    kernels::checksum_cpu({buffer.data(), n * row_bytes, word, (at + r) * row_bytes / word, &part});
    sum += part;  // wraps modulo 2^64
  }
  return sum;
}

std::uint64_t qsum64_of(const Dataset& d) {
  const h5::Shape shape = d.shape();
  return qsum64_of_rows(d, shape.empty() ? 1 : shape[0]);
}

std::optional<ChecksumCheck> recompute_checksum(const Dataset& d) {
  if (d.has_attribute("qsum64")) return ChecksumCheck{"qsum64", d.string_attribute("qsum64"), hex64(qsum64_of(d))};
  if (!d.has_attribute("stored_xxh64")) return std::nullopt;
  const Shape shape = d.shape(), chunk = d.chunk();
  const std::uint64_t chunks = shape.empty() || chunk.empty() ? 0 : (shape[0] + chunk[0] - 1) / chunk[0];
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, 0);
  try {
    for (std::uint64_t k = 0; k < chunks; ++k) {
      const std::vector<std::uint8_t> stored = d.read_stored_chunk(k);
      XXH64_update(hash, stored.data(), stored.size());
    }
  } catch (...) {
    XXH64_freeState(hash);
    throw;
  }
  const std::string digest = hex64(XXH64_digest(hash));
  XXH64_freeState(hash);
  return ChecksumCheck{"stored_xxh64", d.string_attribute("stored_xxh64"), digest};
}

}  // namespace qstage::h5
