#pragma once
// Content hashes for step keys and input files (XXH3-128, from Debian's libxxhash).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace qstage {

// XXH3-128 of bytes, as 32 lowercase hex digits.
std::string hash_bytes(std::string_view bytes);

// XXH3-128 of a whole file's bytes (read ahead by several threads). Throws InputError if unreadable.
std::string hash_file(const std::filesystem::path& path);

// 16 lowercase hex digits of a 64-bit value (how checksums are shown and stored).
std::string hex64(std::uint64_t value);

// Parses hex64's output; throws std::invalid_argument on anything else.
std::uint64_t parse_hex64(std::string_view text);

}  // namespace qstage
