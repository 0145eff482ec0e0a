#include "io/compressed_chunks.hpp"

#include "core/fsutil.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "io/filter/h5z_qstage.hpp"

namespace qstage::h5 {

namespace fs = std::filesystem;
using nlohmann::json;

codec::Settings codec_settings(const json& spec, std::string_view where) {
  codec::Settings s;
  const std::string name = spec.value("pipeline", "quantized");
  const auto pipeline = codec::pipeline_from_name(name);
  if (!pipeline)
    throw InputError(fmt::format("{}: pipeline '{}'; expected one of {}", where, name, codec::pipeline_names()));
  s.pipeline = *pipeline;
  s.block_size = spec.value("block_size", 256u);
  s.error = spec.at("error").get<double>();
  s.threshold = s.pipeline == codec::Pipeline::szx ? 0.0 : spec.value("threshold", s.error);
  s.relative = spec.value("bounds", "relative") != "absolute";
  try {
    codec::validate(s);
  } catch (const std::invalid_argument& e) {
    throw InputError(fmt::format("{}: {}", where, e.what()));
  }
  return s;
}

json codec_summary(const codec::Settings& s, std::optional<double> range, codec::ElementType type,
                   std::string_view bounds_name) {
  // Absolute values: known for absolute bounds, or relative ones with a range (null otherwise).
  auto absolute = [&](double v) { return !s.relative ? json(v) : range ? json(v * *range) : json(nullptr); };
  const std::string bounds = !bounds_name.empty() ? std::string(bounds_name) : s.relative ? "relative" : "absolute";
  return {{"pipeline", std::string(codec::pipeline_name(s.pipeline))},
          {"block_size", s.block_size},
          {"bounds", bounds},
          {"error_given", s.error},
          {"threshold_given", s.threshold},
          {"error", absolute(s.error)},
          {"threshold", absolute(s.threshold)},
          {"range", range ? json(*range) : json(nullptr)},
          {"element_type", type == codec::ElementType::complex64 ? "complex64" : "float32"}};
}

std::optional<codec::ElementType> codec_element_type(DType t) {
  if (t == DType::float32) return codec::ElementType::float32;
  if (t == DType::complex64) return codec::ElementType::complex64;
  return std::nullopt;
}

// ------------------------------------------------------------------------------ ChunkSpool
std::string ChunkSpool::State::serialize() const {
  std::string out(16 + 8 * sizes.size(), '\0');
  const std::uint64_t count = sizes.size();
  std::memcpy(out.data(), &bytes, 8);
  std::memcpy(out.data() + 8, &count, 8);
  if (count) std::memcpy(out.data() + 16, sizes.data(), 8 * count);
  return out;
}

ChunkSpool::State ChunkSpool::State::deserialize(const std::string& in) {
  State s;
  std::uint64_t count = 0;
  if (in.size() < 16) throw std::runtime_error("saved chunk spool state is too short");
  std::memcpy(&s.bytes, in.data(), 8);
  std::memcpy(&count, in.data() + 8, 8);
  if (in.size() != 16 + 8 * count) throw std::runtime_error("saved chunk spool state has the wrong size");
  s.sizes.resize(count);
  if (count) std::memcpy(s.sizes.data(), in.data() + 16, 8 * count);
  return s;
}

ChunkSpool::~ChunkSpool() {
  if (fd_ >= 0) ::close(fd_);
}

void ChunkSpool::append(const std::byte* p, std::uint64_t n) {
  open_for_append();
  state_.sizes.push_back(n);
  state_.bytes += n;
  while (n > 0) {
    const ssize_t k = ::write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("write");
    p += k;
    n -= static_cast<std::uint64_t>(k);
  }
}

ChunkSpool::State ChunkSpool::commit() const {
  open_for_append();  // the file exists even before the first chunk
  if (!fsutil::durability_deferred() && ::fdatasync(fd_) != 0) fail("fdatasync");
  return state_;
}

void ChunkSpool::restore(State state) {
  state_ = std::move(state);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;  // reopened, and cut back to state_.bytes, by the next append
}

void ChunkSpool::open_for_append() const {
  if (fd_ >= 0) return;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("open");
  // Cut back only what an interrupted run appended: ext4 (auto_da_alloc) takes a truncation to
  // zero as a file being replaced and writes it out when it is closed, so truncating a new, empty
  // file made closing the sample sort's buckets wait for gigabytes of writeback (2.5-3 s a pass).
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("stat");
  if (static_cast<std::uint64_t>(st.st_size) != state_.bytes && ::ftruncate(fd_, static_cast<off_t>(state_.bytes)) != 0)
    fail("truncate");
  if (::lseek(fd_, static_cast<off_t>(state_.bytes), SEEK_SET) < 0) fail("seek");
}

void ChunkSpool::fail(const char* what) const {
  throw RuntimeFailure(
      fmt::format("{} of the chunk spool '{}' failed: {}", what, path_.string(), std::strerror(errno)));
}

// ------------------------------------------------------------------------------ the dataset
namespace {

void set_codec_attributes(Dataset& d, const json& summary) {
  d.set_attribute("codec.filter_id", static_cast<std::int64_t>(h5z::kFilterId));
  for (auto it = summary.begin(); it != summary.end(); ++it) {
    const std::string name = "codec." + it.key();
    if (it->is_string()) d.set_attribute(name, it->get<std::string>());
    else if (it.key() == "block_size") d.set_attribute(name, it->get<std::int64_t>());
    else if (it->is_number()) d.set_attribute(name, it->get<double>());  // bounds, range: doubles even if whole
  }
}

}  // namespace

std::string write_compressed_dataset(File& file, const std::string& name, const Layout& layout,
                                     const codec::Settings& filter, const json& summary, const ChunkSpool& spool) {
  const auto type = codec_element_type(layout.dtype);
  if (!type) throw std::logic_error("write_compressed_dataset: not a codec type");
  Dataset d = file.create_dataset(name, {layout, false, false}, {{h5z::kFilterId, h5z::cd_values(*type, filter)}});
  const int fd = ::open(spool.path().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw RuntimeFailure(fmt::format("cannot open the chunk spool '{}': {}", spool.path().string(), std::strerror(errno)));
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, 0);
  std::vector<std::uint8_t> buffer;
  std::uint64_t at = 0;
  try {
    const auto& sizes = spool.state().sizes;
    for (std::uint64_t k = 0; k < sizes.size(); ++k) {
      buffer.resize(sizes[k]);
      for (std::uint64_t done = 0; done < sizes[k];) {
        const ssize_t n = ::pread(fd, buffer.data() + done, sizes[k] - done, static_cast<off_t>(at + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw RuntimeFailure(fmt::format("the chunk spool '{}' ends early", spool.path().string()));
        done += static_cast<std::uint64_t>(n);
      }
      d.write_stored_chunk(k, buffer.data(), sizes[k]);
      XXH64_update(hash, buffer.data(), sizes[k]);
      at += sizes[k];
    }
  } catch (...) {
    ::close(fd);
    XXH64_freeState(hash);
    throw;
  }
  ::close(fd);
  const std::string digest = hex64(XXH64_digest(hash));
  XXH64_freeState(hash);
  d.set_attribute("description", "values compressed with qstage's error-bounded codec: every real and imaginary part "
                                 "is within max(threshold, error) of the original (codec.* attributes; with "
                                 "codec.bounds 'chunk' they are fractions of each chunk's value range); read it with "
                                 "h5py and HDF5_PLUGIN_PATH naming qstage's plugin folder, or decode it with `decompress`");
  set_codec_attributes(d, summary);
  d.set_attribute("codec.stored_bytes", spool.state().bytes);
  d.set_attribute("stored_xxh64", digest);
  return digest;
}

}  // namespace qstage::h5
