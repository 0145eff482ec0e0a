// The `qstage inspect --plot` views of the tn family's outputs (stages/common/views.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/units.hpp"
#include "io/canvas.hpp"
#include "io/h5.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::tn {

namespace {

using png::Rgb;
constexpr Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225}, kBars{31, 119, 180}, kLive{255, 127, 14}, kArena{214, 39, 40},
    kSpilled{148, 103, 189};

// 2^k bytes in binary units: "16 MiB".
std::string power_of_two_bytes(int k) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return fmt::format("{} {}", std::uint64_t{1} << (k % 10), units[std::min(k / 10, 6)]);
}

std::vector<std::uint64_t> read_column(const h5::File& f, const std::string& name, const std::filesystem::path& file) {
  if (!f.exists(name))
    throw InputError(fmt::format("'{}' has no dataset '{}'; expected a tn.plan output", file.string(), name));
  h5::Dataset d = f.open_dataset(name);
  std::vector<std::uint64_t> v(d.shape().at(0));
  if (!v.empty()) d.read_all(v.data());
  return v;
}

// The size of every intermediate along a tn.plan's path (log2 bytes per step), with the arena in
// use and the plan's arena size, like seed 000's Fig. 5.
void plot_plan(const h5::File& f, const std::filesystem::path& plan_file, const std::filesystem::path& png_file) {
  const auto out = read_column(f, "steps/output_bytes", plan_file);
  const auto live = read_column(f, "steps/live_bytes", plan_file);
  if (out.empty()) throw InputError(fmt::format("'{}' has no steps to plot (a network of one tensor)", plan_file.string()));
  std::vector<bool> spilled(out.size(), false);  // results kept in host memory (out of core)
  const auto plan = read_json_dataset(f, "plan");
  for (size_t s = 0; s < out.size() && s < plan.at("steps").size(); ++s)
    spilled[s] = plan["steps"][s].at("host").at(2).get<bool>();
  const bool any_spilled = std::find(spilled.begin(), spilled.end(), true) != spilled.end();
  const auto arena = static_cast<std::uint64_t>(f.int_attribute("arena_bytes"));
  const std::int64_t slices = f.int_attribute("slices");

  // Geometry (tests decode the image with the same numbers): plot area [kLeft, kRight] x [kTop, kBottom].
  constexpr int kWidth = 960, kHeight = 540, kLeft = 110, kRight = 930, kTop = 60, kBottom = 470;
  const auto top_bytes = std::max({arena, *std::max_element(out.begin(), out.end()), *std::max_element(live.begin(), live.end())});
  std::uint64_t low_bytes = top_bytes;
  for (auto b : out) low_bytes = std::min(low_bytes, std::max<std::uint64_t>(b, 1));
  const int y_lo = static_cast<int>(std::floor(std::log2(static_cast<double>(low_bytes))));
  const int y_hi = std::max(y_lo + 1, static_cast<int>(std::ceil(std::log2(static_cast<double>(top_bytes)))));
  const auto n = static_cast<double>(out.size());
  auto x_of = [&](size_t step) {
    return kLeft + static_cast<int>((static_cast<double>(step) + 0.5) * (kRight - kLeft) / n);
  };
  auto y_of = [&](std::uint64_t bytes) {
    const double l = std::log2(static_cast<double>(std::max<std::uint64_t>(bytes, 1)));
    const double t = std::clamp((l - y_lo) / (y_hi - y_lo), 0.0, 1.0);
    return kBottom - static_cast<int>(std::lround(t * (kBottom - kTop)));
  };

  png::Canvas c(kWidth, kHeight);
  const int tick = std::max(1, (y_hi - y_lo + 9) / 10);  // at most about 10 labels
  for (int k = y_lo; k <= y_hi; k += tick) {
    const int y = y_of(std::uint64_t{1} << k);
    c.rect(kLeft, y, kRight, y, kGrid);
    c.text(kLeft - 8, y - png::Canvas::kCharHeight / 2, power_of_two_bytes(k), kBlack, true);
  }
  for (size_t s = 0; s < out.size(); ++s) c.line(x_of(s), kBottom, x_of(s), y_of(out[s]), spilled[s] ? kSpilled : kBars);
  for (size_t s = 1; s < live.size(); ++s) c.line(x_of(s - 1), y_of(live[s - 1]), x_of(s), y_of(live[s]), kLive);
  c.line(kLeft, y_of(arena), kRight, y_of(arena), kArena, 8);
  c.rect(kLeft, kTop, kLeft + 1, kBottom, kBlack);
  c.rect(kLeft, kBottom, kRight, kBottom + 1, kBlack);
  const size_t x_tick = std::max<size_t>(1, out.size() / 8);
  for (size_t s = 0; s < out.size(); s += x_tick) {
    c.rect(x_of(s), kBottom, x_of(s), kBottom + 6, kBlack);
    c.text(x_of(s) - png::Canvas::kCharWidth / 2, kBottom + 12, std::to_string(s), kBlack);
  }
  c.text((kLeft + kRight) / 2 - 2 * png::Canvas::kCharWidth, kBottom + 36, "step", kBlack);
  c.text(kLeft, 8, fmt::format("tn.plan: {} steps, {} slice{}, arena {}", out.size(), slices, slices == 1 ? "" : "s",
                                format_bytes(static_cast<double>(arena))), kBlack);
  // Legend, one row between the title and the plot.
  std::vector<std::pair<Rgb, std::string>> legend = {{kBars, "intermediate"}};
  if (any_spilled) legend.push_back({kSpilled, "in host memory"});
  legend.push_back({kLive, "arena in use"});
  legend.push_back({kArena, "arena size"});
  c.legend(kLeft, 36, legend, kBlack);
  c.save(png_file);
}

}  // namespace

}  // namespace qstage::tn

namespace qstage::stages {

std::vector<View> tn_views() {
  return {{"tn.plan", "a plan's tensor sizes along its path",
           "each step's intermediate size along the path, the arena in use and the arena's size (log scale)",
           tn::plot_plan}};
}

}  // namespace qstage::stages
