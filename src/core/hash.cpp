#include "core/hash.hpp"

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"

namespace qstage {
namespace {

std::string hex128(XXH128_hash_t h) { return fmt::format("{:016x}{:016x}", h.high64, h.low64); }

}  // namespace

std::string hash_bytes(std::string_view bytes) { return hex128(XXH3_128bits(bytes.data(), bytes.size())); }

std::string hash_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_128bits_reset(state.get());
  std::vector<char> buffer(4 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    XXH3_128bits_update(state.get(), buffer.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw InputError(fmt::format("error while reading '{}'", path.string()));
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
