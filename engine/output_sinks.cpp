#include "engine/output_sinks.hpp"
#include "engine/stream_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <stdexcept>

#include "core/fsutil.hpp"
#include "core/hash.hpp"
#include "comm/communicator.hpp"
#include "core/parallel.hpp"
#include "io/compressed_chunks.hpp"
#include "io/row_io.hpp"
#include "kernels/checksum.hpp"
#include "kernels/codec/chunk_codec.hpp"

namespace qstage::engine::detail {

namespace fs = std::filesystem;

// The attributes by which a complete pass's output file names an exchanged output's buckets.
constexpr const char* kBucketRows = ".bucket_rows";      // rows per bucket, in bucket order
constexpr const char* kRowBytes = ".row_bytes";
constexpr const char* kOutputIndex = ".output_index";    // the files' names: StepWork::bucket_file
constexpr const char* kBucketFolder = ".bucket_folder";  // relative to the output file's folder

namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return b ? (a + b - 1) / b : 0; }

unsigned word_bytes(h5::DType t) { return h5::dtype_size(t) % 4 == 0 ? 4 : 1; }

codec::ElementType element_type(const OutputDecl& out) {
  const auto type = h5::codec_element_type(out.layout.dtype);
  if (!type) throw std::logic_error("a coded_chunks output must be float32 or complex64");
  return *type;
}

// ------------------------------------------------------------------------------ RowsSink
// rows and appended outputs: written by every rank into the segment file, merged at the end.
class RowsSink final : public OutputSink {
 public:
  RowsSink(const OutputDecl& decl, std::size_t index, const mpi::Comm& comm) : OutputSink(decl, index), comm_(comm) {}

  bool appended() const { return decl_.kind == OutputKind::appended; }

  std::uint64_t device_bytes(std::uint64_t batch_rows) const override { return capacity(batch_rows) * decl_.row_bytes(); }
  std::uint64_t host_bytes(std::uint64_t batch_rows) const override { return capacity(batch_rows) * decl_.row_bytes(); }

  void after_kernel(Backend& backend, Stream& stream, SlotOutput& s, const RowRange& rows) override {
    const std::uint64_t row_bytes = decl_.row_bytes();
    if (!appended()) {
      const unsigned w = word_bytes(decl_.layout.dtype);
      kernels::checksum(stream, {s.device.data(), row_bytes * rows.size(), w, rows.begin * row_bytes / w,
                                 s.device_sum.as<std::uint64_t>()});
      backend.copy_to_host(s.host.data(), s.device.data(), row_bytes * rows.size(), stream);
      backend.copy_to_host(s.host_sum.data(), s.device_sum.data(), 8, stream);
      s.ready = rows.size();
      return;
    }
    bring_appended(backend, stream, s, rows, 1);
  }

  void restore(const Journal& journal, const fs::path&, bool) override {
    batch_counts_ = journal.appended.at(index_);
    written_ = appended() ? std::accumulate(batch_counts_.begin(), batch_counts_.end(), std::uint64_t{0})
                          : journal.committed_rows;
    sum_ = journal.checksums.at(index_);
    segment_first_ = written_;
  }

  bool in_segments() const override { return true; }
  std::uint64_t count(const SlotOutput& s, const RowRange& rows) const override { return appended() ? s.ready : rows.size(); }

  // Under MPI-IO, extent changes are collective: the segment's room doubles when a round needs
  // more (up to what the pass can write), so rounds cost a logarithmic number of collective
  // calls, and the segment gets its exact extent when it closes (close_datasets, at a commit).
  // Each rank writes its rows in place (h5::RowWriter). A serial segment grows round by round.
  // (Room for the whole pass at once was slower where every round commits: parallel HDF5
  // allocates and then prunes every chunk of the unused room.)
  void open_segment(h5::File& file) override {
    segment_first_ = written_;
    dataset_first_ = segment_first_;
    dataset_.reset();
    writer_.reset();
    capacity_ = 0;
    h5::Shape shape = decl_.layout.shape;
    shape[0] = 0;
    // Early allocation: chunks exist when the extent grows, so rows can be written in parallel.
    dataset_ = std::make_unique<h5::Dataset>(
        file.create_dataset(decl_.name, {{decl_.layout.dtype, shape, decl_.layout.chunk}, true, !file.parallel()}));
    writer_ = std::make_unique<h5::RowWriter>(*dataset_);
  }

  void write_round(const Round& round, const std::vector<std::uint64_t>& counts, const SlotOutput* mine,
                   std::string& record) override {
    std::uint64_t at = written_, mine_at = 0;
    for (std::size_t b = 0; b < counts.size(); ++b) {
      if (static_cast<int>(b) == round.mine) mine_at = at;
      at += counts[b];
    }
    reserve(at - segment_first_);
    const std::uint64_t most = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
    if (mine) {
      const std::uint64_t n = counts[static_cast<std::size_t>(round.mine)];
      writer_->write(mine_at - segment_first_, n, mine->host.data(), most);
      std::uint64_t sum = 0;
      if (appended()) {  // its place is known only now: the checksum is the host's
        const unsigned w = word_bytes(decl_.layout.dtype);
        kernels::checksum_cpu({mine->host.data(), n * decl_.row_bytes(), w, mine_at * decl_.row_bytes() / w, &sum});
      } else {
        std::memcpy(&sum, mine->host_sum.data(), 8);
      }
      record.append(reinterpret_cast<const char*>(&sum), 8);
    } else {
      writer_->write(0, 0, nullptr, most);
    }
    if (appended()) batch_counts_.insert(batch_counts_.end(), counts.begin(), counts.end());
    written_ = at;
  }

  std::size_t accept(const std::string& record, std::size_t off) override {
    std::uint64_t v;
    std::memcpy(&v, record.data() + off, 8);
    sum_ += v;  // wraps modulo 2^64
    return off + 8;
  }

  void close_datasets() override {
    writer_.reset();
    if (dataset_ && capacity_ != written_ - dataset_first_) dataset_->set_rows(written_ - dataset_first_);
    dataset_.reset();
  }

  void commit(Journal& journal) override {
    journal.checksums.at(index_) = sum_;
    journal.appended.at(index_) = appended() ? batch_counts_ : std::vector<std::uint64_t>{};
  }
  RowRange segment_rows() const override { return {segment_first_, written_}; }
  std::uint64_t rows_written() const override { return written_; }
  std::uint64_t checksum() const override { return sum_; }

  void create_final(h5::File& out) override {
    h5::Shape shape = decl_.layout.shape;
    shape[0] = written_;
    dataset_ = std::make_unique<h5::Dataset>(out.create_dataset(decl_.name, {{decl_.layout.dtype, shape, decl_.layout.chunk}, true, !out.parallel()}));
    dataset_first_ = 0;
    capacity_ = written_;
    writer_ = std::make_unique<h5::RowWriter>(*dataset_);
  }

  // Collective: the segment's rows of this output into the final dataset, in pieces dealt to
  // ranks round by round (each rank writes whole pieces).
  void copy_segment(h5::File& segment, const Segment& seg, Buffer& buffer, const mpi::Comm& comm) override {
    const RowRange rows = seg.output_rows.at(index_);
    const std::uint64_t piece = std::max<std::uint64_t>(1, buffer.size() / decl_.row_bytes());
    h5::Dataset src = segment.open_dataset(decl_.name);
    h5::RowReader reader(src);
    const std::uint64_t pieces = ceil_div(rows.size(), piece);
    const auto P = static_cast<std::uint64_t>(comm.size()), rank = static_cast<std::uint64_t>(comm.rank());
    for (std::uint64_t round = 0; round < ceil_div(pieces, P); ++round) {
      const std::uint64_t p = round * P + rank;
      if (p < pieces) {
        const std::uint64_t first = p * piece, n = std::min(piece, rows.size() - first);
        reader.read(first, n, buffer.data());
        writer_->write(rows.begin + first, n, buffer.data(), piece);
      } else {
        writer_->write(0, 0, nullptr, piece);
      }
    }
  }

  void report(OutputReport& r) const override {
    r.rows = written_;
    r.batch_rows = batch_counts_;
    r.checksum = hex64(sum_);
  }

 private:
  // Room for `rows` rows in the open segment: exactly (serial), or at least, doubling (MPI-IO).
  void reserve(std::uint64_t rows) {
    if (rows == capacity_ || (dataset_->parallel() && rows < capacity_)) return;
    const std::uint64_t room = decl_.layout.shape[0] - segment_first_;
    capacity_ = dataset_->parallel() ? std::min(room, std::max(rows, 2 * capacity_)) : rows;
    dataset_->set_rows(capacity_);
    writer_->refresh();
  }

  const mpi::Comm& comm_;
  std::uint64_t written_ = 0;        // output rows placed so far (every rank)
  std::uint64_t segment_first_ = 0;  // output row where the open segment starts
  std::uint64_t dataset_first_ = 0;  // output row of the open dataset's row 0 (segment or final)
  std::uint64_t capacity_ = 0;       // rows in the open dataset's extent
  std::uint64_t sum_ = 0;            // rank 0: qsum64 of the rows so far
  std::vector<std::uint64_t> batch_counts_;
  std::unique_ptr<h5::Dataset> dataset_;  // in the open segment, or the final output
  std::unique_ptr<h5::RowWriter> writer_;
};

// ------------------------------------------------------------------------------ CodedChunksSink
class CodedChunksSink final : public OutputSink {
 public:
  CodedChunksSink(const OutputDecl& decl, std::size_t index) : OutputSink(decl, index), type_(element_type(decl)) {}
  ~CodedChunksSink() override = default;

  std::uint64_t device_bytes(std::uint64_t batch_rows) const override { return batch_rows * decl_.row_bytes(); }
  // Per chunk a u64 size and at most the codec's worst case.
  std::uint64_t host_bytes(std::uint64_t batch_rows) const override {
    std::uint64_t elements = 1;
    for (auto d : decl_.layout.chunk) elements *= d;
    return ceil_div(batch_rows, decl_.layout.chunk[0]) * (8 + codec::max_stream_bytes(type_, elements, decl_.layout.chunk.size()));
  }
  std::uint64_t fixed_device_bytes(BackendKind kind) const override {
    return kernels::ChunkCodec::device_bytes(kind, type_, decl_.layout.chunk[0] * decl_.row_bytes());
  }
  void prepare(Backend& backend) override {
    codec_ = std::make_unique<kernels::ChunkCodec>(type_, decl_.layout.chunk, decl_.row_bytes());
    codec_->prepare(backend);
  }

  // Codes the batch's chunks into s.host: per chunk a u64 size and the stream. Synchronous: the
  // codec's framing is on the host.
  void after_kernel(Backend&, Stream& stream, SlotOutput& s, const RowRange& batch) override {
    const std::uint64_t chunk_rows = decl_.layout.chunk[0], row_bytes = decl_.row_bytes(), capacity = s.host.size();
    auto* host = s.host.as<char>();
    std::uint64_t at = 0;
    for (std::uint64_t first = batch.begin; first < batch.end; first += chunk_rows) {
      const std::uint64_t rows = std::min(chunk_rows, batch.end - first);
      const char* x = s.device.as<char>() + (first - batch.begin) * row_bytes;
      std::optional<double> range;
      if (decl_.codec->relative)  // the output's range, or the chunk's rows' (not its padding)
        range = decl_.codec_range ? *decl_.codec_range : codec_->value_range(stream, x, rows);
      const std::vector<std::uint8_t> coded = codec_->encode(stream, x, rows, *decl_.codec, range);
      const std::uint64_t size = coded.size();
      if (at + 8 + size > capacity) throw std::logic_error("a coded chunk exceeds the codec's worst case");
      std::memcpy(host + at, &size, 8);
      std::memcpy(host + at + 8, coded.data(), size);
      at += 8 + size;
    }
    s.ready = at;
  }

  void restore(const Journal& journal, const fs::path& work_dir, bool root) override {
    if (!root) return;
    const std::string file = fmt::format("output-{}.bin", index_);
    spool_ = std::make_unique<h5::ChunkSpool>(work_dir / file);
    for (const auto& record : journal.spools)
      if (record.output == decl_.name && record.file == file) spool_->restore(h5::ChunkSpool::State::deserialize(record.state));
  }

  void write_round(const Round&, const std::vector<std::uint64_t>&, const SlotOutput* mine, std::string& record) override {
    if (!mine) return;
    record.append(reinterpret_cast<const char*>(&mine->ready), 8);
    record.append(mine->host.as<char>(), mine->ready);
  }

  std::size_t accept(const std::string& record, std::size_t off) override {
    std::uint64_t length;
    std::memcpy(&length, record.data() + off, 8);
    off += 8;
    const std::size_t end = off + length;
    while (off < end) {
      std::uint64_t size;
      std::memcpy(&size, record.data() + off, 8);
      spool_->append(reinterpret_cast<const std::byte*>(record.data() + off + 8), size);
      off += 8 + size;
    }
    return end;
  }

  void commit(Journal& journal) override {
    if (!spool_) return;
    const std::string file = spool_->path().filename().string();
    const std::string state = spool_->commit().serialize();
    for (auto& record : journal.spools)
      if (record.output == decl_.name) {
        record = {decl_.name, file, state};
        return;
      }
    journal.spools.push_back({decl_.name, file, state});
  }
  std::uint64_t rows_written() const override { return decl_.layout.shape[0]; }

  // Rank 0: the dataset from the spool. Relative bounds of a known range are stored as the
  // absolute ones they are (the filter's cd_values say the same as the streams, so h5repack or
  // h5py rewriting the dataset keeps them); of each chunk's own range, as relative.
  void write_serial(const fs::path& file) override {
    const codec::Settings& s = *decl_.codec;
    const bool per_chunk = s.relative && !decl_.codec_range;
    const nlohmann::json summary = h5::codec_summary(s, decl_.codec_range, type_, per_chunk ? "chunk" : "");
    codec::Settings filter = s;
    if (s.relative && decl_.codec_range) {
      filter.relative = false;
      filter.threshold = summary.at("threshold").get<double>();
      filter.error = summary.at("error").get<double>();
    }
    h5::File out = h5::File::open(file, h5::Mode::read_write);  // serial: rank 0 alone
    digest_ = h5::write_compressed_dataset(out, decl_.name, decl_.layout, filter, summary, *spool_);
    out.flush();
    out.close();
  }

  void report(OutputReport& r) const override {
    r.rows = decl_.layout.shape[0];
    if (!spool_) return;
    r.stored_bytes = spool_->state().bytes;
    r.chunks = spool_->state().sizes.size();
    r.checksum = digest_;
  }

 private:
  codec::ElementType type_;
  std::unique_ptr<kernels::ChunkCodec> codec_;
  std::unique_ptr<h5::ChunkSpool> spool_;  // rank 0
  std::string digest_;                     // rank 0, once written
};

// ------------------------------------------------------------------------------ ExchangedSink
// appended outputs exchanged between ranks by bucket (OutputDecl::buckets): each round's rows go
// to their buckets' owners, which append them to a file per bucket in the work directory; the
// output is written at the end, bucket after bucket, by the owners in parallel.
class ExchangedSink final : public OutputSink {
 public:
  // `exchange` may be null for a sink that only sizes buffers (StreamEngine::plan).
  ExchangedSink(const OutputDecl& decl, std::size_t index, const mpi::Comm& comm, comm::Communicator* exchange)
      : OutputSink(decl, index), comm_(comm), exchange_(exchange), buckets_(decl.buckets) {}

  std::uint64_t device_bytes(std::uint64_t batch_rows) const override { return capacity(batch_rows) * decl_.row_bytes(); }
  std::uint64_t host_bytes(std::uint64_t batch_rows) const override { return capacity(batch_rows) * decl_.row_bytes(); }

  void after_kernel(Backend& backend, Stream& stream, SlotOutput& s, const RowRange& rows) override {
    bring_appended(backend, stream, s, rows, buckets_);
  }
  std::uint64_t count(const SlotOutput& s, const RowRange&) const override { return s.ready; }

  int owner(std::size_t bucket) const { return static_cast<int>(bucket % static_cast<std::size_t>(comm_.size())); }
  bool mine(std::size_t bucket) const { return owner(bucket) == comm_.rank(); }

  // Whoever owns a bucket now continues its file from the committed rows (the owner may have
  // changed with the rank count: the files are in the shared work directory).
  void restore(const Journal& journal, const fs::path& work_dir, bool) override {
    bucket_rows_ = journal.buckets.at(index_);
    bucket_rows_.resize(buckets_, 0);
    batch_counts_ = journal.appended.at(index_);
    dir_ = work_dir;
    files_.clear();
    files_.resize(buckets_);
    for (std::size_t b = 0; b < buckets_; ++b) {
      if (!mine(b)) continue;
      files_[b] = std::make_unique<h5::ChunkSpool>(work_dir / StepWork::bucket_file(index_, b));
      files_[b]->restore({bucket_rows_[b] * decl_.row_bytes(), {}});
    }
  }

  // Collective: the round's per-bucket counts everywhere, then the rows to their owners. A
  // rank's own buckets take its batch's rows straight from the slot; only the others' travel.
  void write_round(const Round& round, const std::vector<std::uint64_t>&, const SlotOutput* mine_slot,
                   std::string&) override {
    const std::size_t B = buckets_, n = round.batches.size();
    const auto P = static_cast<std::size_t>(comm_.size()), me = static_cast<std::size_t>(comm_.rank());
    const std::uint64_t row_bytes = decl_.row_bytes();
    std::vector<std::uint64_t> counts(n * B, 0);  // [batch][bucket], a one-hot sum = a gather
    if (mine_slot)
      std::memcpy(counts.data() + static_cast<std::size_t>(round.mine) * B, mine_slot->host_count.data(), 8 * B);
    counts = comm_.sum_wrapping(counts);

    // Where each bucket's rows start in my batch (bucket-major).
    std::vector<std::uint64_t> first(B + 1, 0);
    if (mine_slot) {
      const std::uint64_t* mine_counts = counts.data() + static_cast<std::size_t>(round.mine) * B;
      for (std::size_t b = 0; b < B; ++b) first[b + 1] = first[b] + mine_counts[b];
    }
    const auto* my_rows = mine_slot ? mine_slot->host.as<std::uint8_t>() : nullptr;
    // The others' rows, sent and received in reused buffers (on one rank, nothing travels).
    comm::Counts send_counts(P, 0), recv_counts(P, 0);
    if (P > 1) {
      send_.clear();
      if (mine_slot)
        for (std::size_t p = 0; p < P; ++p) {
          if (p == me) continue;
          for (std::size_t b = p; b < B; b += P) {
            const std::uint64_t bytes = (first[b + 1] - first[b]) * row_bytes;
            send_.insert(send_.end(), my_rows + first[b] * row_bytes, my_rows + first[b] * row_bytes + bytes);
            send_counts[p] += bytes;
          }
        }
      for (std::size_t i = 0; i < n; ++i) {
        if (static_cast<int>(i) == round.mine) continue;
        for (std::size_t b = me; b < B; b += P) recv_counts[i] += counts[i * B + b] * row_bytes;
      }
      recv_.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::uint64_t{0}));
      if (!exchange_) throw std::logic_error("an exchanged output needs the pass's communicator");
      exchange_->alltoallv(comm::HostSpan<const std::uint8_t>(send_.data(), send_.size()), send_counts,
                          comm::HostSpan<std::uint8_t>(recv_.data(), recv_.size()), recv_counts);
    }

    // Each of my buckets takes its rows in batch order (the senders' order). Where each batch's
    // rows of each bucket are, first; then the buckets' files take them on the host's threads
    // (one thread appended 5.8 GB of a sample sort's records at 3 GB/s, most of its pass).
    const comm::Counts from = comm::displacements(recv_counts);
    std::vector<std::uint64_t> offset(from.begin(), from.end());
    std::vector<std::size_t> mine;
    std::vector<const std::uint8_t*> rows_of;  // [my bucket][batch]
    for (std::size_t b = me; b < B; b += P) {
      mine.push_back(b);
      for (std::size_t i = 0; i < n; ++i) {
        const bool own = static_cast<int>(i) == round.mine;
        rows_of.push_back(own ? my_rows + first[b] * row_bytes : recv_.data() + offset[i]);
        if (!own) offset[i] += counts[i * B + b] * row_bytes;
      }
    }
    parallel_for(static_cast<std::int64_t>(mine.size()), [&](std::int64_t k) {
      const std::size_t b = mine[static_cast<std::size_t>(k)];
      for (std::size_t i = 0; i < n; ++i)
        if (const std::uint64_t bytes = counts[i * B + b] * row_bytes)
          files_[b]->append(reinterpret_cast<const std::byte*>(rows_of[static_cast<std::size_t>(k) * n + i]), bytes);
    });
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t total = 0;
      for (std::size_t b = 0; b < B; ++b) {
        bucket_rows_[b] += counts[i * B + b];
        total += counts[i * B + b];
      }
      batch_counts_.push_back(total);
    }
  }
  std::size_t accept(const std::string&, std::size_t off) override { return off; }

  void commit(Journal& journal) override {
    for (auto& f : files_)
      if (f) f->commit();
    journal.buckets.at(index_) = bucket_rows_;
    journal.appended.at(index_) = batch_counts_;
  }
  std::uint64_t rows_written() const override {
    return std::accumulate(bucket_rows_.begin(), bucket_rows_.end(), std::uint64_t{0});
  }

  // Collective: the buckets stay in the files the exchange wrote, and the output names them (a
  // later pass of the step reads them in place: exchanged_output()). Nothing is copied into HDF5.
  void write_final(h5::File& out, const fs::path& final_path) override {
    out.set_attribute(decl_.name + kBucketRows, bucket_rows_);
    out.set_attribute(decl_.name + kRowBytes, decl_.row_bytes());
    out.set_attribute(decl_.name + kOutputIndex, static_cast<std::uint64_t>(index_));
    out.set_attribute(decl_.name + kBucketFolder,
                      fs::relative(fs::absolute(dir_), fs::absolute(final_path).parent_path()).string());
  }
  bool writes_final() const override { return true; }

  void report(OutputReport& r) const override {
    r.rows = rows_written();
    r.batch_rows = batch_counts_;
    r.bucket_rows = bucket_rows_;
  }

 private:
  const mpi::Comm& comm_;
  comm::Communicator* exchange_;
  std::size_t buckets_;
  std::vector<std::uint64_t> bucket_rows_;  // every rank: committed and placed rows per bucket
  std::vector<std::uint64_t> batch_counts_;
  std::vector<std::unique_ptr<h5::ChunkSpool>> files_;  // the buckets this rank owns
  fs::path dir_;                                        // where they are (the pass's work folder)
  std::vector<std::uint8_t> send_, recv_;               // the exchange's buffers, reused every round
};

}  // namespace

std::uint64_t OutputSink::capacity(std::uint64_t batch_rows) const {
  return decl_.kind == OutputKind::appended ? batch_rows * decl_.max_rows_per_row : batch_rows;
}

// The count decides how much to copy: wait for it (this slot's stream only), then copy the rows.
void OutputSink::bring_appended(Backend& backend, Stream& stream, SlotOutput& s, const RowRange& rows,
                                std::size_t counts) const {
  backend.copy_to_host(s.host_count.data(), s.device_count.data(), 8 * counts, stream);
  stream.synchronize();
  const auto* c = s.host_count.as<std::uint64_t>();
  const std::uint64_t n = std::accumulate(c, c + counts, std::uint64_t{0});
  if (n > capacity(rows.size()))
    throw std::logic_error(fmt::format("a batch appended {} rows to '{}', more than the {} it may ({} per row)", n,
                                       decl_.name, capacity(rows.size()), decl_.max_rows_per_row));
  backend.copy_to_host(s.host.data(), s.device.data(), n * decl_.row_bytes(), stream);
  s.ready = n;
}

void SegmentFile::create(const fs::path& final_path) {
  temp_ = fsutil::temp_path(final_path);
  file_ = h5::File::create(temp_, comm_.get());
}

void SegmentFile::close() {
  // (under MPI-IO a flush is an MPI_File_sync: paid at a commit, not at a pass's end between them,
  // where the runner's commit point syncs the file system instead; fsutil::DeferredDurability)
  if (!fsutil::durability_deferred()) file_.flush();
  file_.close();
}

std::uint64_t OutputSink::count_bytes() const {
  return decl_.kind == OutputKind::appended ? 8 * std::max<std::uint64_t>(1, decl_.buckets) : 0;
}
std::uint64_t OutputSink::sum_bytes() const { return decl_.kind == OutputKind::rows ? 8 : 0; }

SlotOutput OutputSink::make_slot(Backend& backend, std::uint64_t batch_rows, const std::string& tag) const {
  SlotOutput s;
  const std::string what = tag + " output " + decl_.name;
  s.device = backend.alloc_device(device_bytes(batch_rows), what);
  s.host = backend.alloc_host(host_bytes(batch_rows), what);
  if (const std::uint64_t bytes = count_bytes()) {
    s.device_count = backend.alloc_device(bytes, what + " count");
    s.host_count = backend.alloc_host(bytes, what + " count");
  }
  if (const std::uint64_t bytes = sum_bytes()) {
    s.device_sum = backend.alloc_device(bytes, what + " checksum");
    s.host_sum = backend.alloc_host(bytes, what + " checksum");
  }
  return s;
}

bool exchanges(const PassSpec& spec) {
  return std::any_of(spec.outputs.begin(), spec.outputs.end(), [](const OutputDecl& o) { return o.buckets > 0; });
}

std::vector<std::unique_ptr<OutputSink>> make_sinks(const PassSpec& spec, const mpi::Comm& comm,
                                                    comm::Communicator* exchange) {
  std::vector<std::unique_ptr<OutputSink>> sinks;
  for (std::size_t o = 0; o < spec.outputs.size(); ++o) {
    const OutputDecl& out = spec.outputs[o];
    if (out.kind == OutputKind::coded_chunks) {
      sinks.push_back(std::make_unique<CodedChunksSink>(out, o));
    } else if (out.buckets > 0) {
      if (out.kind != OutputKind::appended) throw std::logic_error("only appended outputs are exchanged by bucket");
      sinks.push_back(std::make_unique<ExchangedSink>(out, o, comm, exchange));
    } else {
      sinks.push_back(std::make_unique<RowsSink>(out, o, comm));
    }
  }
  return sinks;
}

}  // namespace qstage::engine::detail

namespace qstage::engine {

std::optional<h5::RowFiles> exchanged_output(const h5::File& output, const std::string& name) {
  namespace fs = std::filesystem;
  using namespace detail;
  if (!output.has_attribute(name + kBucketRows)) return std::nullopt;
  h5::RowFiles files;
  files.rows = output.uint64s_attribute(name + kBucketRows);
  files.row_bytes = output.uint64s_attribute(name + kRowBytes).at(0);
  const std::size_t index = output.uint64s_attribute(name + kOutputIndex).at(0);
  const fs::path folder = fs::absolute(output.path()).parent_path() / output.string_attribute(name + kBucketFolder);
  for (std::size_t b = 0; b < files.rows.size(); ++b) files.paths.push_back(folder / StepWork::bucket_file(index, b));
  return files;
}

}  // namespace qstage::engine
