#include "core/units.hpp"

#include <cctype>
#include <cmath>
#include <fmt/format.h>

#include "core/error.hpp"

namespace qstage {
namespace {

// Splits "12.5GiB" into 12.5 and "GiB"; returns false if there is no leading number.
bool split_number(std::string_view text, double& value, std::string& unit) {
  std::string s(text);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  s = s.substr(start);
  if (s.empty()) return false;
  size_t used = 0;
  try {
    value = std::stod(s, &used);
  } catch (...) {
    return false;
  }
  unit = s.substr(used);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  return std::isfinite(value);
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view what) {
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit) || value < 0)
    throw InputError(fmt::format("{}: '{}' is not a size; expected a number with a unit such as 512MiB or 4GB",
                                 what, text));
  struct Unit { const char* name; double factor; };
  static constexpr Unit units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"k", 1024.0}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}, {"T", 1099511627776.0}};
  for (const auto& u : units)
    if (unit == u.name) return static_cast<std::uint64_t>(std::llround(value * u.factor));
  throw InputError(fmt::format("{}: unknown size unit '{}' in '{}'; expected B, KB, MB, GB, KiB, MiB, GiB or TiB",
                               what, unit, text));
}

std::uint64_t parse_budget(std::string_view text, std::string_view what) {
  const std::uint64_t bytes = parse_size(text, what);
  if (bytes == 0)
    throw InputError(fmt::format("{}: '{}' is a budget of 0 bytes; expected a positive size such as 512MiB or 4GB "
                                 "(leave the option out for the default)", what, text));
  return bytes;
}

std::string format_bytes(double bytes) {
  static const char* names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024.0 && i < 5) { bytes /= 1024.0; ++i; }
  if (i == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.{}f} {}", bytes, bytes >= 100 ? 0 : bytes >= 10 ? 1 : 2, names[i]);
}

std::string format_rate(double rate) {
  static const char* names[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int i = 0;
  while (std::fabs(rate) >= 1000.0 && i < 4) { rate /= 1000.0; ++i; }
  return fmt::format("{:.{}f} {}", rate, rate >= 100 ? 0 : rate >= 10 ? 1 : 2, names[i]);
}

std::optional<std::chrono::duration<double>> parse_duration(std::string_view text, std::string_view what) {
  if (text == "never" || text == "inf" || text == "none") return std::nullopt;
  double value = 0;
  std::string unit;
  if (!split_number(text, value, unit) || value < 0)
    throw InputError(fmt::format("{}: '{}' is not a duration; expected e.g. 30s, 5m, 1h or never", what, text));
  double factor = 0;
  if (unit.empty() || unit == "s") factor = 1;
  else if (unit == "ms") factor = 1e-3;
  else if (unit == "m" || unit == "min") factor = 60;
  else if (unit == "h") factor = 3600;
  else
    throw InputError(fmt::format("{}: unknown duration unit '{}' in '{}'; expected ms, s, m or h", what, unit, text));
  return std::chrono::duration<double>(value * factor);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  // (below a second, three digits in ms or µs: a plan's predicted 19 ms is not "0.0s")
  if (seconds < 1e-3) return fmt::format("{:.3g}us", seconds * 1e6);
  if (seconds < 1) return fmt::format("{:.3g}ms", seconds * 1e3);
  if (seconds < 60) return fmt::format("{:.1f}s", seconds);
  auto total = static_cast<long long>(std::llround(seconds));
  long long h = total / 3600, m = (total % 3600) / 60, s = total % 60;
  if (h > 0) return fmt::format("{}h{:02}m{:02}s", h, m, s);
  return fmt::format("{}m{:02}s", m, s);
}

}  // namespace qstage
