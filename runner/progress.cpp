#include "runner/progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/units.hpp"

namespace qstage::runner {

using Clock = std::chrono::steady_clock;

ProgressReporter::ProgressReporter(std::string label, std::uint64_t total_rows, std::uint64_t bytes_per_row,
                                   std::string unit, double flops_total, double interval_seconds,
                                   std::function<void(const std::string&)> save)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total_rows), bytes_per_row_(bytes_per_row),
      tty_(isatty(STDERR_FILENO) != 0),
      flops_(flops_total), interval_(interval_seconds), save_(std::move(save)) {}

std::string ProgressReporter::line(std::uint64_t done) const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double fraction = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  const double rows_per_s = elapsed > 0 ? static_cast<double>(done - first_) / elapsed : 0;
  const double eta = rows_per_s > 0 ? static_cast<double>(total_ - done) / rows_per_s : 0;
  std::string s = unit_.empty() ? fmt::format("{}  {:5.1f}%  {}/{}", label_, 100 * fraction,
                                              format_bytes(static_cast<double>(done * bytes_per_row_)),
                                              format_bytes(static_cast<double>(total_ * bytes_per_row_)))
                                : fmt::format("{}  {:5.1f}%  {}/{} {}", label_, 100 * fraction, done, total_, unit_);
  if (rows_per_s > 0) {
    s += unit_.empty() ? fmt::format("  {}", format_rate(rows_per_s * static_cast<double>(bytes_per_row_)))
                       : fmt::format("  {:.3g} {}/s", rows_per_s, unit_);
    if (flops_ > 0) s += fmt::format("  {:.2f} GFLOP/s", flops_ * rows_per_s / static_cast<double>(total_) / 1e9);
    s += fmt::format("  ETA {}", format_duration(eta));
  }
  return s;
}

void ProgressReporter::update(std::uint64_t done) {
  const auto now = Clock::now();
  if (!started_) {
    // The first report fixes the starting point, so resumed runs show this run's rate.
    started_ = true;
    start_ = now;
    last_ = now;
    first_ = done;
    return;
  }
  const double since_last = std::chrono::duration<double>(now - last_).count();
  if (since_last < (tty_ ? 0.25 : interval_)) return;
  last_ = now;
  const std::string text = line(done);
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K", text.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else {
    spdlog::info("{}", text);
  }
  if (save_) {
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    save_(nlohmann::json{{"rows_done", done}, {"rows_total", total_}, {"unit", unit_.empty() ? "rows" : unit_},
                         {"elapsed_seconds", elapsed},
                         {"bytes_per_second", elapsed > 0 ? static_cast<double>((done - first_) * bytes_per_row_) / elapsed : 0},
                         {"updated", std::time(nullptr)}}
              .dump());
  }
}

void ProgressReporter::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

}  // namespace qstage::runner
