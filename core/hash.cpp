#include "core/hash.hpp"

#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.hpp"

namespace qstage {
namespace {

std::string hex128(XXH128_hash_t h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

}  // namespace

std::string hash_bytes(std::string_view bytes) { return hex128(XXH3_128bits(bytes.data(), bytes.size())); }

std::string hash_file(const std::filesystem::path& path) {
  // XXH3 streams at 20-30 GB/s on one core, but one thread copies only 3-5 GB/s out of the page
  // cache: the next round of blocks is read by several threads (pread) while this one hashes the
  // last round, in file order, so the hash is that of the bytes streamed in order. (Threads of
  // its own: core sits below io, whose IoPool the engine's reads use.)
  struct Fd {
    int fd;
    ~Fd() { ::close(fd); }
  } file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) throw InputError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw InputError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  constexpr std::uint64_t kBlock = 8 << 20;
  const std::uint64_t readers = std::clamp<std::uint64_t>(std::thread::hardware_concurrency(), 1, 8);
  const std::uint64_t round = std::min(readers * kBlock, std::max<std::uint64_t>(size, 1));
  std::vector<char> buffers[2] = {std::vector<char>(round), std::vector<char>(round)};
  // Reads [offset, offset + round) (or to the end) into buffers[set]: its bytes.
  auto read_round = [&](int set, std::uint64_t offset) {
    const std::uint64_t end = std::min(size, offset + round);
    std::vector<std::future<void>> blocks;
    for (std::uint64_t at = offset; at < end; at += kBlock)
      blocks.push_back(std::async(std::launch::async, [&, at] {
        for (std::uint64_t done = at, stop = std::min(end, at + kBlock); done < stop;) {
          const ssize_t n = ::pread(file.fd, buffers[set].data() + (done - offset), stop - done, static_cast<off_t>(done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) throw InputError(fmt::format("error while reading '{}': {}", path.string(), n < 0 ? std::strerror(errno) : "it got shorter"));
          done += static_cast<std::uint64_t>(n);
        }
      }));
    for (auto& b : blocks) b.get();
    return end - offset;
  };
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  std::uint64_t bytes = size ? read_round(0, 0) : 0;
  for (std::uint64_t offset = 0, set = 0; offset < size; offset += round, set ^= 1) {
    std::future<std::uint64_t> next;
    if (offset + round < size) next = std::async(std::launch::async, read_round, static_cast<int>(set ^ 1), offset + round);
    XXH3_128bits_update(state.get(), buffers[set].data(), bytes);
    if (next.valid()) bytes = next.get();
  }
  return hex128(XXH3_128bits_digest(state.get()));
}

std::string hex64(std::uint64_t value) { return fmt::format("{:016x}", value); }

std::uint64_t parse_hex64(std::string_view text) {
  if (text.size() != 16) throw std::invalid_argument("checksum must have 16 hex digits");
  std::uint64_t v = 0;
  for (char c : text) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) throw std::invalid_argument("checksum has a non-hex digit");
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

}  // namespace qstage
