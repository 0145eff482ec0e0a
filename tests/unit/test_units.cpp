#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/units.hpp"

using namespace qstage;

TEST(Units, ParsesSizes) {
  EXPECT_EQ(parse_size("512MiB", "x"), 512ull << 20);
  EXPECT_EQ(parse_size("4GB", "x"), 4000000000ull);
  EXPECT_EQ(parse_size("1.5 GiB", "x"), 3ull << 29);
  EXPECT_EQ(parse_size("123", "x"), 123u);
  EXPECT_EQ(parse_size("2G", "x"), 2ull << 30);
}

TEST(Units, RejectsBadSizes) {
  EXPECT_THROW(parse_size("lots", "--device-memory"), InputError);
  EXPECT_THROW(parse_size("4 parsecs", "--device-memory"), InputError);
  EXPECT_THROW(parse_size("-1GiB", "--device-memory"), InputError);
  try {
    parse_size("4XB", "--host-memory");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--host-memory"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("XB"), std::string::npos);
  }
}

TEST(Units, BudgetsArePositiveSizes) {
  EXPECT_EQ(parse_budget("512MiB", "x"), 512ull << 20);
  // 0 (or a size that rounds to 0 bytes) is a mistake, not "the default"
  for (const char* zero : {"0", "0B", "0GiB", "0.1B"}) {
    try {
      parse_budget(zero, "--device-memory");
      ADD_FAILURE() << zero << " was taken as a budget";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--device-memory"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("expected a positive size"), std::string::npos);
    }
  }
  EXPECT_THROW(parse_budget("lots", "--host-memory"), InputError);
}

TEST(Units, ParsesDurations) {
  EXPECT_DOUBLE_EQ(parse_duration("30s", "x")->count(), 30);
  EXPECT_DOUBLE_EQ(parse_duration("5m", "x")->count(), 300);
  EXPECT_DOUBLE_EQ(parse_duration("1.5h", "x")->count(), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("250ms", "x")->count(), 0.25);
  EXPECT_DOUBLE_EQ(parse_duration("0", "x")->count(), 0);
  EXPECT_FALSE(parse_duration("never", "x").has_value());
  EXPECT_THROW(parse_duration("soon", "x"), InputError);
  EXPECT_THROW(parse_duration("3 weeks", "x"), InputError);
}

TEST(Units, Formats) {
  EXPECT_EQ(format_bytes(512.0 * 1024 * 1024), "512 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_rate(3.21e9), "3.21 GB/s");
  EXPECT_EQ(format_duration(3723), "1h02m03s");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(0.0191), "19.1ms");
  EXPECT_EQ(format_duration(4.2e-5), "42us");
}

TEST(Hash, Hex64RoundTrips) {
  for (std::uint64_t v : {0ull, 1ull, 0xdeadbeefcafef00dull, ~0ull}) EXPECT_EQ(parse_hex64(hex64(v)), v);
  EXPECT_THROW(parse_hex64("xyz"), std::invalid_argument);
}

TEST(Hash, BytesHashIsStableAndSensitive) {
  EXPECT_EQ(hash_bytes("qstage"), hash_bytes("qstage"));
  EXPECT_NE(hash_bytes("qstage"), hash_bytes("qstagf"));
  EXPECT_EQ(hash_bytes("").size(), 32u);
}

// A file read ahead in rounds of blocks by several threads hashes as its bytes in one piece:
// sizes around a block (8 MiB) and past several rounds (at most 8 blocks each).
TEST(Hash, FileHashIsTheHashOfItsBytesWhateverItsSize) {
  const auto dir = std::filesystem::temp_directory_path() / ("qstage-hash-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string bytes;
  std::uint64_t x = 88172645463325252ull;
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, (std::size_t{8} << 20) - 1, (std::size_t{8} << 20) + 1,
                                 (std::size_t{200} << 20) + 12345}) {
    while (bytes.size() < size) {  // (xorshift: no two blocks alike)
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      bytes.append(reinterpret_cast<const char*>(&x), 8);
    }
    const std::string_view content(bytes.data(), size);
    const auto file = dir / std::to_string(size);
    std::ofstream(file, std::ios::binary).write(content.data(), static_cast<std::streamsize>(size));
    EXPECT_EQ(hash_file(file), hash_bytes(content)) << size << " bytes";
  }
  std::filesystem::remove_all(dir);
  EXPECT_THROW(hash_file(dir / "missing"), InputError);
}
