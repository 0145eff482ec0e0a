#pragma once
// Spilled intermediates kept compressed (tn.contract's compress_spilled, seed 003's use of the
// codec): each block an out-of-core step copies out is coded on the device by the codec's GPU
// kernels (the CPU coder on cpu), and only its stream goes to host memory, charged to the host
// budget; the plan's pinned host arena is not allocated. A block copied back in is decoded from
// the streams that cover its range: a later step may cut a tensor into other blocks than the
// step that made it, so a stream is decoded whole and the overlap copied.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "io/codec/codec.hpp"
#include "kernels/codec.hpp"

namespace qstage::tn {

class CompressedSpill {
 public:
  // `largest_block_bytes`: the largest block any step copies out (complex64 values).
  CompressedSpill(codec::Settings settings, std::uint64_t largest_block_bytes);
  ~CompressedSpill();
  // Device memory prepare() takes: a decoded block, a stream's device copy, two codec workspaces.
  static std::uint64_t device_bytes(BackendKind kind, std::uint64_t largest_block_bytes);
  void prepare(Backend& backend, Stream& in, Stream& out);
  // Codes `bytes` at `src` (device memory, after the work queued on `out`) as the range
  // [offset, offset + bytes) of the host arena; replaces what that range held.
  void store(std::uint64_t offset, const char* src, std::uint64_t bytes);
  // Decodes the arena range [offset, offset + bytes) into `dst` (device memory), on `in`.
  void fetch(char* dst, std::uint64_t offset, std::uint64_t bytes);
  std::uint64_t raw_bytes() const { return raw_bytes_; }        // summed over every store
  std::uint64_t stored_bytes() const { return stored_bytes_; }  // their streams' bytes

 private:
  struct Segment {
    std::uint64_t bytes = 0;
    std::vector<std::uint8_t> stream;
  };
  void drop(std::map<std::uint64_t, Segment>::iterator it);

  codec::Settings settings_;
  std::uint64_t largest_;
  Backend* backend_ = nullptr;
  Stream *in_ = nullptr, *out_ = nullptr;
  std::map<std::uint64_t, Segment> segments_;  // by arena offset; never overlapping
  Buffer decoded_, stream_copy_;
#ifdef QSTAGE_HAVE_CUDA
  std::unique_ptr<kernels::GpuCodec> coder_, decoder_;  // on `out` and `in`
#endif
  std::uint64_t raw_bytes_ = 0, stored_bytes_ = 0;
};

}  // namespace qstage::tn
