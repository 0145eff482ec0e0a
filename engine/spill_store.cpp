#include "engine/spill_store.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "kernels/codec/backend_codec.hpp"

namespace qstage::engine {

// Where one tier keeps the ranges. The store checks bounds and holds() before it calls these.
class SpillStore::TierStorage {
 public:
  virtual ~TierStorage() = default;
  // Returns the bytes the tier keeps for the range (its stream's, coded).
  virtual std::uint64_t store(std::uint64_t offset, const char* src, std::uint64_t bytes) = 0;
  virtual void fetch(char* dst, std::uint64_t offset, std::uint64_t bytes) = 0;
  virtual bool holds(std::uint64_t offset, std::uint64_t bytes) const = 0;
  virtual std::uint64_t held_bytes() const = 0;  // in the tier
  virtual std::uint64_t host_bytes() const = 0;  // host memory it takes now
};

namespace {

using TierStorage = SpillStore::TierStorage;

// The parts of a flat space stored so far (pinned and scratch tiers, where a store overwrites
// just its own range): disjoint ranges, merged where they touch.
class StoredRanges {
 public:
  void add(std::uint64_t begin, std::uint64_t end) {
    auto it = ends_.upper_bound(begin);
    if (it != ends_.begin() && std::prev(it)->second >= begin) begin = (--it)->first;
    while (it != ends_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = ends_.erase(it);
    }
    ends_.emplace(begin, end);
  }
  bool covers(std::uint64_t begin, std::uint64_t end) const {
    auto it = ends_.upper_bound(begin);
    return begin == end || (it != ends_.begin() && std::prev(it)->second >= end);
  }

 private:
  std::map<std::uint64_t, std::uint64_t> ends_;  // begin -> end
};

// One pinned buffer mirrors the space; copies are asynchronous on the store's streams.
class PinnedTier final : public TierStorage {
 public:
  PinnedTier(Backend& backend, Stream& in, Stream& out, const SpillStore::Options& o)
      : backend_(backend), in_(in), out_(out),
        arena_(backend.alloc_host(std::max<std::uint64_t>(o.space_bytes, 1),
                                  fmt::format("{}: host arena (spilled intermediates)", o.owner))) {}
  std::uint64_t store(std::uint64_t offset, const char* src, std::uint64_t bytes) override {
    backend_.copy_to_host(arena_.as<char>() + offset, src, bytes, out_);
    stored_.add(offset, offset + bytes);
    return bytes;
  }
  void fetch(char* dst, std::uint64_t offset, std::uint64_t bytes) override {
    backend_.copy_to_device(dst, arena_.as<char>() + offset, bytes, in_);
  }
  bool holds(std::uint64_t offset, std::uint64_t bytes) const override { return stored_.covers(offset, offset + bytes); }
  std::uint64_t held_bytes() const override { return arena_.size(); }
  std::uint64_t host_bytes() const override { return arena_.size(); }

 private:
  Backend& backend_;
  Stream &in_, &out_;
  Buffer arena_;
  StoredRanges stored_;
};

// The space as one chunked byte dataset of an HDF5 file in the scratch folder, removed with the
// tier. Blocks pass through pinned bounce buffers (one each way), synchronously: HDF5 reads and
// writes host memory, on this thread.
class ScratchTier final : public TierStorage {
 public:
  ScratchTier(Backend& backend, Stream& in, Stream& out, const SpillStore::Options& o)
      : backend_(backend), in_(in), out_(out), bytes_(o.space_bytes) {
    std::random_device random;
    path_ = *o.scratch_dir / fmt::format("qstage-scratch-{}-{:08x}.h5", static_cast<long>(::getpid()), random());
    try {
      file_ = h5::File::create(path_);
      data_ = file_.create_dataset("arena", {h5::DType::uint8, {bytes_}, {std::min<std::uint64_t>(bytes_, 4u << 20)}, false});
    } catch (const h5::Error& e) {
      std::filesystem::remove(path_);
      throw InputError(fmt::format("{}: cannot create the scratch file '{}' ({}); expected a writable scratch_dir "
                                   "with {} free", o.owner, path_.string(), e.reason(),
                                   format_bytes(static_cast<double>(bytes_))));
    }
    const std::string bounce = fmt::format("{}: bounce buffer for the scratch file", o.owner);
    bounce_in_ = backend.alloc_host(std::max<std::uint64_t>(o.largest_fetch_bytes, 1), bounce);
    bounce_out_ = backend.alloc_host(std::max<std::uint64_t>(o.largest_store_bytes, 1), bounce);
  }
  ~ScratchTier() override {
    data_ = {};
    file_ = {};
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  std::uint64_t store(std::uint64_t offset, const char* src, std::uint64_t bytes) override {
    check_fits(bytes, bounce_out_, "store");
    backend_.copy_to_host(bounce_out_.data(), src, bytes, out_);
    out_.synchronize();
    data_.write_rows(offset, bytes, bounce_out_.data());
    stored_.add(offset, offset + bytes);
    return bytes;
  }
  void fetch(char* dst, std::uint64_t offset, std::uint64_t bytes) override {
    check_fits(bytes, bounce_in_, "fetch");
    in_.synchronize();  // the bounce buffer's previous block has left
    data_.read_rows(offset, bytes, bounce_in_.data());
    backend_.copy_to_device(dst, bounce_in_.data(), bytes, in_);
  }
  bool holds(std::uint64_t offset, std::uint64_t bytes) const override { return stored_.covers(offset, offset + bytes); }
  std::uint64_t held_bytes() const override { return bytes_; }
  std::uint64_t host_bytes() const override { return bounce_in_.size() + bounce_out_.size(); }

 private:
  static void check_fits(std::uint64_t bytes, const Buffer& bounce, const char* operation) {
    if (bytes > bounce.size())
      throw std::logic_error(fmt::format("spill store: a {} of {} bytes exceeds the largest the store was made for ({})",
                                         operation, bytes, bounce.size()));
  }

  Backend& backend_;
  Stream &in_, &out_;
  std::uint64_t bytes_;
  std::filesystem::path path_;
  h5::File file_;
  h5::Dataset data_;
  Buffer bounce_in_, bounce_out_;
  StoredRanges stored_;
};

// Every stored range as a codec stream in host memory (complex64 values), coded on the device
// by the codec's GPU kernels (the CPU coder on cpu). A range fetched is decoded from the streams
// that cover it: a later fetch may cut the space into other ranges than the stores did, so a
// stream is decoded whole and the overlap copied.
class CodedTier final : public TierStorage {
 public:
  CodedTier(Backend& backend, Stream& in, Stream& out, const SpillStore::Options& o)
      : backend_(backend), in_(in), out_(out), settings_(*o.coded), owner_(o.owner),
        largest_(o.largest_store_bytes) {
    decoded_ = backend.alloc_device(std::max<std::uint64_t>(largest_, 1), fmt::format("{}: a decoded spilled block", owner_));
    stream_copy_ = backend.alloc_device(codec::max_stream_bytes(codec::ElementType::complex64, largest_ / 8),
                                        fmt::format("{}: a spilled block's stream", owner_));
#ifdef QSTAGE_HAVE_CUDA
    if (backend.kind() == BackendKind::cuda) {
      coder_ = std::make_unique<kernels::GpuCodec>(backend, out);
      decoder_ = std::make_unique<kernels::GpuCodec>(backend, in);
    }
#endif
  }
  ~CodedTier() override { backend_.host_budget().release(stream_bytes_); }

  // Device memory it takes: a decoded block, a stream's device copy, and on cuda two codec
  // workspaces (coder and decoder).
  static std::uint64_t device_bytes(BackendKind kind, std::uint64_t largest) {
    const std::uint64_t elements = largest / 8;
    return largest + codec::max_stream_bytes(codec::ElementType::complex64, elements) +
           (kind == BackendKind::cuda ? 2 * kernels::codec_device_bytes(elements) : 0);
  }

  std::uint64_t store(std::uint64_t offset, const char* src, std::uint64_t bytes) override {
    if (bytes > largest_)
      throw std::logic_error(fmt::format("spill store: a store of {} bytes exceeds the largest the store was made "
                                         "for ({})", bytes, largest_));
    // Whatever overlapped the range belonged to data its user has retired.
    for (auto it = first_overlapping(offset); it != segments_.end() && it->first < offset + bytes;) it = drop(it);
    kernels::GpuCodec* gpu = nullptr;
#ifdef QSTAGE_HAVE_CUDA
    gpu = coder_.get();
#endif
    // Relative bounds refer to this block's own range (nullopt): the whole tensor's is not known
    // until its last block is computed.
    Segment s{bytes, kernels::codec_encode(backend_, out_, reinterpret_cast<const float*>(src),
                                           codec::ElementType::complex64, {bytes / 8}, settings_, std::nullopt, gpu)};
    const std::uint64_t kept = s.stream.size();
    backend_.host_budget().charge(kept, fmt::format("{}: compressed spilled blocks", owner_));
    stream_bytes_ += kept;
    segments_.emplace(offset, std::move(s));
    return kept;
  }

  void fetch(char* dst, std::uint64_t offset, std::uint64_t bytes) override {
    kernels::GpuCodec* gpu = nullptr;
#ifdef QSTAGE_HAVE_CUDA
    gpu = decoder_.get();
#endif
    for (auto it = first_overlapping(offset); it != segments_.end() && it->first < offset + bytes; ++it) {
      const std::uint64_t begin = it->first, end = begin + it->second.bytes;
      const std::vector<std::uint8_t>& stream = it->second.stream;
      backend_.copy_to_device(stream_copy_.data(), stream.data(), stream.size(), in_);
      const bool whole = begin == offset && end == offset + bytes;
      char* target = whole ? dst : decoded_.as<char>();
      kernels::codec_decode(backend_, in_, stream.data(), stream.size(), stream_copy_.as<std::uint8_t>(),
                            reinterpret_cast<float*>(target), it->second.bytes / 4, gpu);
      const std::uint64_t from = std::max(begin, offset), to = std::min(end, offset + bytes);
      if (!whole) backend_.copy_on_device(dst + (from - offset), target + (from - begin), to - from, in_);
      in_.synchronize();  // the stream copy and the decoded block are reused by the next segment
    }
  }

  bool holds(std::uint64_t offset, std::uint64_t bytes) const override {
    std::uint64_t covered = offset;  // segments never overlap: they must follow on without a gap
    for (auto it = first_overlapping(offset); it != segments_.end() && it->first < offset + bytes; ++it) {
      if (it->first > covered) return false;
      covered = it->first + it->second.bytes;
    }
    return covered >= offset + bytes;
  }
  std::uint64_t held_bytes() const override { return stream_bytes_; }
  std::uint64_t host_bytes() const override { return stream_bytes_; }

 private:
  struct Segment {
    std::uint64_t bytes = 0;
    std::vector<std::uint8_t> stream;
  };
  using Segments = std::map<std::uint64_t, Segment>;  // by offset; never overlapping

  // The first segment that ends after `offset`, or the first after it.
  Segments::const_iterator first_overlapping(std::uint64_t offset) const {
    auto it = segments_.upper_bound(offset);
    if (it != segments_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > offset) --it;
    return it;
  }
  Segments::const_iterator drop(Segments::const_iterator it) {  // returns the next
    backend_.host_budget().release(it->second.stream.size());
    stream_bytes_ -= it->second.stream.size();
    return segments_.erase(it);
  }

  Backend& backend_;
  Stream &in_, &out_;
  codec::Settings settings_;
  std::string owner_;
  std::uint64_t largest_;
  Segments segments_;
  Buffer decoded_, stream_copy_;
#ifdef QSTAGE_HAVE_CUDA
  std::unique_ptr<kernels::GpuCodec> coder_, decoder_;  // on `out` and `in`
#endif
  std::uint64_t stream_bytes_ = 0;
};

// The tier the options ask for: coded if given settings; else pinned where the space fits the
// host share, else scratch where a folder is given.
SpillStore::Tier choose_tier(Backend& backend, const SpillStore::Options& o) {
  if (o.coded) return SpillStore::Tier::coded;
  const MemoryBudget& host = backend.host_budget();
  const std::uint64_t free = host.left();
  const std::uint64_t share = o.host_share.value_or(free);
  if (o.space_bytes <= share) return SpillStore::Tier::pinned;
  if (o.scratch_dir) return SpillStore::Tier::scratch;
  throw InputError(fmt::format("{}: {} of spilled data exceed the host memory the spill store may take ({}), and "
                               "no scratch folder is allowed; expected a larger host budget or a scratch file",
                               o.owner, format_bytes(static_cast<double>(o.space_bytes)),
                               format_bytes(static_cast<double>(share))));
}

}  // namespace

SpillStore::SpillStore(Backend& backend, Options options)
    : backend_(backend), options_(std::move(options)), tier_(choose_tier(backend, options_)),
      in_(backend.make_stream(false)), out_(backend.make_stream(false)) {
  switch (tier_) {
    case Tier::pinned: storage_ = std::make_unique<PinnedTier>(backend, *in_, *out_, options_); break;
    case Tier::scratch: storage_ = std::make_unique<ScratchTier>(backend, *in_, *out_, options_); break;
    case Tier::coded: storage_ = std::make_unique<CodedTier>(backend, *in_, *out_, options_); break;
  }
  note_host_bytes();
}

SpillStore::~SpillStore() {
  // Copies still queued read or write the tier's buffers, which go with it. (A failing device
  // has already reported its error through the caller's work.)
  try {
    in_->synchronize();
    out_->synchronize();
  } catch (...) {
  }
}

std::uint64_t SpillStore::device_bytes(BackendKind kind, const Options& options) {
  return options.coded ? CodedTier::device_bytes(kind, options.largest_store_bytes) : 0;
}

const char* SpillStore::tier_name(Tier tier) {
  switch (tier) {
    case Tier::pinned: return "pinned";
    case Tier::scratch: return "scratch";
    case Tier::coded: return "coded";
  }
  return "?";
}

void SpillStore::check_range(const char* operation, std::uint64_t offset, std::uint64_t bytes) const {
  if (offset > options_.space_bytes || bytes > options_.space_bytes - offset)
    throw std::logic_error(fmt::format("{}: a {} of [{}, {}) lies outside the spill store's {} bytes", options_.owner,
                                       operation, offset, offset + bytes, options_.space_bytes));
}

void SpillStore::note_host_bytes() { peak_host_bytes_ = std::max(peak_host_bytes_, storage_->host_bytes()); }

void SpillStore::store(std::uint64_t offset, const void* src, std::uint64_t bytes) {
  check_range("store", offset, bytes);
  stored_kept_bytes_ += storage_->store(offset, static_cast<const char*>(src), bytes);
  stored_raw_bytes_ += bytes;
  note_host_bytes();
}

void SpillStore::fetch(void* dst, std::uint64_t offset, std::uint64_t bytes) {
  check_range("fetch", offset, bytes);
  if (!storage_->holds(offset, bytes))
    throw std::logic_error(fmt::format("{}: a fetch of [{}, {}) from the spill store ({} tier), which holds only "
                                       "part of it or none: a range must be stored before it is fetched",
                                       options_.owner, offset, offset + bytes, tier_name(tier_)));
  storage_->fetch(static_cast<char*>(dst), offset, bytes);
}

void SpillStore::stores_wait(const Stream::Point& point) { out_->wait(point); }
void SpillStore::fetches_wait(const Stream::Point& point) { in_->wait(point); }
Stream::Point SpillStore::stored() { return out_->record(); }
Stream::Point SpillStore::fetched() { return in_->record(); }

std::uint64_t SpillStore::held_bytes(Tier tier) const { return tier == tier_ ? storage_->held_bytes() : 0; }

}  // namespace qstage::engine
