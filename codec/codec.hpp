#pragma once
// qstage's error-bounded lossy codec for float32 and complex64 data (seed 003): a complex array
// is coded as its real and its imaginary components, each a 1-D float32 array.
//
// Guarantee: every decoded component is within max(t, e) of the original (t the threshold, e
// the error bound, both absolute in the stream), so a complex value is within sqrt(2)·max(t, e).
// A block that would break it is stored losslessly; NaN and Inf are stored exactly (their block
// is stored raw), and the value range ignores them.
//
// The stream is self-describing and versioned (docs/compression.md has the byte layout): header
// with dtype, shape, value range, bounds, pipeline and block size, an XXH64 checksum of the
// payload, then per component a section coded by the pipeline. Decoders refuse other versions,
// checksum mismatches and inconsistent sections with FormatError; they never read or write out
// of bounds. Offsets and counts are 64-bit.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qstage::codec {

// A stream that is not one this version can decode (corrupted, truncated, other version).
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Pipeline : std::uint8_t {
  szx = 0,         // blocks: constant within the bound, else truncated and XOR leading-byte coded
  threshold = 1,   // components with |x| <= t become 0, then szx
  group = 2,       // threshold, a bitmap of the significant values (zstd), the compacted values by szx
  group2l = 3,     // group with seed 003's two-level bitmap instead of zstd
  integrated = 4,  // threshold and per-block states zero / constant / sparse / dense in one pass
  quantized = 5,   // group, with the significant values' blocks also as multiples of 2e in a
                   // block-wide bit width (qstage's own: the seed's pipelines truncate bits instead)
};
std::string_view pipeline_name(Pipeline p);
std::optional<Pipeline> pipeline_from_name(std::string_view name);
std::string pipeline_names();  // "szx, threshold, group, group2l, integrated, quantized"

enum class ElementType : std::uint8_t { float32 = 0, complex64 = 1 };

struct Settings {
  Pipeline pipeline = Pipeline::integrated;
  std::uint32_t block_size = 256;  // 64, 128 or 256 values
  double threshold = 0;            // t (not for szx)
  double error = 0;                // e; 0 keeps every bit
  bool relative = true;            // t and e are fractions of the dataset's value range
};
// Throws std::invalid_argument naming the bad setting and what was expected.
void validate(const Settings& s);

// What a stream's header says.
struct StreamInfo {
  std::uint16_t version = 0;
  ElementType type = ElementType::float32;
  Pipeline pipeline = Pipeline::szx;
  std::uint32_t block_size = 0;
  std::vector<std::uint64_t> shape;
  double range = 0;                      // max - min of the finite components it was given
  double threshold = 0, error = 0;       // absolute
  double threshold_given = 0, error_given = 0;
  bool relative = false;
  std::uint64_t elements() const;        // product of shape
  std::uint64_t components() const;      // floats: elements, or twice for complex64
};

constexpr std::uint16_t kVersion = 1;

// max - min over the finite floats of data[0, count) (0 when there are none).
double value_range(const float* data, std::uint64_t count);

// Per-block state counts of a stream, for reports.
struct BlockCounts {
  std::uint64_t zero = 0, constant = 0, sparse = 0, dense = 0, raw = 0, quantized = 0;
};

// Codes data (elements() floats, or interleaved re/im pairs for complex64). Relative bounds are
// taken against `dataset_range` where given (a chunk of a larger dataset), else data's own range.
std::vector<std::uint8_t> encode(const float* data, ElementType type, const std::vector<std::uint64_t>& shape,
                                 const Settings& settings, std::optional<double> dataset_range = std::nullopt);

// An upper bound on the size of a stream of `elements` elements of rank `rank` (any pipeline):
// a block's payload never exceeds its raw size, plus the framing of bitmaps and block metadata.
std::uint64_t max_stream_bytes(ElementType type, std::uint64_t elements, std::size_t rank = 1);

// The header of a stream, checked (magic, version, fields, checksum).
StreamInfo inspect(const std::uint8_t* stream, std::uint64_t bytes);

// Decodes into out[0, out_floats), which must be exactly info.components() floats.
StreamInfo decode(const std::uint8_t* stream, std::uint64_t bytes, float* out, std::uint64_t out_floats,
                  BlockCounts* counts = nullptr);

// Recomputes a stream's checksum after its payload was changed on purpose (the decoder fuzz
// test uses it to reach the structural checks behind the checksum).
void reseal(std::vector<std::uint8_t>& stream);

}  // namespace qstage::codec
