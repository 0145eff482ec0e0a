#include "engine/stream_engine.hpp"

#include "engine/partition.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/signals.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"
#include "kernels/checksum.hpp"
#include "kernels/chunk_codec.hpp"

namespace qstage::engine {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::uint64_t PassSpec::progress_bytes_per_row() const {
  std::uint64_t n = 0;
  for (const auto& in : inputs) n += in.row_bytes;
  for (const auto& out : outputs) n += out.row_bytes();
  return n;
}

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return b ? (a + b - 1) / b : 0; }

unsigned word_bytes(h5::DType t) { return h5::dtype_size(t) % 4 == 0 ? 4 : 1; }

std::uint64_t device_partial_bytes(const PassSpec& s) { return s.partials_on_host ? 0 : s.tile_partial_bytes; }

codec::ElementType element_type(const OutputDecl& out) {
  const auto type = h5::codec_element_type(out.layout.dtype);
  if (!type) throw std::logic_error("a compressed output must be float32 or complex64");
  return *type;
}

// Host bytes for the coded chunks of `rows` rows of a compressed output (rows: whole chunks
// but for the pass's last): per chunk a u64 size and at most the codec's worst case.
std::uint64_t stream_bytes(const OutputDecl& out, std::uint64_t rows) {
  std::uint64_t elements = 1;
  for (auto d : out.layout.chunk) elements *= d;
  return ceil_div(rows, out.layout.chunk[0]) * (8 + codec::max_stream_bytes(element_type(out), elements, out.layout.chunk.size()));
}

// Device memory a compressed output's ChunkCodec takes (once per rank, not per slot).
std::uint64_t codec_device_bytes(const OutputDecl& out, BackendKind kind) {
  return kernels::ChunkCodec::device_bytes(kind, element_type(out), out.layout.chunk[0] * out.row_bytes());
}

struct PerBatchBytes {
  std::uint64_t in_per_row = 0, out_per_row = 0, device_per_tile = 0, host_per_tile = 0, fixed_per_slot = 0;
  std::uint64_t fixed_device = 0;  // compressed outputs' codecs
};

// Per tile: the device holds every output's rows; the host holds plain outputs' rows and
// compressed outputs' coded chunks.
PerBatchBytes per_batch_bytes(const PassSpec& s, std::uint64_t unit_rows, BackendKind kind) {
  PerBatchBytes b;
  std::uint64_t host_out = 0;
  for (const auto& in : s.inputs) b.in_per_row += in.row_bytes;
  for (const auto& out : s.outputs) b.out_per_row += out.row_bytes();
  for (const auto& out : s.outputs) {
    host_out += out.compressed() ? stream_bytes(out, unit_rows) : unit_rows * out.row_bytes();
    if (out.compressed()) b.fixed_device += codec_device_bytes(out, kind);
  }
  const std::uint64_t row = b.in_per_row + b.out_per_row;
  b.device_per_tile = unit_rows * (row + s.scratch_device_bytes_per_row) + device_partial_bytes(s);
  b.host_per_tile = unit_rows * b.in_per_row + host_out + s.tile_partial_bytes;
  b.fixed_per_slot = 8 * s.outputs.size();  // the outputs' checksums
  return b;
}

bool has_plain_outputs(const PassSpec& s) {
  return std::any_of(s.outputs.begin(), s.outputs.end(), [](const OutputDecl& o) { return !o.compressed(); });
}

// ------------------------------------------------------------------------------ Pipeline
// The slots and the compute thread of one rank.
class Pipeline {
 public:
  struct Slot {
    enum class State { free, loaded, enqueued };
    State state = State::free;
    std::uint64_t local = 0;  // this rank's batch number
    std::uint64_t index = 0;  // global batch number
    RowRange rows;
    std::vector<Buffer> host_in, dev_in, host_out, dev_out;
    std::vector<std::uint64_t> coded_bytes;  // per output: bytes of coded chunks in host_out (compressed ones)
    Buffer scratch, dev_partials, host_partials, dev_sums, host_sums;
    std::unique_ptr<Stream> stream;
  };

  Pipeline(Backend& backend, const PassSpec& spec, std::uint64_t batch_rows, int slots, PassKernel& kernel)
      : backend_(backend), spec_(spec), kernel_(kernel), slots_(static_cast<size_t>(slots)) {
    const std::uint64_t tiles = spec.batches.empty() ? ceil_div(batch_rows, spec.tile_rows) : 1;
    int n = 0;
    for (auto& s : slots_) {
      const std::string tag = fmt::format("slot {}", n++);
      for (const auto& in : spec.inputs) {
        s.host_in.push_back(backend.alloc_host(in.row_bytes * batch_rows, tag + " input " + in.name));
        s.dev_in.push_back(backend.alloc_device(in.row_bytes * batch_rows, tag + " input " + in.name));
      }
      for (const auto& out : spec.outputs) {
        // A compressed output's host buffer holds its coded chunks, each a u64 size and a stream.
        const std::uint64_t host = out.compressed() ? stream_bytes(out, batch_rows) : out.row_bytes() * batch_rows;
        s.host_out.push_back(backend.alloc_host(host, tag + " output " + out.name));
        s.dev_out.push_back(backend.alloc_device(out.row_bytes() * batch_rows, tag + " output " + out.name));
      }
      s.coded_bytes.assign(spec.outputs.size(), 0);
      if (spec.scratch_device_bytes_per_row)
        s.scratch = backend.alloc_device(spec.scratch_device_bytes_per_row * batch_rows, tag + " scratch");
      if (spec.tile_partial_bytes) {
        if (!spec.partials_on_host) s.dev_partials = backend.alloc_device(tiles * spec.tile_partial_bytes, tag + " partials");
        s.host_partials = backend.alloc_host(tiles * spec.tile_partial_bytes, tag + " partials");
      }
      if (!spec.outputs.empty()) {
        s.dev_sums = backend.alloc_device(8 * spec.outputs.size(), tag + " checksums");
        s.host_sums = backend.alloc_host(8 * spec.outputs.size(), tag + " checksums");
      }
      s.stream = backend.make_stream(spec.uses_blas);
    }
    for (const auto& out : spec.outputs) {  // one codec per compressed output: batches code in turn
      codecs_.push_back(nullptr);
      if (!out.compressed()) continue;
      codecs_.back() = std::make_unique<kernels::ChunkCodec>(element_type(out), out.layout.chunk, out.row_bytes());
      codecs_.back()->prepare(backend);
    }
  }

  ~Pipeline() { stop(); }

  size_t size() const { return slots_.size(); }
  Slot& slot_of(std::uint64_t local) { return slots_[local % slots_.size()]; }

  void start(std::uint64_t my_batches) {
    my_batches_ = my_batches;
    thread_ = std::thread([this] { compute_loop(); });
  }

  // Joins the compute thread and waits for the device work it enqueued.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      abort_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& s : slots_)
      if (s.stream) try { s.stream->synchronize(); } catch (...) {}
  }

  void mark_loaded(Slot& s, std::uint64_t local) {
    {
      std::lock_guard lock(mutex_);
      s.local = local;
      s.state = Slot::State::loaded;
    }
    cv_.notify_all();
  }

  // Blocks until the slot's batch is computed and copied back; adds its phase times.
  void wait_done(Slot& s, PhaseTimes& t) {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return s.state == Slot::State::enqueued || error_; });
      if (error_) std::rethrow_exception(error_);
    }
    s.stream->synchronize();
    t.h2d += s.stream->seconds_between(0, 1);
    t.compute += s.stream->seconds_between(1, 2);
    t.d2h += s.stream->seconds_between(2, 3);
  }

  void release(Slot& s) {
    std::lock_guard lock(mutex_);
    s.state = Slot::State::free;
  }

 private:
  void compute_loop() {
    try {
      backend_.bind_thread();
      for (std::uint64_t i = 0; i < my_batches_; ++i) {
        Slot& s = slot_of(i);
        {
          std::unique_lock lock(mutex_);
          cv_.wait(lock, [&] { return abort_ || (s.state == Slot::State::loaded && s.local == i); });
          if (abort_) return;
        }
        enqueue(s);
        {
          std::lock_guard lock(mutex_);
          s.state = Slot::State::enqueued;
        }
        cv_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        error_ = std::current_exception();
      }
      cv_.notify_all();
    }
  }

  void enqueue(Slot& s) {
    Stream& st = *s.stream;
    const std::uint64_t n = s.rows.size();
    st.mark(0);
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      if (spec_.inputs[i].stored_chunks) {
        copy_stored_chunks(s, i, ceil_div(n, spec_.tile_rows));
        continue;
      }
      backend_.copy_to_device(s.dev_in[i].data(), s.host_in[i].data(), spec_.inputs[i].row_bytes * n, st);
    }
    st.mark(1);
    BatchView view;
    view.index = s.index;
    view.rows = s.rows;
    for (auto& b : s.dev_in) view.inputs.push_back(b.data());
    for (auto& b : s.host_in) view.host_inputs.push_back(b.data());
    for (auto& b : s.dev_out) view.outputs.push_back(b.data());
    view.scratch = s.scratch.data();
    view.partials = spec_.partials_on_host ? s.host_partials.data() : s.dev_partials.data();
    view.stream = &st;
    kernel_.process(view);
    for (size_t o = 0; o < spec_.outputs.size(); ++o) {
      const auto& out = spec_.outputs[o];
      if (out.compressed()) {
        encode_output(s, o);
        continue;
      }
      const unsigned w = word_bytes(out.layout.dtype);
      kernels::checksum(st, {s.dev_out[o].data(), out.row_bytes() * n, w, s.rows.begin * out.row_bytes() / w,
                             s.dev_sums.as<std::uint64_t>() + o});
    }
    st.mark(2);
    for (size_t o = 0; o < spec_.outputs.size(); ++o)
      if (!spec_.outputs[o].compressed())
        backend_.copy_to_host(s.host_out[o].data(), s.dev_out[o].data(), spec_.outputs[o].row_bytes() * n, st);
    if (spec_.tile_partial_bytes && !spec_.partials_on_host)
      backend_.copy_to_host(s.host_partials.data(), s.dev_partials.data(),
                            partials_in(spec_, s.rows) * spec_.tile_partial_bytes, st);
    if (!spec_.outputs.empty()) backend_.copy_to_host(s.host_sums.data(), s.dev_sums.data(), s.dev_sums.size(), st);
    st.mark(3);
  }

  // Codes a compressed output's chunks of this batch (once the kernel is done) into its host
  // buffer: per chunk a u64 size and the stream. Synchronous: the codec's framing is on the host.
  void encode_output(Slot& s, size_t o) {
    const OutputDecl& out = spec_.outputs[o];
    kernels::ChunkCodec& codec = *codecs_[o];
    const std::uint64_t chunk_rows = out.layout.chunk[0], row_bytes = out.row_bytes(), capacity = s.host_out[o].size();
    auto* host = s.host_out[o].as<char>();
    std::uint64_t at = 0;
    for (std::uint64_t first = s.rows.begin; first < s.rows.end; first += chunk_rows) {
      const std::uint64_t rows = std::min(chunk_rows, s.rows.end - first);
      const char* x = s.dev_out[o].as<char>() + (first - s.rows.begin) * row_bytes;
      std::optional<double> range;
      if (out.codec->relative) range = codec.value_range(*s.stream, x, rows);  // the chunk's rows, not its padding
      const std::vector<std::uint8_t> coded = codec.encode(*s.stream, x, rows, *out.codec, range);
      const std::uint64_t size = coded.size();
      if (at + 8 + size > capacity) throw std::logic_error("a coded chunk exceeds the codec's worst case");
      std::memcpy(host + at, &size, 8);
      std::memcpy(host + at + 8, coded.data(), size);
      at += 8 + size;
    }
    s.coded_bytes[o] = at;
  }

  // A stored-chunks input's tiles: each slot's header and the chunk's bytes, not the whole
  // (worst-case-sized) slot, so the compressed bytes are what crosses to the device.
  void copy_stored_chunks(Slot& s, size_t input, std::uint64_t tiles) {
    const std::uint64_t slot = spec_.tile_rows * spec_.inputs[input].row_bytes;
    const auto* host = s.host_in[input].as<char>();
    auto* device = s.dev_in[input].as<char>();
    for (std::uint64_t t = 0; t < tiles; ++t) {
      h5::StoredChunk head;
      std::memcpy(&head, host + t * slot, sizeof head);
      backend_.copy_to_device(device + t * slot, host + t * slot, sizeof head + head.bytes, *s.stream);
    }
  }

  Backend& backend_;
  const PassSpec& spec_;
  PassKernel& kernel_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<kernels::ChunkCodec>> codecs_;  // per output; null for plain ones
  std::uint64_t my_batches_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool abort_ = false;
  std::exception_ptr error_;
};

// ------------------------------------------------------------------------------ SegmentWriter
// The segment file being written: the outputs' rows since the last checkpoint.
class SegmentWriter {
 public:
  SegmentWriter(const PassSpec& spec, const mpi::Comm& comm) : spec_(spec), comm_(comm) {}
  bool open() const { return file_.id() >= 0; }
  std::uint64_t first_row() const { return first_; }
  const fs::path& temp() const { return temp_; }
  h5::File& file() { return file_; }

  void create(const fs::path& final_path, std::uint64_t first_row) {
    first_ = first_row;
    temp_ = fsutil::temp_path(final_path);
    file_ = h5::File::create(temp_, comm_.get());
    writers_.clear();
    datasets_.clear();
    datasets_.reserve(spec_.outputs.size());  // writers keep references
    for (const auto& out : spec_.outputs) {
      if (out.compressed()) continue;  // written from its spool at the end
      h5::Shape shape = out.layout.shape;
      shape[0] = 0;
      // Early allocation: chunks exist when the extent grows, so rows can be written in parallel.
      datasets_.push_back(file_.create_dataset(out.name, {{out.layout.dtype, shape, out.layout.chunk}, true, !file_.parallel()}));
      writers_.push_back(std::make_unique<h5::RowWriter>(datasets_.back()));
    }
  }

  // Collective: grows the datasets to the end of the round, then writes this rank's rows.
  void write_round(std::uint64_t round_end, const RowRange* mine, const std::vector<Buffer>* data) {
    for (size_t o = 0, d = 0; o < spec_.outputs.size(); ++o) {
      if (spec_.outputs[o].compressed()) continue;
      datasets_[d].set_rows(round_end - first_);
      writers_[d]->refresh();
      if (mine)
        writers_[d]->write(mine->begin - first_, mine->size(), (*data)[o].data());
      else
        writers_[d]->write(0, 0, nullptr);
      ++d;
    }
  }

  // Collective: flushes (MPI_File_sync under MPI-IO) and closes.
  void close() {
    writers_.clear();
    datasets_.clear();
    file_.flush();
    file_.close();
  }

 private:
  const PassSpec& spec_;
  const mpi::Comm& comm_;
  h5::File file_;
  std::vector<h5::Dataset> datasets_;
  std::vector<std::unique_ptr<h5::RowWriter>> writers_;
  std::uint64_t first_ = 0;
  fs::path temp_;
};

// ------------------------------------------------------------------------------ PassRun
// One run of a pass on one rank: the I/O loop, checkpoints and the final commit.
class PassRun {
 public:
  PassRun(Backend& backend, const mpi::Comm& comm, const EngineOptions& options, const PassSpec& spec,
          PassKernel& kernel, Reduction* reduction, StepWork& work)
      : backend_(backend), comm_(comm), options_(options), spec_(spec), kernel_(kernel), reduction_(reduction),
        work_(work), writer_(spec, comm) {}

  PassOutcome run(const BatchPlan& plan, const fs::path& output, const Annotate& annotate, const ProgressFn& progress,
                  const FinishOutput& finish_output) {
    finish_output_ = finish_output;
    start_ = Clock::now();
    last_commit_ = start_;
    outcome_.plan = plan;
    if (reduction_) reduction_->attach(work_.dir());
    journal_ = work_.load(spec_);
    outcome_.resumed_from = journal_.committed_rows;
    base_wall_ = journal_.wall_seconds;
    base_compute_ = journal_.compute_seconds;
    journal_.attempts += 1;
    pending_sums_ = journal_.checksums;
    if (reduction_ && !journal_.reduction.empty()) reduction_->load(journal_.reduction);
    open_spools();
    if (journal_.committed_rows > 0 && comm_.root())
      spdlog::info("resuming at row {} of {} ({:.1f}% committed in earlier runs)", journal_.committed_rows,
                   spec_.rows, 100.0 * static_cast<double>(journal_.committed_rows) / static_cast<double>(spec_.rows));

    batches_ = partition(spec_, journal_.committed_rows, plan.batch_rows);
    for (const auto& in : spec_.inputs) {
      if (in.stored_chunks) {
        chunk_readers_.push_back(std::make_unique<h5::StoredChunkReader>(*in.dataset));
        if (chunk_readers_.back()->chunk_rows() != spec_.tile_rows)
          throw std::logic_error("a stored-chunks input's chunk rows must equal the pass's tile_rows");
        readers_.push_back(nullptr);
      } else {
        chunk_readers_.push_back(nullptr);
        readers_.push_back(std::make_unique<h5::RowReader>(*in.dataset));
      }
    }
    const bool complete = stream(plan, progress);
    if (complete) finish(output, annotate);
    outcome_.complete = complete;
    outcome_.journal = journal_;
    outcome_.times.wall = since(start_);
    return outcome_;
  }

 private:
  // Rank 0: a chunk spool per compressed output, continuing from the journal's committed state.
  void open_spools() {
    spools_.clear();
    for (const auto& out : spec_.outputs) {
      spools_.push_back(nullptr);
      if (!out.compressed() || !comm_.root()) continue;
      const std::string file = fmt::format("output-{}.bin", spools_.size() - 1);
      spools_.back() = std::make_unique<h5::ChunkSpool>(work_.dir() / file);
      for (const auto& record : journal_.spools)
        if (record.output == out.name && record.file == file)
          spools_.back()->restore(h5::ChunkSpool::State::deserialize(record.state));
    }
  }

  // The batch loop. Returns false if it stopped early (after committing).
  bool stream(const BatchPlan& plan, const ProgressFn& progress) {
    const auto P = static_cast<std::uint64_t>(comm_.size()), rank = static_cast<std::uint64_t>(comm_.rank());
    const std::uint64_t nb = batches_.size(), rounds = ceil_div(nb, P);
    if (rounds == 0) return true;
    const std::uint64_t mine = nb > rank ? ceil_div(nb - rank, P) : 0;  // batches rank, rank+P, ...
    auto global_index = [&](std::uint64_t local) { return local * P + rank; };

    const auto setup_start = Clock::now();
    {  // resident data first: its host staging is gone before the slots take their share
      auto setup = backend_.make_stream();
      kernel_.prepare(backend_, *setup);
      setup->synchronize();
    }
    Pipeline pipe(backend_, spec_, plan.batch_rows, options_.slots, kernel_);
    outcome_.times.setup = since(setup_start);
    // The baseline, after the setup, so that rates are of the batches (a setup that simulates a
    // state vector for 30 s is not 30 s of streaming).
    if (progress && comm_.root()) progress(journal_.committed_rows, spec_.rows);
    const auto loop_start = Clock::now();
    pipe.start(mine);
    std::uint64_t next_read = 0;
    for (std::uint64_t j = 0; j < rounds; ++j) {
      // Read ahead into every free slot, then wait for this round's batch.
      while (next_read < mine && next_read < j + pipe.size()) read(pipe, next_read++, global_index);
      const bool have = j < mine;
      Pipeline::Slot* slot = have ? &pipe.slot_of(j) : nullptr;
      if (slot) pipe.wait_done(*slot, outcome_.times);
      const RowRange round{batches_[j * P].begin, batches_[std::min(nb, (j + 1) * P) - 1].end};
      write_round(round, slot);
      if (slot) pipe.release(*slot);
      outcome_.rows_run += round.size();

      // Agree at the batch boundary: stop (a signal on any rank) or checkpoint (rank 0's clock).
      const bool due = comm_.root() && options_.checkpoint_seconds && since(last_commit_) >= *options_.checkpoint_seconds;
      const auto flags = comm_.max({signals::stop_requested() != 0 ? 1 : 0, due ? 1 : 0});
      if (progress && comm_.root()) progress(round.end, spec_.rows);
      if (j + 1 == rounds) break;
      if (flags[0] || flags[1]) commit(round.end);
      if (flags[0]) {
        pipe.stop();
        outcome_.times.loop = since(loop_start);
        return false;
      }
    }
    pipe.stop();
    outcome_.times.loop = since(loop_start);
    return true;
  }

  // Fills the (free) slot of this rank's batch `local` with its input rows.
  void read(Pipeline& pipe, std::uint64_t local, const std::function<std::uint64_t(std::uint64_t)>& global_index) {
    Pipeline::Slot& s = pipe.slot_of(local);
    s.index = global_index(local);
    s.rows = batches_[s.index];
    const auto t = Clock::now();
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      if (readers_[i]) {
        readers_[i]->read(s.rows.begin, s.rows.size(), s.host_in[i].data());
      } else {  // one slot of tile_rows rows per tile (chunk)
        const std::uint64_t slot = spec_.tile_rows * spec_.inputs[i].row_bytes;
        chunk_readers_[i]->read(s.rows.begin / spec_.tile_rows, ceil_div(s.rows.size(), spec_.tile_rows),
                                s.host_in[i].data(), slot);
      }
    }
    outcome_.times.read += since(t);
    pipe.mark_loaded(s, local);
  }

  // Collective: writes the round's outputs and folds its partials and checksums on rank 0.
  void write_round(const RowRange& round, Pipeline::Slot* slot) {
    const auto t = Clock::now();
    if (has_plain_outputs(spec_)) {
      if (!writer_.open()) writer_.create(work_.segment_path(journal_.segments.size()), round.begin);
      writer_.write_round(round.end, slot ? &slot->rows : nullptr, slot ? &slot->host_out : nullptr);
    }
    outcome_.times.write += since(t);

    std::string record;
    if (slot) {
      record.assign(slot->host_sums.as<char>(), slot->host_sums.size());
      for (size_t o = 0; o < spec_.outputs.size(); ++o) {  // coded chunks: their length, then them
        if (!spec_.outputs[o].compressed()) continue;
        record.append(reinterpret_cast<const char*>(&slot->coded_bytes[o]), 8);
        record.append(slot->host_out[o].as<char>(), slot->coded_bytes[o]);
      }
      if (spec_.tile_partial_bytes && spec_.sized_partials) {
        for (std::uint64_t t = 0; t < partials_in(spec_, slot->rows); ++t) {
          const char* p = slot->host_partials.as<char>() + t * spec_.tile_partial_bytes;
          std::uint64_t used;
          std::memcpy(&used, p, 8);
          if (used > spec_.tile_partial_bytes - 8) throw std::logic_error("a sized partial overruns its tile");
          record.append(p, 8 + used);
        }
      } else if (spec_.tile_partial_bytes) {
        record.append(slot->host_partials.as<char>(), partials_in(spec_, slot->rows) * spec_.tile_partial_bytes);
      }
    }
    const auto records = comm_.gather(record);  // rank order == batch order within the round
    if (!comm_.root()) return;
    for (const auto& r : records) {
      if (r.empty()) continue;
      size_t off = 8 * spec_.outputs.size();
      for (size_t o = 0; o < spec_.outputs.size(); ++o) {
        if (spec_.outputs[o].compressed()) {
          off = spool_chunks(o, r, off);
          continue;
        }
        std::uint64_t v;
        std::memcpy(&v, r.data() + 8 * o, 8);
        pending_sums_[o] += v;  // wraps modulo 2^64
      }
      if (!reduction_) continue;
      while (off < r.size()) {
        reduction_->fold(reinterpret_cast<const std::byte*>(r.data() + off));
        std::uint64_t used = 0;
        if (spec_.sized_partials) std::memcpy(&used, r.data() + off, 8);
        off += spec_.sized_partials ? 8 + used : spec_.tile_partial_bytes;
      }
    }
  }

  // Rank 0: appends a record's coded chunks of compressed output `o` (at `off`: their length,
  // then per chunk a u64 size and the stream) to its spool. Returns the offset after them.
  size_t spool_chunks(size_t o, const std::string& r, size_t off) {
    std::uint64_t length;
    std::memcpy(&length, r.data() + off, 8);
    off += 8;
    const size_t end = off + length;
    while (off < end) {
      std::uint64_t size;
      std::memcpy(&size, r.data() + off, 8);
      spools_[o]->append(reinterpret_cast<const std::byte*>(r.data() + off + 8), size);
      off += 8 + size;
    }
    return end;
  }

  // Collective: makes rows [0, upto) durable and records them in the journal.
  void commit(std::uint64_t upto) {
    if (upto == journal_.committed_rows) return;
    const auto t = Clock::now();
    if (writer_.open()) {
      const fs::path final_path = work_.segment_path(journal_.segments.size());
      const std::uint64_t first = writer_.first_row();
      writer_.close();
      if (comm_.root()) fsutil::commit_rename(writer_.temp(), final_path);
      journal_.segments.push_back({final_path.filename().string(), {first, upto}});
    }
    journal_.committed_rows = upto;
    journal_.checksums = pending_sums_;
    journal_.wall_seconds = base_wall_ + since(start_);
    journal_.compute_seconds = base_compute_ + outcome_.times.compute;
    save_reduction();
    if (comm_.root()) work_.save(journal_);
    comm_.barrier();
    last_commit_ = Clock::now();
    outcome_.times.commit += since(t);
    spdlog::debug("committed rows [0, {}) in {:.3f}s", upto, since(t));
  }

  // Rank 0: the fold's state and the compressed outputs' spools (their files made durable) into
  // the journal.
  void save_reduction() {
    if (!comm_.root()) return;
    journal_.spools.clear();
    for (size_t o = 0; o < spools_.size(); ++o)
      if (spools_[o])
        journal_.spools.push_back({spec_.outputs[o].name, spools_[o]->path().filename().string(),
                                   spools_[o]->commit().serialize()});
    if (!reduction_) return;
    journal_.reduction = reduction_->save();
    journal_.reduction_files = reduction_->files();
  }

  // Rank 0's final state, on every rank (annotations are collective and must agree).
  void share_final_state() {
    journal_.committed_rows = spec_.rows;
    journal_.checksums = pending_sums_;
    journal_.wall_seconds = base_wall_ + since(start_);
    journal_.compute_seconds = base_compute_ + outcome_.times.compute;
    save_reduction();
    journal_ = Journal::from_json(nlohmann::json::parse(comm_.broadcast(journal_.to_json().dump())));
    if (reduction_ && !journal_.reduction.empty()) reduction_->load(journal_.reduction);
  }

  void finish(const fs::path& output, const Annotate& annotate) {
    const auto t = Clock::now();
    if (writer_.open() && writer_.first_row() == 0 && journal_.segments.empty()) {
      // The whole pass is in the open segment: it becomes the output, no copy needed.
      share_final_state();
      if (!has_compressed_outputs()) annotate(writer_.file(), journal_);
      writer_.close();
      complete(writer_.temp(), annotate);
      if (comm_.root()) fsutil::commit_rename(writer_.temp(), output);
    } else {
      commit(spec_.rows);
      share_final_state();
      merge(output, annotate);
    }
    comm_.barrier();
    outcome_.times.finalize += since(t);
  }

  bool has_compressed_outputs() const {
    return std::any_of(spec_.outputs.begin(), spec_.outputs.end(), [](const OutputDecl& o) { return o.compressed(); });
  }

  // Collective, once every rank has closed the output (annotated unless it has compressed
  // outputs): rank 0 writes the compressed outputs, then every rank annotates the output (the
  // stage may describe those datasets too), then rank 0 makes the stage's serial additions.
  void complete(const fs::path& temp, const Annotate& annotate) {
    if (has_compressed_outputs()) {
      on_root(temp, [this](const fs::path& t) { write_compressed_outputs(t); });
      h5::File file = h5::File::open(temp, h5::Mode::read_write, comm_.get());
      annotate(file, journal_);
      file.flush();
      file.close();
    }
    if (finish_output_) on_root(temp, finish_output_);
  }

  // Collective: `work` on rank 0 alone; its failure reaches every rank (the others would
  // otherwise wait for rank 0 forever).
  void on_root(const fs::path& temp, const FinishOutput& work) {
    comm_.barrier();
    std::string error;
    if (comm_.root()) try {
        work(temp);
      } catch (const std::exception& e) {
        error = e.what();
      }
    error = comm_.broadcast(error);
    if (!error.empty()) throw RuntimeFailure(error);
  }

  // Rank 0: the compressed outputs' datasets from their spools.
  void write_compressed_outputs(const fs::path& temp) {
    if (std::none_of(spools_.begin(), spools_.end(), [](const auto& s) { return s != nullptr; })) return;
    h5::File file = h5::File::open(temp, h5::Mode::read_write);  // serial: rank 0 alone
    for (size_t o = 0; o < spec_.outputs.size(); ++o) {
      if (!spools_[o]) continue;
      const OutputDecl& out = spec_.outputs[o];
      const nlohmann::json summary =
          h5::codec_summary(*out.codec, std::nullopt, element_type(out), out.codec->relative ? "chunk" : "absolute");
      outcome_.stored_checksums[out.name] = h5::write_compressed_dataset(file, out.name, out.layout,
                                                                         *out.codec, summary, *spools_[o]);
    }
    file.flush();
    file.close();
  }

  // Collective: copies the committed segments into a new output file, in chunk-aligned pieces
  // dealt to ranks round by round (each rank writes whole chunks).
  void merge(const fs::path& output, const Annotate& annotate) {
    const fs::path temp = fsutil::temp_path(output);
    h5::File out = h5::File::create(temp, comm_.get());
    std::vector<h5::Dataset> dsets;
    std::vector<std::unique_ptr<h5::RowWriter>> writers;
    dsets.reserve(spec_.outputs.size());  // writers keep references
    std::uint64_t row_max = 1;
    std::vector<size_t> plain;  // the outputs that have segments, in order
    for (size_t i = 0; i < spec_.outputs.size(); ++i) {
      const OutputDecl& o = spec_.outputs[i];
      if (o.compressed()) continue;
      plain.push_back(i);
      dsets.push_back(out.create_dataset(o.name, {o.layout, true, !out.parallel()}));
      writers.push_back(std::make_unique<h5::RowWriter>(dsets.back()));
      row_max = std::max(row_max, o.row_bytes());
    }
    if (!dsets.empty() && !journal_.segments.empty()) {
      const std::uint64_t piece = std::max(outcome_.plan.batch_rows, spec_.tile_rows);
      Buffer buffer = backend_.alloc_host(piece * row_max, "merge buffer");
      const auto P = static_cast<std::uint64_t>(comm_.size()), rank = static_cast<std::uint64_t>(comm_.rank());
      for (const auto& seg : journal_.segments) {
        h5::File in = h5::File::open(work_.dir() / seg.file, h5::Mode::read_only, comm_.get());
        const std::uint64_t pieces = ceil_div(seg.rows.size(), piece);
        for (size_t o = 0; o < dsets.size(); ++o) {
          h5::Dataset src = in.open_dataset(spec_.outputs[plain[o]].name);
          h5::RowReader reader(src);
          for (std::uint64_t round = 0; round < ceil_div(pieces, P); ++round) {
            const std::uint64_t p = round * P + rank;
            if (p < pieces) {
              const std::uint64_t first = p * piece, n = std::min(piece, seg.rows.size() - first);
              reader.read(first, n, buffer.data());
              writers[o]->write(seg.rows.begin + first, n, buffer.data());
            } else {
              writers[o]->write(0, 0, nullptr);
            }
          }
        }
        in.close();
      }
    }
    if (!has_compressed_outputs()) annotate(out, journal_);
    writers.clear();
    dsets.clear();
    out.flush();
    out.close();
    complete(temp, annotate);
    if (comm_.root()) fsutil::commit_rename(temp, output);
  }

  Backend& backend_;
  const mpi::Comm& comm_;
  const EngineOptions& options_;
  const PassSpec& spec_;
  PassKernel& kernel_;
  Reduction* reduction_;
  StepWork& work_;
  SegmentWriter writer_;
  Journal journal_;
  Batches batches_;
  std::vector<std::unique_ptr<h5::RowReader>> readers_;
  std::vector<std::unique_ptr<h5::StoredChunkReader>> chunk_readers_;
  std::vector<std::uint64_t> pending_sums_;
  std::vector<std::unique_ptr<h5::ChunkSpool>> spools_;  // rank 0: per output; null for plain ones
  PassOutcome outcome_;
  Clock::time_point start_, last_commit_;
  FinishOutput finish_output_;
  double base_wall_ = 0, base_compute_ = 0;
};

}  // namespace

StreamEngine::StreamEngine(Backend& backend, const mpi::Comm& comm, EngineOptions options)
    : backend_(backend), comm_(comm), options_(options) {
  if (options_.slots < 2) throw InputError("the streaming engine needs at least 2 buffer slots");
}

BatchPlan StreamEngine::plan(const PassSpec& spec) const {
  if (spec.tile_rows == 0) throw std::logic_error("PassSpec.tile_rows must be positive");
  for (const auto& o : spec.outputs)
    if (o.layout.chunk.empty() || spec.tile_rows % o.layout.chunk[0] != 0)
      throw std::logic_error("output chunk rows must divide the pass's tile_rows");
  check_batches(spec);
  for (const auto& o : spec.outputs)
    if (o.compressed()) element_type(o);  // float32 or complex64
  for (const auto& in : spec.inputs)
    if (in.stored_chunks && !spec.batches.empty())
      throw std::logic_error("stored-chunks inputs are read in whole tiles; explicit batches are not supported");
  std::uint64_t unit_rows = spec.tile_rows;  // the smallest batch the engine may choose
  if (!spec.batches.empty()) {
    // Explicit batches: the largest one, whole, is the unit that must fit.
    unit_rows = 0;
    for (const auto& r : spec.batches) unit_rows = std::max(unit_rows, r.size());
  }
  const PerBatchBytes b = per_batch_bytes(spec, unit_rows, backend_.kind());
  const auto S = static_cast<std::uint64_t>(options_.slots);
  const std::uint64_t fixed_device = spec.resident_device_bytes + b.fixed_device +
                                     (spec.uses_blas ? S * backend_.blas_stream_bytes() : 0) + S * b.fixed_per_slot;
  const std::uint64_t fixed_host = S * b.fixed_per_slot;
  const std::uint64_t dev_limit = backend_.device_budget().limit(), host_limit = backend_.host_budget().limit();
  auto need = [&](std::uint64_t tiles, std::uint64_t fixed, std::uint64_t per_tile) { return fixed + S * tiles * per_tile; };
  if (need(1, fixed_device, b.device_per_tile) > dev_limit)
    throw InputError(fmt::format(
        "device memory budget {} is too small: one batch of {} rows needs {} ({} resident + {} slots x {} per "
        "batch); expected at least that much (--device-memory or options.device_memory)",
        format_bytes(static_cast<double>(dev_limit)), unit_rows,
        format_bytes(static_cast<double>(need(1, fixed_device, b.device_per_tile))),
        format_bytes(static_cast<double>(fixed_device)), S, format_bytes(static_cast<double>(b.device_per_tile))));
  if (need(1, fixed_host, b.host_per_tile) > host_limit)
    throw InputError(fmt::format("host memory budget {} is too small: one batch of {} rows needs {} ({} slots x {}); "
                                 "expected at least that much (--host-memory or options.host_memory)",
                                 format_bytes(static_cast<double>(host_limit)), unit_rows,
                                 format_bytes(static_cast<double>(need(1, fixed_host, b.host_per_tile))), S,
                                 format_bytes(static_cast<double>(b.host_per_tile))));
  if (spec.prepare_host_bytes > host_limit)
    throw InputError(fmt::format("host memory budget {} is too small: loading the resident data needs {} "
                                 "(--host-memory or options.host_memory)",
                                 format_bytes(static_cast<double>(host_limit)),
                                 format_bytes(static_cast<double>(spec.prepare_host_bytes))));
  std::uint64_t tiles = std::min((dev_limit - fixed_device) / (S * std::max<std::uint64_t>(b.device_per_tile, 1)),
                                 (host_limit - fixed_host) / (S * std::max<std::uint64_t>(b.host_per_tile, 1)));
  const std::uint64_t row = b.in_per_row + b.out_per_row;
  if (row) tiles = std::min(tiles, std::max<std::uint64_t>(1, options_.max_batch_bytes / (row * spec.tile_rows)));
  if (options_.max_batch_rows)
    tiles = std::min(tiles, std::max<std::uint64_t>(1, options_.max_batch_rows / spec.tile_rows));
  // Not more than the pass has. (The rank count must not enter: the batch grid is the same for
  // any number of ranks, so a batch's arithmetic is too.)
  tiles = std::clamp<std::uint64_t>(tiles, 1, std::max<std::uint64_t>(1, ceil_div(spec.rows, spec.tile_rows)));
  BatchPlan plan;
  if (!spec.batches.empty()) tiles = 1;  // the explicit batches are the batches
  plan.batch_rows = tiles * unit_rows;
  plan.device_bytes = need(tiles, fixed_device, b.device_per_tile);
  plan.host_bytes = need(tiles, fixed_host, b.host_per_tile);
  return plan;
}

PassOutcome StreamEngine::run(const PassSpec& spec, PassKernel& kernel, Reduction* reduction, StepWork& work,
                              const fs::path& output, const Annotate& annotate, const ProgressFn& progress,
                              const FinishOutput& finish_output) {
  const BatchPlan plan = this->plan(spec);
  PassRun run(backend_, comm_, options_, spec, kernel, reduction, work);
  return run.run(plan, output, annotate, progress, finish_output);
}

}  // namespace qstage::engine
