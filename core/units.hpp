#pragma once
// Human-friendly sizes ("512MiB", "4GB") and durations ("30s", "5m", "never").
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qstage {

// Parses a byte size: a number with an optional unit B, KB, MB, GB, TB (powers of 1000) or
// KiB, MiB, GiB, TiB (powers of 1024); "k", "M", "G" alone mean KiB, MiB, GiB.
// Throws InputError naming `what` if the text is not a size.
std::uint64_t parse_size(std::string_view text, std::string_view what);

// Parses a memory budget (--device-memory, options.host_memory, ...): a size as parse_size, and
// more than zero bytes. A budget of 0 is refused rather than taken as "the default" (that is
// what leaving the option out means), so that a typo cannot silently lift a limit.
std::uint64_t parse_budget(std::string_view text, std::string_view what);

// Formats bytes with a binary unit and three significant digits: "1.50 GiB".
std::string format_bytes(double bytes);

// Formats a rate in bytes per second: "3.21 GB/s" (decimal units, as bandwidths usually are).
std::string format_rate(double bytes_per_second);

// Parses a duration: a number with unit ms, s, m, h (plain numbers are seconds).
// "never" (or "inf") returns std::nullopt. Throws InputError naming `what` otherwise.
std::optional<std::chrono::duration<double>> parse_duration(std::string_view text, std::string_view what);

// Formats seconds as "1h02m03s", "4m05s", "12.3s", "19.1ms" or "42us".
std::string format_duration(double seconds);

}  // namespace qstage
