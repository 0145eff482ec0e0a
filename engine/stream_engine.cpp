#include "engine/stream_engine.hpp"

#include "engine/checkpoint_pace.hpp"
#include "engine/output_sinks.hpp"
#include "engine/partition.hpp"
#include "engine/tree_fold.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/signals.hpp"
#include "comm/communicator.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "io/row_io.hpp"

namespace qstage::engine {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::uint64_t StreamedInput::rows() const {
  return files ? files->total_rows() : dataset ? dataset->shape().at(0) : ~std::uint64_t{0};
}

std::uint64_t size_class(std::uint64_t n) {
  if (n <= 16) return n;
  const std::uint64_t step = std::bit_floor(n) / 8;
  return (n + step - 1) / step * step;
}

std::uint64_t PassSpec::progress_bytes_per_row() const {
  std::uint64_t n = 0;
  for (const auto& in : inputs) n += in.row_bytes;
  for (const auto& out : outputs) n += out.row_bytes();
  return n;
}

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return b ? (a + b - 1) / b : 0; }


std::uint64_t device_partial_bytes(const PassSpec& s) { return s.partials_on_host ? 0 : s.tile_partial_bytes; }

// The rows an input's buffers hold in a slot: a row_ranges input its own longest range (its
// ranges need not follow the batches: a small share of each batch, or more rows than it has),
// any other input the buffers' rows; `classes`: the longest range's size class.
std::uint64_t input_rows(const StreamedInput& in, std::uint64_t buffer_rows, bool classes) {
  if (in.kind != InputKind::row_ranges) return buffer_rows;
  std::uint64_t n = 1;  // (a buffer even where every range is empty)
  for (const auto& r : in.ranges) n = std::max(n, r.size());
  return classes ? size_class(n) : n;
}

struct PerBatchBytes {
  std::uint64_t in_per_row = 0, device_per_tile = 0, host_per_tile = 0, fixed_per_slot = 0;
  std::uint64_t fixed_device = 0;  // coded outputs' codecs
};

// Per unit (a tile, or the largest explicit batch): the device holds every input's and output's
// rows, the host what the sinks bring back.
PerBatchBytes per_batch_bytes(const PassSpec& s, const std::vector<std::unique_ptr<detail::OutputSink>>& sinks,
                              std::uint64_t unit_rows, BackendKind kind, bool classes = false) {
  PerBatchBytes b;
  std::uint64_t device_out = 0, host_out = 0, in_bytes = 0, device_in = 0;
  for (const auto& in : s.inputs) {
    b.in_per_row += in.row_bytes;
    in_bytes += input_rows(in, unit_rows, classes) * in.row_bytes;
    if (in.place == StreamedInput::Place::device) device_in += input_rows(in, unit_rows, classes) * in.row_bytes;
  }
  for (const auto& sink : sinks) {
    device_out += sink->device_bytes(unit_rows);
    host_out += sink->host_bytes(unit_rows);
    b.fixed_device += sink->fixed_device_bytes(kind);
    b.fixed_per_slot += sink->count_bytes() + sink->sum_bytes();  // (device and host alike)
  }
  b.device_per_tile = device_in + device_out + unit_rows * s.scratch_device_bytes_per_row + device_partial_bytes(s);
  b.host_per_tile = in_bytes + host_out + s.tile_partial_bytes;
  return b;
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
    std::vector<RowRange> input_rows;  // per input
    std::vector<Buffer> host_in, dev_in;
    std::vector<detail::SlotOutput> out;  // per output (its sink's buffers)
    Buffer scratch, dev_partials, host_partials;
    std::unique_ptr<Stream> stream;
  };

  // Each slot's buffers hold `plan.buffer_rows` rows (at least a batch's).
  Pipeline(Backend& backend, const PassSpec& spec, const std::vector<std::unique_ptr<detail::OutputSink>>& sinks,
           const BatchPlan& plan, int slots, PassKernel& kernel)
      : backend_(backend), spec_(spec), sinks_(sinks), kernel_(kernel), slots_(static_cast<size_t>(slots)) {
    const std::uint64_t batch_rows = plan.buffer_rows;
    const std::uint64_t tiles = spec.batches.empty() ? ceil_div(batch_rows, spec.tile_rows) : 1;
    int n = 0;
    for (auto& s : slots_) {
      const std::string tag = fmt::format("slot {}", n++);
      for (const auto& in : spec.inputs) {
        const std::uint64_t bytes = in.row_bytes * input_rows(in, batch_rows, plan.size_classes);
        s.host_in.push_back(backend.alloc_host(bytes, tag + " input " + in.name));
        s.dev_in.push_back(in.place == StreamedInput::Place::device
                               ? backend.alloc_device(bytes, tag + " input " + in.name)
                               : Buffer());
      }
      for (const auto& sink : sinks) s.out.push_back(sink->make_slot(backend, batch_rows, tag));
      if (spec.scratch_device_bytes_per_row)
        s.scratch = backend.alloc_device(spec.scratch_device_bytes_per_row * batch_rows, tag + " scratch");
      if (spec.tile_partial_bytes) {
        if (!spec.partials_on_host) s.dev_partials = backend.alloc_device(tiles * spec.tile_partial_bytes, tag + " partials");
        s.host_partials = backend.alloc_host(tiles * spec.tile_partial_bytes, tag + " partials");
      }
      s.stream = backend.make_stream(spec.uses_blas);
    }
    for (const auto& sink : sinks) sink->prepare(backend);  // once per rank: batches code in turn
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
    st.mark(0);
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      if (spec_.inputs[i].place == StreamedInput::Place::host) continue;
      if (spec_.inputs[i].kind == InputKind::stored_chunks) {
        copy_stored_chunks(s, i, ceil_div(s.rows.size(), spec_.tile_rows));
        continue;
      }
      backend_.copy_to_device(s.dev_in[i].data(), s.host_in[i].data(), spec_.inputs[i].row_bytes * s.input_rows[i].size(), st);
    }
    st.mark(1);
    BatchView view;
    view.index = s.index;
    view.rows = s.rows;
    view.input_rows = s.input_rows;
    for (auto& b : s.dev_in) view.inputs.push_back(b.data());
    for (auto& b : s.host_in) view.host_inputs.push_back(b.data());
    for (size_t o = 0; o < sinks_.size(); ++o) {
      view.outputs.push_back(sinks_[o]->kernel_output(s.out[o]));
      view.appended.push_back(spec_.outputs[o].kind == OutputKind::appended ? sinks_[o]->kernel_count(s.out[o]) : nullptr);
    }
    view.scratch = s.scratch.data();
    view.partials = spec_.partials_on_host ? s.host_partials.data() : s.dev_partials.data();
    view.stream = &st;
    kernel_.process(view);
    st.mark(2);
    for (size_t o = 0; o < sinks_.size(); ++o) sinks_[o]->after_kernel(backend_, st, s.out[o], s.rows);
    if (spec_.tile_partial_bytes && !spec_.partials_on_host)
      backend_.copy_to_host(s.host_partials.data(), s.dev_partials.data(),
                            partials_in(spec_, s.rows) * spec_.tile_partial_bytes, st);
    st.mark(3);
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
  const std::vector<std::unique_ptr<detail::OutputSink>>& sinks_;
  PassKernel& kernel_;
  std::vector<Slot> slots_;
  std::uint64_t my_batches_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool abort_ = false;
  std::exception_ptr error_;
};

// ------------------------------------------------------------------------------ PassRun
// One run of a pass on one rank: the I/O loop, checkpoints and the final output.
class PassRun {
 public:
  PassRun(Backend& backend, const mpi::Comm& comm, const EngineOptions& options, const PassSpec& spec,
          PassKernel& kernel, Reduction* reduction, StepWork& work)
      : backend_(backend), comm_(comm), options_(options), spec_(spec), kernel_(kernel), reduction_(reduction),
        work_(work),
        exchange_(detail::exchanges(spec) ? std::make_unique<comm::Communicator>(comm, &backend) : nullptr),
        sinks_(detail::make_sinks(spec, comm, exchange_.get())), segment_(comm) {}

  PassOutcome run(const BatchPlan& plan, const fs::path& output, const ProgressFn& progress) {
    start_ = Clock::now();
    pace_ = CheckpointPace(options_.checkpoint_seconds, start_);
    outcome_.plan = plan;
    journal_ = work_.load(spec_);
    outcome_.resumed_from = journal_.committed_rows;
    base_wall_ = journal_.wall_seconds;
    outcome_.earlier_wall_seconds = base_wall_;
    base_compute_ = journal_.compute_seconds;
    journal_.attempts += 1;
    if (reduction_) fold_ = std::make_unique<FoldStack>(*reduction_);
    if (reduction_ && comm_.root() && !journal_.reduction.empty()) fold_->load(journal_.reduction);
    for (auto& sink : sinks_) sink->restore(journal_, work_.dir(), comm_.root());
    if (journal_.committed_rows > 0 && comm_.root())
      spdlog::info("resuming at row {} of {} ({:.1f}% committed in earlier runs)", journal_.committed_rows,
                   spec_.rows, 100.0 * static_cast<double>(journal_.committed_rows) / static_cast<double>(spec_.rows));

    batches_ = partition(spec_, journal_.committed_rows, plan.batch_rows);
    open_readers();
    const bool complete = stream(plan, progress);
    if (complete) finish(output);
    outcome_.complete = complete;
    outcome_.journal = journal_;
    outcome_.times.wall = since(start_);
    return outcome_;
  }

 private:
  void open_readers() {
    for (const auto& in : spec_.inputs) {
      file_readers_.push_back(in.files ? std::make_unique<h5::RowFilesReader>(*in.files) : nullptr);
      if (in.files) {
        if (in.kind == InputKind::stored_chunks) throw std::logic_error("stored chunks are read from HDF5 datasets only");
        chunk_readers_.push_back(nullptr);
        readers_.push_back(nullptr);
      } else if (in.kind == InputKind::stored_chunks) {
        chunk_readers_.push_back(std::make_unique<h5::StoredChunkReader>(*in.dataset));
        if (chunk_readers_.back()->chunk_rows() != spec_.tile_rows)
          throw std::logic_error("a stored-chunks input's chunk rows must equal the pass's tile_rows");
        readers_.push_back(nullptr);
      } else {
        chunk_readers_.push_back(nullptr);
        readers_.push_back(std::make_unique<h5::RowReader>(*in.dataset));
      }
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
    outcome_.times.prepare = since(setup_start);
    // No more slots than this rank has batches: a pass of one batch (most of sci.solve's, a merge
    // of few buckets) pins one set of buffers, not three.
    const int slots = static_cast<int>(std::clamp<std::uint64_t>(mine, 1, static_cast<std::uint64_t>(options_.slots)));
    Pipeline pipe(backend_, spec_, sinks_, plan, slots, kernel_);
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
      detail::Round round;
      for (std::uint64_t b = j * P; b < std::min(nb, (j + 1) * P); ++b) round.batches.push_back(batches_[b]);
      round.rows = {round.batches.front().begin, round.batches.back().end};
      if (slot) round.mine = static_cast<int>(rank);
      write_round(round, slot);
      if (slot) pipe.release(*slot);
      outcome_.rows_run += round.rows.size();

      // Agree at the batch boundary: stop (a signal on any rank) or checkpoint (rank 0's clock).
      const bool due = comm_.root() && pace_.due();
      const auto flags = comm_.max({signals::stop_requested() != 0 ? 1 : 0, due ? 1 : 0});
      if (progress && comm_.root()) progress(round.rows.end, spec_.rows);
      if (j + 1 == rounds) break;
      if (flags[0] || flags[1]) {  // a checkpoint inside a pass is always durable
        const fsutil::DurableNow durable;
        commit(round.rows.end);
      }
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
    s.input_rows.clear();
    const auto t = Clock::now();
    for (size_t i = 0; i < spec_.inputs.size(); ++i) {
      const StreamedInput& in = spec_.inputs[i];
      s.input_rows.push_back(in.kind == InputKind::row_ranges ? in.ranges[batches_.pass_index(s.index)] : s.rows);
      if (file_readers_[i]) {
        file_readers_[i]->read(s.input_rows[i].begin, s.input_rows[i].size(), s.host_in[i].data());
      } else if (readers_[i]) {
        readers_[i]->read(s.input_rows[i].begin, s.input_rows[i].size(), s.host_in[i].data());
      } else {  // one slot of tile_rows rows per tile (chunk)
        const std::uint64_t slot = spec_.tile_rows * in.row_bytes;
        chunk_readers_[i]->read(s.rows.begin / spec_.tile_rows, ceil_div(s.rows.size(), spec_.tile_rows),
                                s.host_in[i].data(), slot);
      }
    }
    outcome_.times.read += since(t);
    pipe.mark_loaded(s, local);
  }

  // Per segment sink, the rows each batch of the round gives it, on every rank: pass rows, or
  // (appended outputs) the counts the kernels stored, shared in one collective.
  std::vector<std::vector<std::uint64_t>> round_counts(const detail::Round& round, Pipeline::Slot* slot) {
    const size_t n = round.batches.size(), S = sinks_.size();
    std::vector<std::uint64_t> mine(n * S, 0);
    bool any_appended = false;
    for (size_t o = 0; o < S; ++o) {
      any_appended |= spec_.outputs[o].kind == OutputKind::appended;
      if (slot) mine[static_cast<size_t>(round.mine) * S + o] = sinks_[o]->count(slot->out[o], slot->rows);
    }
    const std::vector<std::uint64_t> all = any_appended ? comm_.sum_wrapping(mine) : mine;  // (a sum of one-hot rows: a gather)
    std::vector<std::vector<std::uint64_t>> counts(S, std::vector<std::uint64_t>(n));
    for (size_t b = 0; b < n; ++b)
      for (size_t o = 0; o < S; ++o)
        counts[o][b] = spec_.outputs[o].kind == OutputKind::appended ? all[b * S + o] : round.batches[b].size();
    return counts;
  }

  // Collective: places the round's outputs and folds its partials and checksums on rank 0.
  void write_round(const detail::Round& round, Pipeline::Slot* slot) {
    const auto t = Clock::now();
    const auto counts = round_counts(round, slot);
    const bool segments = std::any_of(sinks_.begin(), sinks_.end(), [](const auto& s) { return s->in_segments(); });
    if (segments && !segment_.open()) {
      segment_.create(work_.segment_path(journal_.segments.size()));
      segment_first_row_ = round.rows.begin;
      segment_first_sums_.clear();
      for (auto& sink : sinks_) {
        segment_first_sums_.push_back(sink->checksum());
        if (sink->in_segments()) sink->open_segment(segment_.file());
      }
    }
    std::string record;  // what rank 0 needs: each output's piece, then the partials
    for (size_t o = 0; o < sinks_.size(); ++o) sinks_[o]->write_round(round, counts[o], slot ? &slot->out[o] : nullptr, record);
    outcome_.times.write += since(t);
    std::vector<FoldNode> own_nodes;  // rank 0's stay objects: a result of 10^7 values is not copied 4 times
    if (slot && reduction_) {         // the batch's whole nodes of the fold's tree, not its partials
      const std::uint64_t first = spec_.batches.empty() ? slot->rows.begin / spec_.tile_rows : batches_.pass_index(slot->index);
      own_nodes = batch_nodes(*reduction_, first, partials_in(spec_, slot->rows), slot->host_partials.as<std::byte>(),
                              spec_.tile_partial_bytes);
      if (!comm_.root()) append_nodes(record, own_nodes);
    }

    const auto records = comm_.gather(std::move(record));  // rank order == batch order within the round
    if (!comm_.root()) return;
    for (size_t rank = 0; rank < records.size(); ++rank) {
      const std::string& r = records[rank];
      size_t off = 0;
      if (!r.empty())
        for (auto& sink : sinks_) off = sink->accept(r, off);
      if (!reduction_) continue;
      if (rank == 0)  // (this rank)
        for (auto& node : own_nodes) fold_->push(std::move(node));
      else if (!r.empty())
        for (auto& node : read_nodes(*reduction_, r, off)) fold_->push(std::move(node));
    }
  }

  // Collective: makes rows [0, upto) durable and records them in the journal.
  void commit(std::uint64_t upto) {
    if (upto == journal_.committed_rows) return;
    const auto t = Clock::now();
    if (segment_.open()) {
      const fs::path final_path = work_.segment_path(journal_.segments.size());
      Segment seg{final_path.filename().string(), {segment_first_row_, upto}, {}};
      for (std::size_t o = 0; o < sinks_.size(); ++o) {
        seg.output_rows.push_back(sinks_[o]->segment_rows());
        seg.checksums.push_back(sinks_[o]->checksum() - segment_first_sums_[o]);  // (rank 0's; wraps modulo 2^64)
        sinks_[o]->close_datasets();
      }
      segment_.close();
      if (comm_.root()) fsutil::commit_rename(segment_.temp(), final_path);
      journal_.segments.push_back(std::move(seg));
    }
    journal_.committed_rows = upto;
    record_state();
    if (comm_.root()) work_.save(journal_);
    comm_.barrier();
    pace_.committed(t);
    outcome_.times.commit += since(t);
    spdlog::debug("committed rows [0, {}) in {:.3f}s", upto, since(t));
  }

  // The sinks' and the fold's state into the journal (rank 0's is the one saved): checksums,
  // appended counts, spools made durable.
  void record_state() {
    for (auto& sink : sinks_) sink->commit(journal_);
    journal_.wall_seconds = base_wall_ + since(start_);
    journal_.compute_seconds = base_compute_ + outcome_.times.compute;
    // (the fold changes only as rows arrive: a second record at the same row, as the last
    // commit's and the final state's are, keeps the first one's copy)
    if (reduction_ && comm_.root() && reduction_recorded_at_ != journal_.committed_rows) {
      journal_.reduction = fold_->save();
      reduction_recorded_at_ = journal_.committed_rows;
    }
  }

  // Rank 0's final state, on every rank (annotations are collective and must agree).
  void share_final_state() {
    journal_.committed_rows = spec_.rows;
    record_state();
    std::string reduction = std::move(journal_.reduction);  // (rank 0's: it alone folds; not broadcast)
    journal_ = Journal::from_json(nlohmann::json::parse(comm_.broadcast(journal_.to_json().dump())));
    journal_.reduction = std::move(reduction);
    if (reduction_)  // the tree's value, everywhere (rank 0's fold is spent: its nodes merge in place)
      reduction_->load(comm_.broadcast(comm_.root() ? fold_->take_result()->save() : std::string()));
    for (auto& sink : sinks_) sink->restore(journal_, work_.dir(), comm_.root());  // (every rank: rank 0's counts and sums)
  }

  bool has_serial_outputs() const {
    return std::any_of(sinks_.begin(), sinks_.end(), [](const auto& s) { return !s->in_segments() && !s->writes_final(); });
  }

  // Collective: the output under its temporary name, closed, every dataset in it.
  void finish(const fs::path& output) {
    const auto t = Clock::now();
    fs::path temp;
    double datasets_seconds = 0, shared_seconds = 0;  // (of which, for the log)
    if (segment_.open() && segment_first_row_ == 0 && journal_.segments.empty()) {
      // The whole pass is in the open segment: it becomes the output, no copy needed.
      for (auto& sink : sinks_) sink->close_datasets();
      datasets_seconds = since(t);
      const auto shared = Clock::now();
      share_final_state();
      shared_seconds = since(shared);
      segment_.close();
      temp = segment_.temp();
    } else {
      commit(spec_.rows);
      share_final_state();
      temp = merge(output);
    }
    const double state_seconds = since(t);
    if (std::any_of(sinks_.begin(), sinks_.end(), [](const auto& s) { return s->writes_final(); })) {
      h5::File out = h5::File::open(temp, h5::Mode::read_write, comm_.get());
      for (auto& sink : sinks_)
        if (sink->writes_final()) sink->write_final(out, output);
      out.flush();
      out.close();
    }
    const double final_seconds = since(t) - state_seconds;
    if (has_serial_outputs()) on_root([&] {
        for (auto& sink : sinks_) sink->write_serial(temp);
      });
    for (size_t o = 0; o < sinks_.size(); ++o) {
      OutputReport r;
      r.name = spec_.outputs[o].name;
      r.kind = spec_.outputs[o].kind;
      sinks_[o]->report(r);
      outcome_.outputs.push_back(std::move(r));
    }
    comm_.barrier();
    outcome_.staged = StagedOutput(temp, output, comm_);
    outcome_.times.finalize += since(t);
    spdlog::debug("finalize {:.3f}s: segments and state {:.3f}s (datasets closed {:.3f}s, the state shared {:.3f}s), exchanged "
                  "outputs named {:.3f}s, the rest {:.3f}s", since(t), state_seconds, datasets_seconds, shared_seconds, final_seconds,
                  since(t) - state_seconds - final_seconds);
  }

  // Collective: `work` on rank 0 alone; its failure reaches every rank (the others would
  // otherwise wait for rank 0 forever).
  void on_root(const std::function<void()>& work) {
    comm_.barrier();
    std::string error;
    if (comm_.root()) try {
        work();
      } catch (const std::exception& e) {
        error = e.what();
      }
    error = comm_.broadcast(error);
    if (!error.empty()) throw RuntimeFailure(error);
  }

  // Collective: copies the committed segments into a new output file (each sink its own
  // datasets, in pieces dealt to ranks). Returns the file's (temporary) path.
  fs::path merge(const fs::path& output) {
    const fs::path temp = fsutil::temp_path(output);
    h5::File out = h5::File::create(temp, comm_.get());
    std::uint64_t row_max = 1;
    for (auto& sink : sinks_)
      if (sink->in_segments()) {
        sink->create_final(out);
        row_max = std::max(row_max, sink->decl().row_bytes());
      }
    if (!journal_.segments.empty() && row_max > 1) {
      const std::uint64_t piece = std::max(outcome_.plan.batch_rows, spec_.tile_rows);
      Buffer buffer = backend_.alloc_host(piece * row_max, "merge buffer");
      for (const auto& seg : journal_.segments) {
        h5::File in = h5::File::open(work_.dir() / seg.file, h5::Mode::read_only, comm_.get());
        for (auto& sink : sinks_)
          if (sink->in_segments()) sink->copy_segment(in, seg, buffer, comm_);
        in.close();
      }
    }
    for (auto& sink : sinks_) sink->close_datasets();
    out.flush();
    out.close();
    return temp;
  }

  Backend& backend_;
  const mpi::Comm& comm_;
  const EngineOptions& options_;
  const PassSpec& spec_;
  PassKernel& kernel_;
  Reduction* reduction_;
  std::unique_ptr<FoldStack> fold_;  // rank 0: the reduction's tree so far
  std::uint64_t reduction_recorded_at_ = ~std::uint64_t{0};  // the committed rows journal_.reduction is of
  StepWork& work_;
  std::unique_ptr<comm::Communicator> exchange_;  // exchanged outputs' all-to-all
  std::vector<std::unique_ptr<detail::OutputSink>> sinks_;
  detail::SegmentFile segment_;
  std::uint64_t segment_first_row_ = 0;  // pass row where the open segment starts
  std::vector<std::uint64_t> segment_first_sums_;  // rank 0: each output's qsum64 where it starts
  Journal journal_;
  Batches batches_;
  std::vector<std::unique_ptr<h5::RowReader>> readers_;
  std::vector<std::unique_ptr<h5::StoredChunkReader>> chunk_readers_;
  std::vector<std::unique_ptr<h5::RowFilesReader>> file_readers_;  // inputs kept in plain files
  PassOutcome outcome_;
  Clock::time_point start_;
  CheckpointPace pace_{std::nullopt};
  double base_wall_ = 0, base_compute_ = 0;
};

}  // namespace

StreamEngine::StreamEngine(Backend& backend, const mpi::Comm& comm, EngineOptions options)
    : backend_(backend), comm_(comm), options_(options) {
  if (options_.slots < 2) throw InputError("the streaming engine needs at least 2 buffer slots");
}

BatchPlan StreamEngine::plan(const PassSpec& spec) const {
  if (spec.tile_rows == 0) throw std::logic_error("PassSpec.tile_rows must be positive");
  for (const auto& o : spec.outputs) {
    if (o.layout.chunk.empty() || o.layout.shape.empty() || o.layout.chunk.size() != o.layout.shape.size())
      throw std::logic_error(fmt::format("output '{}' needs a shape and a chunk shape of the same rank", o.name));
    if (o.kind != OutputKind::appended && spec.tile_rows % o.layout.chunk[0] != 0)
      throw std::logic_error("output chunk rows must divide the pass's tile_rows");
    if ((o.kind == OutputKind::appended) != (o.max_rows_per_row > 0))
      throw std::logic_error(fmt::format("output '{}': max_rows_per_row is for appended outputs, and they need it", o.name));
    if ((o.kind == OutputKind::coded_chunks) != o.codec.has_value())
      throw std::logic_error(fmt::format("output '{}': codec settings are for coded_chunks outputs, and they need them", o.name));
  }
  check_batches(spec);
  for (const auto& in : spec.inputs) {
    if (in.kind == InputKind::stored_chunks && !spec.batches.empty())
      throw std::logic_error("stored-chunks inputs are read in whole tiles; explicit batches are not supported");
    if (in.kind == InputKind::row_ranges && spec.batches.empty())
      throw std::logic_error("row_ranges inputs need explicit batches (a range per batch)");
  }
  const auto sinks = detail::make_sinks(spec, comm_, nullptr);  // (checks coded outputs' types)
  std::uint64_t unit_rows = spec.tile_rows;  // the smallest batch the engine may choose
  if (!spec.batches.empty()) {
    // Explicit batches: the largest one, whole, is the unit that must fit.
    unit_rows = 0;
    for (const auto& r : spec.batches) unit_rows = std::max(unit_rows, r.size());
  }
  const PerBatchBytes b =
      per_batch_bytes(spec, sinks, unit_rows, backend_.kind());
  const auto S = static_cast<std::uint64_t>(options_.slots);
  // Each slot also holds, whatever its rows: its outputs' counts and checksums, its BLAS workspace.
  const std::uint64_t slot_device = b.fixed_per_slot + (spec.uses_blas ? backend_.blas_stream_bytes() : 0);
  const std::uint64_t resident_device = spec.resident_device_bytes + b.fixed_device;
  const std::uint64_t fixed_device = resident_device + S * slot_device;
  const std::uint64_t fixed_host = S * b.fixed_per_slot;
  // What the budgets have left for the pass: memory its stage holds outside it (sci.solve's stored
  // H kept for the next iteration) is in use now; idle pooled memory is not (it is freed to fit).
  const std::uint64_t dev_limit = backend_.device_budget().left(), host_limit = backend_.host_budget().left();
  const auto held = [](const MemoryBudget& m) {
    return m.in_use() ? fmt::format(" ({} of it held outside this pass)", format_bytes(static_cast<double>(m.in_use()))) : "";
  };
  auto need = [&](std::uint64_t tiles, std::uint64_t fixed, std::uint64_t per_tile) { return fixed + S * tiles * per_tile; };
  if (need(1, fixed_device, b.device_per_tile) > dev_limit)
    throw InputError(fmt::format(
        "device memory budget {}{} is too small: one batch of {} rows needs {} ({} resident + {} slots x {} per "
        "batch); expected at least that much (--device-memory or options.device_memory)",
        format_bytes(static_cast<double>(backend_.device_budget().limit())), held(backend_.device_budget()), unit_rows,
        format_bytes(static_cast<double>(need(1, fixed_device, b.device_per_tile))),
        format_bytes(static_cast<double>(resident_device)), S,
        format_bytes(static_cast<double>(slot_device + b.device_per_tile))));
  if (need(1, fixed_host, b.host_per_tile) > host_limit)
    throw InputError(fmt::format("host memory budget {}{} is too small: one batch of {} rows needs {} ({} slots x {}); "
                                 "expected at least that much (--host-memory or options.host_memory)",
                                 format_bytes(static_cast<double>(backend_.host_budget().limit())),
                                 held(backend_.host_budget()), unit_rows,
                                 format_bytes(static_cast<double>(need(1, fixed_host, b.host_per_tile))), S,
                                 format_bytes(static_cast<double>(b.fixed_per_slot + b.host_per_tile))));
  if (spec.prepare_host_bytes > host_limit)
    throw InputError(fmt::format("host memory budget {} is too small: loading the resident data needs {} "
                                 "(--host-memory or options.host_memory)",
                                 format_bytes(static_cast<double>(host_limit)),
                                 format_bytes(static_cast<double>(spec.prepare_host_bytes))));
  std::uint64_t tiles = std::min((dev_limit - fixed_device) / (S * std::max<std::uint64_t>(b.device_per_tile, 1)),
                                 (host_limit - fixed_host) / (S * std::max<std::uint64_t>(b.host_per_tile, 1)));
  // The cap counts what a batch's buffers hold: an appended output's room for the most rows a
  // pass row may append (sci.solve's generation: some 30,000 candidates a source), not one row,
  // else a batch of sources reserved tens of GB of pinned memory per slot to fill a few MB.
  std::uint64_t row = b.in_per_row;
  for (const auto& o : spec.outputs) row += o.row_bytes() * std::max<std::uint64_t>(1, o.max_rows_per_row);
  if (row) tiles = std::min(tiles, std::max<std::uint64_t>(1, options_.max_batch_bytes / (row * spec.tile_rows)));
  if (options_.max_batch_rows)
    tiles = std::min(tiles, std::max<std::uint64_t>(1, options_.max_batch_rows / spec.tile_rows));
  // Not more than the pass has. (The rank count must not enter: the batch grid is the same for
  // any number of ranks, so a batch's arithmetic is too.)
  tiles = std::clamp<std::uint64_t>(tiles, 1, std::max<std::uint64_t>(1, ceil_div(spec.rows, spec.tile_rows)));
  BatchPlan plan;
  if (!spec.batches.empty()) tiles = 1;  // the explicit batches are the batches
  plan.batch_rows = plan.buffer_rows = tiles * unit_rows;
  plan.device_bytes = need(tiles, fixed_device, b.device_per_tile);
  plan.host_bytes = need(tiles, fixed_host, b.host_per_tile);
  // The buffers sized for the batch's size class, where both budgets allow it.
  const bool explicit_batches = !spec.batches.empty();
  const std::uint64_t class_unit = explicit_batches ? size_class(unit_rows) : unit_rows;
  const std::uint64_t class_tiles = explicit_batches ? 1 : size_class(tiles);
  const PerBatchBytes c = per_batch_bytes(spec, sinks, class_unit, backend_.kind(), true);
  const std::uint64_t class_device = need(class_tiles, fixed_device, c.device_per_tile);
  const std::uint64_t class_host = need(class_tiles, fixed_host, c.host_per_tile);
  if (class_device <= dev_limit && class_host <= host_limit) {
    plan.buffer_rows = class_tiles * class_unit;
    plan.size_classes = true;
    plan.device_bytes = class_device;
    plan.host_bytes = class_host;
  }
  return plan;
}

PassOutcome StreamEngine::run(const PassSpec& spec, PassKernel& kernel, Reduction* reduction, StepWork& work,
                              const fs::path& output, const ProgressFn& progress) {
  const BatchPlan plan = this->plan(spec);
  // (What the pass gave back stays in the backend's pools for the step's next passes.)
  return PassRun(backend_, comm_, options_, spec, kernel, reduction, work).run(plan, output, progress);
}

h5::File StagedOutput::open() const { return h5::File::open(temp_, h5::Mode::read_write, comm_->get()); }

void StagedOutput::commit() const {
  comm_->barrier();
  if (comm_->root()) fsutil::commit_rename(temp_, final_);
  comm_->barrier();
}

}  // namespace qstage::engine
