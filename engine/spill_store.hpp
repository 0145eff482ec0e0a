#pragma once
// The spill store: what a stage computes on the device but cannot keep there, held on the host
// side and moved back when it is needed. Its contents are byte ranges of one address space
// [0, space_bytes) - a tensor network plan's host arena, say - stored from device memory and
// fetched into it by offset; a fetch may cut the space into other ranges than the stores did.
//
// Where the ranges live, one tier per store, chosen when it is made:
//   - pinned:  one pinned host buffer of space_bytes, charged to the host budget (the default);
//   - scratch: a chunked HDF5 file in a scratch folder, when the space exceeds the host share the
//              store may take (and a scratch folder is given); blocks pass through pinned bounce
//              buffers, and the file is removed with the store;
//   - coded:   every stored range kept as a codec stream in host memory (complex64 values),
//              coded and decoded on the device (kernels/codec/backend_codec.hpp); only the streams are charged
//              to the host budget. A store replaces every stream its range overlaps, so a fetch
//              must lie in ranges stored since.
// Copies run on two streams of the store's own, one in and one out, so they overlap with the
// caller's compute; the caller orders them against its streams with recorded points
// (fetches_wait, fetched, stores_wait, stored), as Stream::record and Stream::wait do. The
// scratch and coded tiers finish each copy before store or fetch returns (the file and the
// codec's framing are host work). Not thread-safe: one thread queues all stores and fetches.
//
// Who uses it: tn.contract's out-of-core steps (stages/tn/contractor.cpp); docs/design.md,
// "The spill store".
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.hpp"
#include "codec/codec.hpp"

namespace qstage::engine {

class SpillStore {
 public:
  enum class Tier { pinned, scratch, coded };

  struct Options {
    std::string owner = "spill store";  // names the user in messages and budget charges ("tn")
    std::uint64_t space_bytes = 0;      // stores and fetches lie in [0, space_bytes)
    std::uint64_t largest_store_bytes = 0;  // the most one store moves
    std::uint64_t largest_fetch_bytes = 0;  // the most one fetch moves
    // The host memory the pinned tier may take; nullopt: what the host budget has free. A space
    // larger than that goes to the scratch tier if a scratch folder is given; else it is an error.
    std::optional<std::uint64_t> host_share;
    std::optional<std::filesystem::path> scratch_dir;
    // Keeps the ranges as codec streams (the coded tier): the space then holds complex64 values.
    std::optional<codec::Settings> coded;
  };

  // Throws InputError when the space fits no tier, or the scratch file cannot be made.
  SpillStore(Backend& backend, Options options);
  ~SpillStore();
  SpillStore(const SpillStore&) = delete;
  SpillStore& operator=(const SpillStore&) = delete;

  // Device memory a store with these options takes (the coded tier's workspace), for planning.
  static std::uint64_t device_bytes(BackendKind kind, const Options& options);

  Tier tier() const { return tier_; }
  static const char* tier_name(Tier tier);

  // Copies `bytes` of device memory at `src` into the range at `offset` (on the out stream,
  // after the points stores_wait gave it). The caller keeps `src` unchanged until stored().
  void store(std::uint64_t offset, const void* src, std::uint64_t bytes);
  // Copies the range at `offset` into device memory at `dst` (on the in stream, after the points
  // fetches_wait gave it). Throws std::logic_error if the store does not hold the whole range.
  void fetch(void* dst, std::uint64_t offset, std::uint64_t bytes);

  // Ordering with the caller's streams: later stores (fetches) wait for `point`, and stored()
  // (fetched()) marks the end of those queued so far.
  void stores_wait(const Stream::Point& point);
  void fetches_wait(const Stream::Point& point);
  Stream::Point stored();
  Stream::Point fetched();

  // What it holds: bytes in `tier` now (pinned: the buffer; scratch: the file; coded: the
  // streams), and the most host memory it has held at once (buffers, bounce buffers, streams).
  std::uint64_t held_bytes(Tier tier) const;
  std::uint64_t peak_host_bytes() const { return peak_host_bytes_; }
  // Summed over every store: the bytes given, and the bytes kept (coded: the streams' bytes).
  std::uint64_t stored_raw_bytes() const { return stored_raw_bytes_; }
  std::uint64_t stored_kept_bytes() const { return stored_kept_bytes_; }

  class TierStorage;  // one per tier (spill_store.cpp)

 private:
  void check_range(const char* operation, std::uint64_t offset, std::uint64_t bytes) const;
  void note_host_bytes();

  Backend& backend_;
  Options options_;
  Tier tier_;
  std::unique_ptr<Stream> in_, out_;  // copies to the device and from it
  std::unique_ptr<TierStorage> storage_;
  std::uint64_t peak_host_bytes_ = 0;
  std::uint64_t stored_raw_bytes_ = 0, stored_kept_bytes_ = 0;
};

}  // namespace qstage::engine
