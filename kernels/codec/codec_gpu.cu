// The GPU codec's host side (GpuCodec, kernels/codec/backend_codec.hpp): its workspace, and the launches of
// a code or a decode queued on the codec's stream (the blocks: kernels/codec/codec_encode.cu and
// codec_decode.cu; a bitmap pipeline's compaction: kernels/scan.cu).
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/transform_iterator.h>

#include "kernels/codec/backend_codec.hpp"
#include "kernels/codec/blocks.cuh"
#include "kernels/scan.cuh"
#include "backend/cuda_check.hpp"

namespace qstage::kernels {

using namespace codec_gpu;

namespace {

// group, group2l: a value is kept where it is significant.
struct Significant {
  double t;
  __device__ bool operator()(float x) const { return significant(x, t); }
};

struct FiniteOr {
  float fallback;
  __device__ float operator()(float x) const { return is_finite(x) ? x : fallback; }
};
struct Min {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

std::uint64_t round_up(std::uint64_t b) { return (b + 255) / 256 * 256; }

std::uint64_t scan_temp_bytes(std::uint64_t items) {
  size_t bytes = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<unsigned long long*>(nullptr),
                                                  static_cast<unsigned long long*>(nullptr),
                                                  static_cast<std::int64_t>(items)));
  return bytes;
}

}  // namespace

// The look-back's state for `parts` components coded in one pass, zeroed: the CTAs' ticket, each
// component's payload total, and each component's tile words.
struct LookBack {
  unsigned long long *ticket, *totals, *tiles;
  std::uint64_t tiles_per_part;
  BlockBuffers part(int p, std::uint8_t* meta, std::uint8_t* payload) const {
    return {meta, payload, tiles + p * tiles_per_part, totals + p};
  }
};

std::uint64_t look_back_words(std::uint64_t blocks, int parts) {
  return 1 + parts * (1 + (blocks + kWarpsPerCta - 1) / kWarpsPerCta);
}
std::uint64_t look_back_bytes(std::uint64_t blocks, int parts) { return round_up(8 * look_back_words(blocks, parts)); }

// Device memory from the backend (charged to its budget), kept between calls and grown when a
// call needs more; each call carves it into aligned pieces.
struct GpuCodec::Impl {
  Backend& backend;
  Stream& stream;
  Buffer workspace;
  Buffer pinned;  // small results read back by the host (64 bytes: totals, then the decoders' error flag)
  std::uint64_t used = 0;
  // The last code()'s parts (code_pair: the two components'), in the workspace.
  struct Coded {
    std::uint8_t *meta = nullptr, *payload = nullptr, *bitmap = nullptr;
    std::uint64_t blocks = 0, coded = 0, payload_bytes = 0, bitmap_bytes = 0;
  } last[2];

  Impl(Backend& b, Stream& s) : backend(b), stream(s), pinned(b.alloc_host(64, "codec: results")) {}
  cudaStream_t cuda() const { return static_cast<cudaStream_t>(stream.native()); }
  void reserve(std::uint64_t bytes) {
    used = 0;
    if (workspace.size() >= bytes) return;
    workspace = Buffer();
    workspace = backend.alloc_device(bytes, "codec workspace");
  }
  template <typename T>
  T* take(std::uint64_t count) {
    T* p = reinterpret_cast<T*>(static_cast<char*>(workspace.data()) + used);
    used += round_up(count * sizeof(T));
    return p;
  }
  // `count` look-back words (tickets, tile words), zeroed on the codec's stream.
  unsigned long long* take_zeroed_words(std::uint64_t count) {
    auto* words = take<unsigned long long>(count);
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(words, 0, 8 * count, cuda()));
    return words;
  }
  LookBack take_look_back(std::uint64_t blocks, int parts) {
    auto* words = take_zeroed_words(look_back_words(blocks, parts));
    return {words, words + 1, words + 1 + parts, (blocks + kWarpsPerCta - 1) / kWarpsPerCta};
  }
  unsigned* decode_error() { return reinterpret_cast<unsigned*>(static_cast<char*>(pinned.data()) + 32); }
  unsigned* decode_error_on_device = nullptr;  // (the same flag as the kernels address it; found once)
  unsigned long long read_back(const unsigned long long* device_value) {
    auto* host = static_cast<unsigned long long*>(pinned.data());
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, device_value, sizeof *host, cudaMemcpyDeviceToHost, cuda()));
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(cuda()));
    return *host;
  }
};

GpuCodec::GpuCodec(Backend& backend, Stream& stream) : impl_(std::make_unique<Impl>(backend, stream)) {}
GpuCodec::~GpuCodec() = default;

void GpuCodec::code(const float* x, std::uint64_t n, int stride, const codec::detail::Coding& c) {
  Impl& w = *impl_;
  Impl::Coded& out = w.last[0];
  const cudaStream_t s = w.cuda();
  const bool grouped = codec::detail::groups(c.pipeline);
  const std::uint64_t bitmap_bytes = (n + 7) / 8, max_blocks = codec::detail::div_up(n, c.block);
  const std::uint64_t temp = grouped ? scan_temp_bytes(bitmap_bytes + 1) : 0;
  // Upper bounds: at most n values are coded, and a block's payload is at most 4 bytes a value.
  w.reserve(round_up(3 * max_blocks) + round_up(4 * n) + look_back_bytes(max_blocks, 1) + round_up(temp) +
            (grouped ? round_up(4 * n) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  out.meta = w.take<std::uint8_t>(3 * max_blocks);
  out.payload = w.take<std::uint8_t>(4 * n);
  const LookBack look_back = w.take_look_back(max_blocks, 1);
  const float* values = x;
  int value_stride = stride;
  out.coded = n;
  out.bitmap_bytes = grouped ? bitmap_bytes : 0;
  if (grouped) {
    void* temp_storage = w.take<std::uint8_t>(temp);
    out.bitmap = w.take<std::uint8_t>(bitmap_bytes);
    auto* counts = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* ranks = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* kept = w.take<float>(n);
    kernels::detail::launch_flags(s, x, n, stride, Significant{c.t}, out.bitmap, counts);
    QSTAGE_CUDA_CHECK_LAUNCH();
    size_t tb = temp;
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(bitmap_bytes + 1), s));
    if (n) kernels::detail::compact_cuda(s, x, n, stride, out.bitmap, ranks, kept);
    out.coded = w.read_back(ranks + bitmap_bytes);
    values = kept;
    value_stride = 1;
  }
  const BlockRules rules = codec::detail::rules_for(c);
  out.blocks = codec::detail::div_up(out.coded, c.block);
  if (out.blocks)
    code_blocks(s, values, out.coded, value_stride, rules, c.block, out.blocks, look_back.part(0, out.meta, out.payload),
                look_back.ticket);
  out.payload_bytes = w.read_back(look_back.totals);
}

codec::detail::ComponentParts GpuCodec::parts(int component) const {
  const Impl& w = *impl_;
  const Impl::Coded& c = w.last[component];
  codec::detail::ComponentParts p;
  p.coded = c.coded;
  p.bitmap.resize(c.bitmap_bytes);
  p.meta.resize(3 * c.blocks);
  p.payload.resize(c.payload_bytes);
  // (code() laid the meta out for the blocks it coded: their states, then their sizes.)
  const cudaStream_t s = w.cuda();
  if (c.bitmap_bytes) QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.bitmap.data(), c.bitmap, c.bitmap_bytes, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.meta.data(), c.meta, 3 * c.blocks, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(p.payload.data(), c.payload, c.payload_bytes, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  return p;
}

bool GpuCodec::can_code_pair(const codec::detail::Coding& coding, const float* x) {
  return !codec::detail::groups(coding.pipeline) && reinterpret_cast<std::uintptr_t>(x) % alignof(float2) == 0;
}

void GpuCodec::code_pair(const float* x, std::uint64_t n, const codec::detail::Coding& c) {
  if (!can_code_pair(c, x)) throw std::logic_error("GpuCodec::code_pair: a bitmap pipeline or unaligned values");
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  const std::uint64_t blocks = codec::detail::div_up(n, c.block);
  w.reserve(2 * (round_up(3 * blocks) + round_up(4 * n)) + look_back_bytes(blocks, 2));
  for (Impl::Coded& out : w.last) {
    out = Impl::Coded{};
    out.meta = w.take<std::uint8_t>(3 * blocks);
    out.payload = w.take<std::uint8_t>(4 * n);
    out.coded = n;
    out.blocks = blocks;
  }
  const LookBack look_back = w.take_look_back(blocks, 2);
  if (blocks)
    code_pair_blocks(s, reinterpret_cast<const float2*>(x), n, codec::detail::rules_for(c), c.block, blocks,
                     look_back.part(0, w.last[0].meta, w.last[0].payload),
                     look_back.part(1, w.last[1].meta, w.last[1].payload), look_back.ticket);
  auto* host = static_cast<unsigned long long*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, look_back.totals, 2 * sizeof *host, cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  w.last[0].payload_bytes = host[0];
  w.last[1].payload_bytes = host[1];
}

std::vector<codec::detail::ComponentParts> GpuCodec::code_all(const float* x, std::uint64_t n, int parts,
                                                              const codec::detail::Coding& c) {
  std::vector<codec::detail::ComponentParts> out;
  if (parts == 2 && can_code_pair(c, x)) {
    code_pair(x, n, c);
    out.push_back(this->parts(0));
    out.push_back(this->parts(1));
    return out;
  }
  for (int part = 0; part < parts; ++part) {
    code(x + part, n, parts, c);
    out.push_back(this->parts(0));
  }
  return out;
}

namespace {

// Workspace for component_blocks: `parts` meta copies and offsets of `blocks` blocks each, and
// the offsets scan's look-back state.
std::uint64_t offsets_items(std::uint64_t blocks, int parts) { return parts * (blocks + 1); }
std::uint64_t offsets_look_back_words(std::uint64_t blocks, int parts) {
  return scan_scratch_words(offsets_items(blocks, parts));
}
std::uint64_t component_blocks_bytes(std::uint64_t blocks, int parts) {
  return parts * round_up(3 * blocks) + round_up(8 * offsets_items(blocks, parts)) +
         round_up(8 * offsets_look_back_words(blocks, parts));
}

// `parts` components' blocks on the device (cs[k] into out[k]): each one's meta (read where it
// lies in the stream when stored raw, as integrated does; zstd-packed meta comes from the host)
// and its blocks' payload offsets (one scan over all the components' blocks), queued on the
// codec's stream. (The host checked, parsing the stream, that each component's sizes add up to
// its payload.)
void component_blocks(GpuCodec::Impl& w, const codec::detail::StoredComponent* const* cs, int parts,
                      const std::uint8_t* device_stream, std::uint64_t blocks, ComponentBlocks* out) {
  const cudaStream_t s = w.cuda();
  PayloadSize sizes{{nullptr, nullptr}, blocks};
  unsigned long long before = 0;
  for (int k = 0; k < parts; ++k) {
    const codec::detail::StoredComponent& c = *cs[k];
    const std::uint8_t* meta = nullptr;
    if (c.meta_offset != codec::detail::StoredComponent::kPacked) {
      meta = device_stream + c.meta_offset;
    } else {
      auto* copy = w.take<std::uint8_t>(3 * blocks);
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(copy, c.meta.data(), 3 * blocks, cudaMemcpyHostToDevice, s));
      meta = copy;
    }
    sizes.meta[k] = meta;
    out[k] = {device_stream + c.payload_offset, meta, nullptr, before};
    before += c.payload_bytes;
  }
  const std::uint64_t items = offsets_items(blocks, parts), words = offsets_look_back_words(blocks, parts);
  auto* offsets = w.take<unsigned long long>(items);
  for (int k = 0; k < parts; ++k) out[k].offsets = offsets + k * (blocks + 1);  // (its own blocks' entries)
  auto* look_back = w.take_zeroed_words(words);
  scan_payload_offsets(s, sizes, items, offsets, look_back);
}

// The decoders' error flag, cleared: in pinned host memory, which the kernels write directly, so
// that neither clearing it nor reading it back takes a copy, only the wait for the stream
// (check_decoded).
unsigned* cleared_decode_error(GpuCodec::Impl& w) {
  unsigned* flag = w.decode_error();
  *flag = 0;  // (no kernel that writes it is in flight: each decode waits for its stream)
  if (!w.decode_error_on_device) {
    void* device = nullptr;
    QSTAGE_CUDA_CHECK(cudaHostGetDevicePointer(&device, flag, 0));
    w.decode_error_on_device = static_cast<unsigned*>(device);
  }
  return w.decode_error_on_device;
}

void check_decoded(GpuCodec::Impl& w) {
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(w.cuda()));  // also the end of the copies from the host vectors
  if (*w.decode_error()) throw codec::FormatError("corrupted block: a block payload does not decode consistently (GPU decoder)");
}

}  // namespace

bool GpuCodec::can_decode_pair(const codec::detail::Coding& coding, const float* out) {
  return !codec::detail::groups(coding.pipeline) && reinterpret_cast<std::uintptr_t>(out) % alignof(float2) == 0;
}

void GpuCodec::decode_pair(const codec::detail::StoredComponent& re, const codec::detail::StoredComponent& im,
                           const std::uint8_t* device_stream, std::uint64_t n, const codec::detail::Coding& coding,
                           float* out) {
  if (!can_decode_pair(coding, out) || re.coded != n || im.coded != n)
    throw std::logic_error("GpuCodec::decode_pair: not a pair of ungrouped components");
  Impl& w = *impl_;
  const std::uint64_t blocks = codec::detail::div_up(n, coding.block);
  w.reserve(component_blocks_bytes(blocks, 2));
  unsigned* error = cleared_decode_error(w);
  const codec::detail::StoredComponent* both[2] = {&re, &im};
  ComponentBlocks k[2];
  component_blocks(w, both, 2, device_stream, blocks, k);
  if (blocks) decode_pair_blocks(w.cuda(), coding.block, k[0], k[1], blocks, n, reinterpret_cast<float2*>(out), 2 * coding.e, error);
  check_decoded(w);
}

void GpuCodec::decode_all(const std::vector<codec::detail::StoredComponent>& parts, const std::uint8_t* device_stream,
                          std::uint64_t n, const codec::detail::Coding& coding, float* out) {
  if (parts.size() == 2 && can_decode_pair(coding, out)) return decode_pair(parts[0], parts[1], device_stream, n, coding, out);
  const int stride = static_cast<int>(parts.size());
  for (int k = 0; k < stride; ++k) decode(parts[k], device_stream, n, stride, coding, out + k);
}

void GpuCodec::decode(const codec::detail::StoredComponent& c, const std::uint8_t* device_stream, std::uint64_t n,
                      int stride, const codec::detail::Coding& coding, float* out) {
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  const bool grouped = codec::detail::groups(coding.pipeline);
  const std::uint64_t blocks = codec::detail::div_up(c.coded, coding.block), bitmap_bytes = (n + 7) / 8;
  const std::uint64_t temp = grouped ? scan_temp_bytes(bitmap_bytes + 1) : 0;  // (the bitmap's ranks)
  w.reserve(component_blocks_bytes(blocks, 1) +
            (grouped ? round_up(temp) + round_up(4 * c.coded) + round_up(bitmap_bytes) + 2 * round_up(8 * (bitmap_bytes + 1)) : 0));
  unsigned* error = cleared_decode_error(w);
  const codec::detail::StoredComponent* one[1] = {&c};
  ComponentBlocks k;
  component_blocks(w, one, 1, device_stream, blocks, &k);
  float* kept = grouped ? w.take<float>(c.coded) : nullptr;
  if (blocks)
    decode_blocks(s, coding.block, k, blocks, c.coded, grouped ? kept : out,
                  grouped ? 1 : stride, 2 * coding.e, error);
  if (grouped && n) {
    void* temp_storage = w.take<std::uint8_t>(temp);
    size_t tb = temp;
    auto* bitmap = w.take<std::uint8_t>(bitmap_bytes);
    auto* counts = w.take<unsigned long long>(bitmap_bytes + 1);
    auto* ranks = w.take<unsigned long long>(bitmap_bytes + 1);
    if (c.level2_offset != codec::detail::StoredComponent::kPacked) {
      // Two levels: rebuilt from the stream's device copy (the host checked it while parsing).
      const std::uint64_t level2_bytes = (bitmap_bytes + 7) / 8;
      kernels::detail::popcounts_cuda(s, device_stream + c.level2_offset, level2_bytes, counts);
      tb = temp;
      QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(level2_bytes + 1), s));
      // (byte j of the first level: the rank(j)-th nonzero byte where bit j of the second is set, else 0)
      kernels::detail::expand_cuda(s, device_stream + c.level1_offset, bitmap_bytes, 1, device_stream + c.level2_offset,
                                   ranks, bitmap);
    } else {
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(bitmap, c.bitmap.data(), bitmap_bytes, cudaMemcpyHostToDevice, s));
    }
    kernels::detail::popcounts_cuda(s, bitmap, bitmap_bytes, counts);
    tb = temp;
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp_storage, tb, counts, ranks, static_cast<std::int64_t>(bitmap_bytes + 1), s));
    kernels::detail::expand_cuda(s, kept, n, stride, bitmap, ranks, out);
  }
  check_decoded(w);
}

double GpuCodec::value_range(const float* x, std::uint64_t count) {
  if (count == 0) return 0.0;
  Impl& w = *impl_;
  const cudaStream_t s = w.cuda();
  auto lo_in = thrust::make_transform_iterator(x, FiniteOr{INFINITY});
  auto hi_in = thrust::make_transform_iterator(x, FiniteOr{-INFINITY});
  size_t temp = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, temp, lo_in, static_cast<float*>(nullptr),
                                              static_cast<std::int64_t>(count), Min{}, INFINITY, s));
  w.reserve(round_up(temp) + 256);
  void* temp_storage = w.take<std::uint8_t>(temp);
  float* result = w.take<float>(2);
  size_t tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(temp_storage, tb, lo_in, result, static_cast<std::int64_t>(count), Min{}, INFINITY, s));
  tb = temp;
  QSTAGE_CUDA_CHECK(cub::DeviceReduce::Reduce(temp_storage, tb, hi_in, result + 1, static_cast<std::int64_t>(count), Max{}, -INFINITY, s));
  auto* host = static_cast<float*>(w.pinned.data());
  QSTAGE_CUDA_CHECK(cudaMemcpyAsync(host, result, 2 * sizeof(float), cudaMemcpyDeviceToHost, s));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(s));
  return host[0] <= host[1] ? static_cast<double>(host[1]) - static_cast<double>(host[0]) : 0.0;
}

}  // namespace qstage::kernels
