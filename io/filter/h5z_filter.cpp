// The HDF5 filter (id 32881) around qstage's codec: the H5Z_class2_t that the plugin
// (h5z_plugin.cpp) hands to HDF5 and that qstage registers in its own process (h5z_qstage.hpp).
//
// It calls no HDF5 function: it only uses HDF5's header types, so the plugin works under any
// HDF5 build. That is also why can_apply and set_local are null (they would need H5P/H5T
// calls): the filter trusts cd_values (h5z_qstage.hpp) for the element type and takes the chunk
// as native (little-endian) floats.
#include "io/filter/h5z_qstage.hpp"


#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec.hpp"

namespace {

namespace codec = qstage::codec;

using qstage::h5z::kCdValues;
using qstage::h5z::kFilterId;
using qstage::h5z::kLayoutVersion;
using qstage::h5z::kRelative;

double double_from(unsigned lo, unsigned hi) {
  return std::bit_cast<double>((static_cast<std::uint64_t>(hi) << 32) | static_cast<std::uint64_t>(lo & 0xffffffffu));
}

// The settings cd_values ask for; throws std::invalid_argument naming what is wrong.
codec::ElementType settings_from(std::size_t n, const unsigned cd[], codec::Settings& s) {
  if (n != kCdValues || cd == nullptr)
    throw std::invalid_argument(std::to_string(n) + " cd_values; expected " + std::to_string(kCdValues) +
                                " (version, type, pipeline, block, flags, t lo/hi, e lo/hi)");
  if (cd[0] != kLayoutVersion)
    throw std::invalid_argument("cd_values layout version " + std::to_string(cd[0]) + "; expected 1");
  if (cd[1] > 1) throw std::invalid_argument("element type " + std::to_string(cd[1]) + "; expected 0 or 1");
  if (cd[2] > 5) throw std::invalid_argument("pipeline " + std::to_string(cd[2]) + "; expected 0 to 5");
  if (cd[4] & ~kRelative) throw std::invalid_argument("flags " + std::to_string(cd[4]) + "; only bit 0 is defined");
  s.pipeline = static_cast<codec::Pipeline>(cd[2]);
  s.block_size = cd[3];
  s.relative = cd[4] & kRelative;
  s.threshold = double_from(cd[5], cd[6]);
  s.error = double_from(cd[7], cd[8]);
  return static_cast<codec::ElementType>(cd[1]);  // encode() validates the rest of s
}

// HDF5 (release builds, which H5MM_malloc/H5MM_xfree map to malloc/free) frees the chunk buffer
// with free() and expects the one a filter hands back to come from malloc(); new/vector won't do.
struct Free {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, Free>;

Buffer allocate(std::size_t bytes) {
  Buffer b(std::malloc(bytes ? bytes : 1));
  if (!b) throw std::bad_alloc();
  return b;
}

// Swaps the chunk buffer for `out` (bytes long) and returns its size, as HDF5 expects.
std::size_t hand_over(Buffer out, std::size_t bytes, std::size_t* buf_size, void** buf) {
  std::free(*buf);
  *buf = out.release();
  *buf_size = bytes;
  return bytes;
}

std::size_t compress(std::size_t cd_nelmts, const unsigned cd[], std::size_t nbytes, std::size_t* buf_size,
                     void** buf) {
  codec::Settings s;
  const codec::ElementType type = settings_from(cd_nelmts, cd, s);
  const std::size_t element = type == codec::ElementType::complex64 ? 8 : 4;
  if (nbytes % element)
    throw std::invalid_argument(std::to_string(nbytes) + " bytes are not whole " + std::to_string(element) +
                                "-byte elements (does the dataset's type match cd_values[1]?)");
  // The chunk as 1-D: relative bounds then refer to this chunk's range (all the filter sees).
  const std::vector<std::uint8_t> stream =
      codec::encode(static_cast<const float*>(*buf), type, {nbytes / element}, s);
  Buffer out = allocate(stream.size());
  std::memcpy(out.get(), stream.data(), stream.size());
  return hand_over(std::move(out), stream.size(), buf_size, buf);
}

// The decoded size is the stream's own: HDF5 tells a filter neither the chunk's size nor checks
// the returned one, so a valid stream of another chunk size written with H5Dwrite_chunk is
// beyond this filter's reach (HDF5 1.10.8 then reads past the buffer it returns).
std::size_t decompress(std::size_t nbytes, std::size_t* buf_size, void** buf) {
  const auto* stream = static_cast<const std::uint8_t*>(*buf);
  const codec::StreamInfo info = codec::inspect(stream, nbytes);  // checked before we allocate
  const std::uint64_t floats = info.components();
  if (floats > SIZE_MAX / sizeof(float)) throw std::bad_alloc();
  const std::size_t bytes = static_cast<std::size_t>(floats) * sizeof(float);
  Buffer out = allocate(bytes);
  codec::decode(stream, nbytes, static_cast<float*>(out.get()), floats);
  return hand_over(std::move(out), bytes, buf_size, buf);
}

// One line on stderr: HDF5's own error says only that the filter failed, not why.
void report(bool reverse, std::size_t nbytes, const char* reason) noexcept {
  std::fprintf(stderr, "qstage HDF5 filter: %s a chunk of %zu bytes: %s\n", reverse ? "decoding" : "encoding", nbytes,
               reason);
}

// HDF5's H5Z_func_t. 0 means failure: HDF5 then fails the read (or, for an optional filter such
// as h5py sets, stores the chunk unfiltered on write). No exception may cross into C.
std::size_t filter(unsigned flags, std::size_t cd_nelmts, const unsigned cd_values[], std::size_t nbytes,
                   std::size_t* buf_size, void** buf) noexcept {
  const bool reverse = flags & H5Z_FLAG_REVERSE;
  try {
    return reverse ? decompress(nbytes, buf_size, buf) : compress(cd_nelmts, cd_values, nbytes, buf_size, buf);
  } catch (const std::exception& e) {
    report(reverse, nbytes, e.what());  // here: what() dies with the exception
  } catch (...) {
    report(reverse, nbytes, "unknown exception");
  }
  return 0;
}

const H5Z_class2_t kFilterClass = {
    .version = H5Z_CLASS_T_VERS,
    .id = kFilterId,
    .encoder_present = 1,
    .decoder_present = 1,
    .name = "qstage error-bounded codec (cd_values: version, type, pipeline, block, "
            "flags, t lo/hi, e lo/hi)",
    .can_apply = nullptr,
    .set_local = nullptr,
    .filter = filter,
};

}  // namespace

namespace qstage::h5z {

const H5Z_class2_t* filter_class() { return &kFilterClass; }

std::vector<unsigned> cd_values(codec::ElementType type, const codec::Settings& s) {
  const auto t = std::bit_cast<std::uint64_t>(s.threshold), e = std::bit_cast<std::uint64_t>(s.error);
  return {kLayoutVersion,
          static_cast<unsigned>(type),
          static_cast<unsigned>(s.pipeline),
          s.block_size,
          s.relative ? kRelative : 0u,
          static_cast<unsigned>(t & 0xffffffffu),
          static_cast<unsigned>(t >> 32),
          static_cast<unsigned>(e & 0xffffffffu),
          static_cast<unsigned>(e >> 32)};
}

}  // namespace qstage::h5z
