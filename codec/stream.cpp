// The codec's stream: header, checksum, and each pipeline's component sections (the byte
// layout is in docs/compression.md). Blocks are coded by block_coder.cpp.
#include <fmt/format.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "codec/codec.hpp"
#include "codec/component.hpp"

namespace qstage::codec {

namespace {

using detail::Coding;
using detail::div_up;
using detail::StoredComponent;

constexpr std::array<char, 4> kMagic = {'Q', 'S', 'T', 'Z'};
constexpr std::uint64_t kFixedHeader = 72;  // bytes before the shape
constexpr int kMaxRank = 32;
constexpr int kZstdLevel = 3;
constexpr std::array<Pipeline, 6> kPipelines = {Pipeline::szx,     Pipeline::threshold,  Pipeline::group,
                                                Pipeline::group2l, Pipeline::integrated, Pipeline::quantized};

// ---------------------------------------------------------------- little-endian bytes

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    std::uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(b, b + sizeof(T));
    bytes(b, sizeof(T));
  }
  void bytes(const std::uint8_t* p, std::uint64_t n) {
    const std::uint64_t at = out_.size();
    out_.resize(at + n);
    if (n) std::memcpy(out_.data() + at, p, n);
  }
  std::uint64_t size() const { return out_.size(); }
  template <typename T>
  void patch(std::uint64_t at, T v) {
    std::memcpy(out_.data() + at, &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(out_.data() + at, out_.data() + at + sizeof(T));
  }

 private:
  std::vector<std::uint8_t>& out_;
};

class Reader {
 public:
  Reader(const std::uint8_t* p, std::uint64_t n) : p_(p), left_(n) {}
  template <typename T>
  T get(const char* what) {
    const std::uint8_t* b = take(sizeof(T), what);
    std::uint8_t c[sizeof(T)];
    std::memcpy(c, b, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(c, c + sizeof(T));
    T v;
    std::memcpy(&v, c, sizeof(T));
    return v;
  }
  const std::uint8_t* take(std::uint64_t n, const char* what) {
    if (n > left_)
      throw FormatError(fmt::format("truncated stream: {} needs {} bytes, {} left", what, n, left_));
    const std::uint8_t* at = p_;
    p_ += n;
    left_ -= n;
    return at;
  }
  std::uint64_t left() const { return left_; }

 private:
  const std::uint8_t* p_;
  std::uint64_t left_;
};

// ---------------------------------------------------------------- lossless parts

// [codec u8: 0 raw, 1 zstd][raw bytes u64][stored bytes u64][stored]: zstd where it is smaller.
void put_lossless(Writer& w, const std::vector<std::uint8_t>& raw, bool allow_zstd) {
  std::vector<std::uint8_t> packed;
  if (allow_zstd && raw.size() > 64) {
    packed.resize(ZSTD_compressBound(raw.size()));
    const size_t n = ZSTD_compress(packed.data(), packed.size(), raw.data(), raw.size(), kZstdLevel);
    if (ZSTD_isError(n)) throw std::runtime_error(fmt::format("zstd compression failed: {}", ZSTD_getErrorName(n)));
    packed.resize(n);
  }
  const bool zstd = !packed.empty() && packed.size() < raw.size();
  const auto& stored = zstd ? packed : raw;
  w.put<std::uint8_t>(zstd ? 1 : 0);
  w.put<std::uint64_t>(raw.size());
  w.put<std::uint64_t>(stored.size());
  w.bytes(stored.data(), stored.size());
}

// `raw_at`, where given, gets where the bytes lie in the stream when they are stored raw (else nullptr).
std::vector<std::uint8_t> get_lossless(Reader& r, std::uint64_t expected_raw, const char* what,
                                       const std::uint8_t** raw_at = nullptr) {
  const auto codec = r.get<std::uint8_t>(what);
  const auto raw = r.get<std::uint64_t>(what);
  const auto stored = r.get<std::uint64_t>(what);
  if (codec > 1) throw FormatError(fmt::format("{}: unknown lossless codec {}", what, codec));
  if (raw != expected_raw) throw FormatError(fmt::format("{}: {} bytes where {} were expected", what, raw, expected_raw));
  if (codec == 0 && stored != raw) throw FormatError(fmt::format("{}: stored size differs from its size", what));
  const std::uint8_t* p = r.take(stored, what);
  if (raw_at) *raw_at = codec == 0 ? p : nullptr;
  if (codec == 0) return {p, p + stored};
  std::vector<std::uint8_t> out(raw);
  const size_t n = ZSTD_decompress(out.data(), out.size(), p, stored);
  if (ZSTD_isError(n) || n != raw) throw FormatError(fmt::format("{}: zstd data does not decode to {} bytes", what, raw));
  return out;
}

// ---------------------------------------------------------------- components

// [u64 coded values][lossless: block states, then u16 block sizes][u64 payload bytes][payload]
void put_blocks(Writer& w, const detail::ComponentParts& parts, bool allow_zstd) {
  w.put<std::uint64_t>(parts.coded);
  put_lossless(w, parts.meta, allow_zstd);
  w.put<std::uint64_t>(parts.payload.size());
  w.bytes(parts.payload.data(), parts.payload.size());
}

void write_component(Writer& w, const detail::ComponentParts& parts, const detail::Coding& c) {
  if (detail::groups(c.pipeline) && !detail::two_level(c.pipeline)) {  // group, quantized
    put_lossless(w, parts.bitmap, true);
  } else if (detail::two_level(c.pipeline)) {  // one bit per bitmap byte that is not zero, then those bytes
    std::vector<std::uint8_t> level2(div_up(parts.bitmap.size(), 8), 0), nonzero;
    for (std::uint64_t j = 0; j < parts.bitmap.size(); ++j)
      if (parts.bitmap[j]) {
        level2[j / 8] = static_cast<std::uint8_t>(level2[j / 8] | (1u << (j % 8)));
        nonzero.push_back(parts.bitmap[j]);
      }
    put_lossless(w, level2, false);
    w.put<std::uint64_t>(nonzero.size());
    w.bytes(nonzero.data(), nonzero.size());
  }
  put_blocks(w, parts, c.pipeline != Pipeline::integrated);  // integrated: no zstd, all of it from the GPU
}

std::uint64_t ones(const std::vector<std::uint8_t>& bitmap, std::uint64_t n) {
  std::uint64_t c = 0;
  for (std::uint8_t byte : bitmap) c += static_cast<std::uint64_t>(std::popcount(byte));
  if (n % 8 && !bitmap.empty() && (bitmap.back() >> (n % 8)))
    throw FormatError("the bitmap marks values past the end of the data");
  return c;
}

// The significance bitmap; for the two-level form also where its raw parts lie in the stream
// (a GPU decoder rebuilds the bitmap from them in device memory).
std::vector<std::uint8_t> read_bitmap(Reader& r, std::uint64_t n, Pipeline p, const std::uint8_t* stream,
                                      detail::StoredComponent& sc) {
  if (!detail::two_level(p)) return get_lossless(r, div_up(n, 8), "significance bitmap");
  const std::uint64_t level1 = div_up(n, 8);
  const std::uint8_t* level2_at = nullptr;
  const auto level2 = get_lossless(r, div_up(level1, 8), "second-level bitmap", &level2_at);
  if (!level2_at) throw FormatError("a second-level bitmap stored with zstd; expected it raw");
  const std::uint64_t marked = ones(level2, level1);
  const auto count = r.get<std::uint64_t>("first-level byte count");
  if (count != marked) throw FormatError("the second-level bitmap and the first-level bytes disagree");
  const std::uint8_t* bytes = r.take(count, "first-level bytes");
  sc.level2_offset = static_cast<std::uint64_t>(level2_at - stream);
  sc.level1_offset = static_cast<std::uint64_t>(bytes - stream);
  sc.level1_count = count;
  std::vector<std::uint8_t> bitmap(level1, 0);
  std::uint64_t k = 0;
  for (std::uint64_t j = 0; j < level1; ++j)
    if ((level2[j / 8] >> (j % 8)) & 1u) {
      if (bytes[k] == 0) throw FormatError("a first-level byte marked nonzero is zero");
      bitmap[j] = bytes[k++];
    }
  return bitmap;
}

// Block sizes the state allows, before any decoder looks at the payload.
void check_block(std::uint8_t state, int bytes, int count, std::uint64_t b) {
  const bool ok = state == detail::kZero       ? bytes == 0
                  : state == detail::kConstant ? bytes == 4
                  : state == detail::kRaw      ? bytes == 4 * count
                  : state == detail::kSparse   ? bytes >= 3 && bytes <= 2 + count * 5
                  : state == detail::kDense    ? bytes >= 5 + (count + 3) / 4 && bytes <= 5 + (count + 3) / 4 + 4 * count
                  : state == detail::kQuantized ? bytes >= 1 && bytes <= detail::quantized_bytes(count, 31)
                                               : false;
  if (!ok) throw FormatError(fmt::format("block {} has state {} and {} payload bytes, which do not fit", b, state, bytes));
}

detail::StoredComponent read_component(Reader& r, const std::uint8_t* stream, std::uint64_t n, const detail::Coding& c) {
  detail::StoredComponent sc;
  std::uint64_t expected = n;
  if (detail::groups(c.pipeline)) {
    sc.bitmap = read_bitmap(r, n, c.pipeline, stream, sc);
    expected = ones(sc.bitmap, n);
  }
  sc.coded = r.get<std::uint64_t>("block values");
  if (sc.coded != expected)
    throw FormatError(fmt::format("a section codes {} values where {} were expected", sc.coded, expected));
  const std::uint64_t blocks = div_up(sc.coded, c.block);
  const std::uint8_t* raw_meta = nullptr;
  sc.meta = get_lossless(r, 3 * blocks, "block states and sizes", &raw_meta);
  if (raw_meta) sc.meta_offset = static_cast<std::uint64_t>(raw_meta - stream);
  sc.payload_bytes = r.get<std::uint64_t>("block payload size");
  sc.payload_offset = static_cast<std::uint64_t>(r.take(sc.payload_bytes, "block payload") - stream);
  std::uint64_t total = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const int count = static_cast<int>(std::min<std::uint64_t>(c.block, sc.coded - b * c.block));
    const int bytes = detail::block_payload_size(sc.meta, blocks, b);
    check_block(sc.meta[b], bytes, count, b);
    total += static_cast<std::uint64_t>(bytes);
  }
  if (total != sc.payload_bytes)
    throw FormatError(fmt::format("the blocks' sizes add up to {} bytes, the payload has {}", total, sc.payload_bytes));
  return sc;
}

// ---------------------------------------------------------------- header

struct Header {
  StreamInfo info;
  std::uint64_t payload_bytes = 0, checksum = 0, header_bytes = 0;
};

Header read_header(const std::uint8_t* stream, std::uint64_t bytes) {
  Reader r(stream, bytes);
  const std::uint8_t* magic = r.take(4, "the header");
  if (!std::equal(kMagic.begin(), kMagic.end(), reinterpret_cast<const char*>(magic)))
    throw FormatError("not a qstage compressed stream (its first bytes are not QSTZ)");
  Header h;
  StreamInfo& i = h.info;
  i.version = r.get<std::uint16_t>("the header");
  if (i.version != kVersion)
    throw FormatError(fmt::format("stream format version {}; this qstage decodes version {}", i.version, kVersion));
  const auto type = r.get<std::uint8_t>("the header");
  const auto pipeline = r.get<std::uint8_t>("the header");
  i.block_size = r.get<std::uint32_t>("the header");
  const auto rank = r.get<std::uint8_t>("the header");
  const auto flags = r.get<std::uint8_t>("the header");
  r.get<std::uint16_t>("the header");
  if (type > 1) throw FormatError(fmt::format("unknown element type {} in the header", type));
  if (pipeline >= kPipelines.size()) throw FormatError(fmt::format("unknown pipeline {} in the header", pipeline));
  if (i.block_size != 64 && i.block_size != 128 && i.block_size != 256)
    throw FormatError(fmt::format("block size {} in the header; expected 64, 128 or 256", i.block_size));
  if (rank > kMaxRank) throw FormatError(fmt::format("rank {} in the header; at most {}", rank, kMaxRank));
  i.type = static_cast<ElementType>(type);
  i.pipeline = static_cast<Pipeline>(pipeline);
  i.relative = flags & 1u;
  i.range = r.get<double>("the header");
  i.threshold = r.get<double>("the header");
  i.error = r.get<double>("the header");
  i.threshold_given = r.get<double>("the header");
  i.error_given = r.get<double>("the header");
  h.payload_bytes = r.get<std::uint64_t>("the header");
  h.checksum = r.get<std::uint64_t>("the header");
  std::uint64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    const auto extent = r.get<std::uint64_t>("the shape");
    if (extent && elements > std::numeric_limits<std::uint64_t>::max() / 2 / extent)
      throw FormatError("the shape's element count overflows");
    elements *= extent;
    i.shape.push_back(extent);
  }
  if (!(i.threshold >= 0) || !(i.error >= 0) || !std::isfinite(i.threshold) || !std::isfinite(i.error))
    throw FormatError("bounds in the header are not finite and non-negative");
  h.header_bytes = kFixedHeader + 8u * rank;
  if (r.left() != h.payload_bytes)
    throw FormatError(fmt::format("truncated or padded stream: the header announces {} payload bytes, {} follow",
                                  h.payload_bytes, r.left()));
  return h;
}

// XXH64 of the whole stream but the checksum's own 8 bytes (at 64), so a damaged header is
// caught as surely as a damaged payload.
std::uint64_t checksum_of(const std::uint8_t* stream, std::uint64_t bytes) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  XXH64_update(state, stream, 64);
  XXH64_update(state, stream + 72, bytes - 72);
  const std::uint64_t sum = XXH64_digest(state);
  XXH64_freeState(state);
  return sum;
}

}  // namespace

// ---------------------------------------------------------------- public

std::string_view pipeline_name(Pipeline p) {
  switch (p) {
    case Pipeline::szx: return "szx";
    case Pipeline::threshold: return "threshold";
    case Pipeline::group: return "group";
    case Pipeline::group2l: return "group2l";
    case Pipeline::integrated: return "integrated";
    case Pipeline::quantized: return "quantized";
  }
  return "?";
}

std::optional<Pipeline> pipeline_from_name(std::string_view name) {
  for (Pipeline p : kPipelines)
    if (pipeline_name(p) == name) return p;
  return std::nullopt;
}

std::string pipeline_names() {
  std::string s;
  for (Pipeline p : kPipelines) s += (s.empty() ? "" : ", ") + std::string(pipeline_name(p));
  return s;
}

void validate(const Settings& s) {
  if (s.block_size != 64 && s.block_size != 128 && s.block_size != 256)
    throw std::invalid_argument(fmt::format("block size {}; expected 64, 128 or 256", s.block_size));
  if (!(s.error >= 0) || !std::isfinite(s.error))
    throw std::invalid_argument(fmt::format("error bound {}; expected a finite number >= 0", s.error));
  if (!(s.threshold >= 0) || !std::isfinite(s.threshold))
    throw std::invalid_argument(fmt::format("threshold {}; expected a finite number >= 0", s.threshold));
  if (s.pipeline == Pipeline::szx && s.threshold > 0)
    throw std::invalid_argument("the szx pipeline has no threshold; expected threshold 0, or the threshold, group, "
                                "group2l or integrated pipeline");
}

std::uint64_t max_stream_bytes(ElementType type, std::uint64_t elements, std::size_t rank) {
  // Per component: payload <= 4 bytes a value (a candidate must beat raw), a bitmap of n/8 bytes
  // (two-level: n/64 more), 3 bytes of metadata per block of at least 64 values, and the
  // fixed fields of the section and of its lossless parts (under 256 bytes).
  const std::uint64_t n = elements, per_component = 4 * n + n / 4 + 256;
  return kFixedHeader + 8 * rank + (type == ElementType::complex64 ? 2 : 1) * per_component;
}

std::uint64_t StreamInfo::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
std::uint64_t StreamInfo::components() const { return elements() * (type == ElementType::complex64 ? 2 : 1); }

double value_range(const float* data, std::uint64_t count) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (std::uint64_t i = 0; i < count; ++i)
    if (detail::is_finite(data[i])) {
      lo = std::min(lo, data[i]);
      hi = std::max(hi, data[i]);
    }
  return lo <= hi ? static_cast<double>(hi) - static_cast<double>(lo) : 0.0;
}

std::vector<std::uint8_t> encode(const float* data, ElementType type, const std::vector<std::uint64_t>& shape,
                                 const Settings& s, std::optional<double> dataset_range) {
  StreamInfo probe;
  probe.type = type;
  probe.shape = shape;
  const double range = dataset_range ? *dataset_range : value_range(data, probe.components());
  return detail::encode_with(detail::code_components, data, type, shape, s, range);
}

std::vector<std::uint8_t> detail::encode_with(const ComponentCoder& coder, const float* data, ElementType type,
                                              const std::vector<std::uint64_t>& shape, const Settings& s, double range) {
  validate(s);
  if (shape.size() > kMaxRank) throw std::invalid_argument(fmt::format("rank {}; at most {}", shape.size(), kMaxRank));
  StreamInfo info;
  info.type = type;
  info.shape = shape;
  const std::uint64_t n = info.elements();
  const int parts = type == ElementType::complex64 ? 2 : 1;
  const double scale = s.relative ? range : 1.0;
  const Coding coding{s.pipeline, s.block_size, s.threshold * scale, s.error * scale};

  std::vector<std::uint8_t> out;
  Writer w(out);
  out.reserve(kFixedHeader + 8 * shape.size());
  w.bytes(reinterpret_cast<const std::uint8_t*>(kMagic.data()), kMagic.size());
  w.put<std::uint16_t>(kVersion);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(type));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(s.pipeline));
  w.put<std::uint32_t>(s.block_size);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(shape.size()));
  w.put<std::uint8_t>(s.relative ? 1 : 0);
  w.put<std::uint16_t>(0);
  w.put<double>(range);
  w.put<double>(coding.t);
  w.put<double>(coding.e);
  w.put<double>(s.threshold);
  w.put<double>(s.error);
  const std::uint64_t sizes_at = w.size();
  w.put<std::uint64_t>(0);  // payload bytes and checksum, patched below
  w.put<std::uint64_t>(0);
  for (auto d : shape) w.put<std::uint64_t>(d);
  const std::uint64_t payload_at = w.size();
  const std::vector<ComponentParts> components = coder(data, n, parts, coding);
  for (const auto& coded : components) {
    const std::uint64_t section_at = w.size();
    w.put<std::uint64_t>(0);
    write_component(w, coded, coding);
    w.patch<std::uint64_t>(section_at, w.size() - section_at - 8);
  }
  w.patch<std::uint64_t>(sizes_at, w.size() - payload_at);
  reseal(out);
  return out;
}

void reseal(std::vector<std::uint8_t>& stream) {
  read_header(stream.data(), stream.size());
  Writer(stream).patch<std::uint64_t>(64, checksum_of(stream.data(), stream.size()));
}

StreamInfo inspect(const std::uint8_t* stream, std::uint64_t bytes) {
  const Header h = read_header(stream, bytes);
  if (checksum_of(stream, bytes) != h.checksum)
    throw FormatError("checksum mismatch: the stream is corrupted");
  return h.info;
}

StreamInfo detail::decode_with(const ComponentDecoder& decoder, const std::uint8_t* stream, std::uint64_t bytes,
                               const std::uint8_t* data, float* out, std::uint64_t out_floats) {
  const StreamInfo info = inspect(stream, bytes);
  if (out_floats != info.components())
    throw std::invalid_argument(fmt::format("decode into {} floats; the stream holds {}", out_floats, info.components()));
  const Header h = read_header(stream, bytes);
  Reader r(stream + h.header_bytes, h.payload_bytes);
  const std::uint64_t n = info.elements();
  const int parts = info.type == ElementType::complex64 ? 2 : 1;
  const Coding coding{info.pipeline, info.block_size, info.threshold, info.error};
  std::vector<StoredComponent> components;
  for (int part = 0; part < parts; ++part) {
    const auto section = r.get<std::uint64_t>("a section size");
    Reader s(r.take(section, "a component section"), section);
    components.push_back(read_component(s, stream, n, coding));
    if (s.left() != 0) throw FormatError("a component section is longer than its contents");
  }
  if (r.left() != 0) throw FormatError("the payload is longer than its sections");
  decoder(components, data, n, coding, out);
  return info;
}

StreamInfo decode(const std::uint8_t* stream, std::uint64_t bytes, float* out, std::uint64_t out_floats,
                  BlockCounts* counts) {
  auto cpu = [counts](const std::vector<detail::StoredComponent>& parts, const std::uint8_t* data, std::uint64_t n,
                      const detail::Coding& coding, float* o) {
    const int stride = static_cast<int>(parts.size());
    for (int k = 0; k < stride; ++k) detail::decode_component(parts[k], data, n, stride, coding, o + k, counts);
  };
  return detail::decode_with(cpu, stream, bytes, stream, out, out_floats);
}

}  // namespace qstage::codec
