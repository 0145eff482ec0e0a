#include "stages/tn/compressed_spill.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace qstage::tn {

CompressedSpill::CompressedSpill(codec::Settings settings, std::uint64_t largest_block_bytes)
    : settings_(settings), largest_(largest_block_bytes) {}

CompressedSpill::~CompressedSpill() {
  if (backend_)
    for (auto& [offset, s] : segments_) backend_->host_budget().release(s.stream.size());
}

std::uint64_t CompressedSpill::device_bytes(BackendKind kind, std::uint64_t largest) {
  const std::uint64_t elements = largest / 8;
  return largest + codec::max_stream_bytes(codec::ElementType::complex64, elements) +
         (kind == BackendKind::cuda ? 2 * kernels::codec_device_bytes(elements) : 0);
}

void CompressedSpill::prepare(Backend& backend, Stream& in, Stream& out) {
  backend_ = &backend;
  in_ = &in;
  out_ = &out;
  decoded_ = backend.alloc_device(std::max<std::uint64_t>(largest_, 1), "tn: a decoded spilled block");
  stream_copy_ = backend.alloc_device(codec::max_stream_bytes(codec::ElementType::complex64, largest_ / 8),
                                      "tn: a spilled block's stream");
#ifdef QSTAGE_HAVE_CUDA
  if (backend.kind() == BackendKind::cuda) {
    coder_ = std::make_unique<kernels::GpuCodec>(backend, out);
    decoder_ = std::make_unique<kernels::GpuCodec>(backend, in);
  }
#endif
}

void CompressedSpill::drop(std::map<std::uint64_t, Segment>::iterator it) {
  backend_->host_budget().release(it->second.stream.size());
  segments_.erase(it);
}

void CompressedSpill::store(std::uint64_t offset, const char* src, std::uint64_t bytes) {
  // Whatever overlapped the range belonged to tensors the plan has retired.
  auto it = segments_.upper_bound(offset);
  if (it != segments_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > offset) --it;
  while (it != segments_.end() && it->first < offset + bytes) drop(it++);
  kernels::GpuCodec* gpu = nullptr;
#ifdef QSTAGE_HAVE_CUDA
  gpu = coder_.get();
#endif
  // Relative bounds refer to this block's own range (nullopt): the whole tensor's is not known
  // until its last block is computed.
  Segment s{bytes, kernels::codec_encode(*backend_, *out_, reinterpret_cast<const float*>(src),
                                         codec::ElementType::complex64, {bytes / 8}, settings_, std::nullopt, gpu)};
  backend_->host_budget().charge(s.stream.size(), "tn: compressed spilled blocks");
  raw_bytes_ += bytes;
  stored_bytes_ += s.stream.size();
  segments_.emplace(offset, std::move(s));
}

void CompressedSpill::fetch(char* dst, std::uint64_t offset, std::uint64_t bytes) {
  kernels::GpuCodec* gpu = nullptr;
#ifdef QSTAGE_HAVE_CUDA
  gpu = decoder_.get();
#endif
  auto it = segments_.upper_bound(offset);
  if (it != segments_.begin()) --it;
  std::uint64_t covered = 0;
  for (; it != segments_.end() && it->first < offset + bytes; ++it) {
    const std::uint64_t begin = it->first, end = begin + it->second.bytes;
    if (end <= offset) continue;
    const std::vector<std::uint8_t>& stream = it->second.stream;
    backend_->copy_to_device(stream_copy_.data(), stream.data(), stream.size(), *in_);
    const bool whole = begin == offset && end == offset + bytes;
    char* target = whole ? dst : decoded_.as<char>();
    kernels::codec_decode(*backend_, *in_, stream.data(), stream.size(), stream_copy_.as<std::uint8_t>(),
                          reinterpret_cast<float*>(target), it->second.bytes / 4, gpu);
    const std::uint64_t from = std::max(begin, offset), to = std::min(end, offset + bytes);
    if (!whole) backend_->copy_on_device(dst + (from - offset), target + (from - begin), to - from, *in_);
    in_->synchronize();  // the stream copy and the decoded block are reused by the next segment
    covered += to - from;
  }
  if (covered != bytes)
    throw std::logic_error(fmt::format("tn: the compressed spill holds {} of the {} bytes at offset {}", covered,
                                       bytes, offset));
}

}  // namespace qstage::tn
