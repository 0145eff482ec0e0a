#include "cli/plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "io/png.hpp"
#include "stages/tn/network.hpp"

namespace qstage::cli {

namespace {

struct Rgb {
  std::uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrid{225, 225, 225}, kBars{31, 119, 180},
    kLive{255, 127, 14}, kArena{214, 39, 40}, kSpilled{148, 103, 189};

// A 5 x 7 pixel font: each glyph is 7 rows of 5 bits (bit 4 the leftmost pixel).
struct Glyph {
  char c;
  std::array<std::uint8_t, 7> rows;
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}}, {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}}, {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'g', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}},
    {'q', {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01}}, {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}}, {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}}, {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}}, {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'y', {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E}}, {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}}, {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}}, {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'\'', {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00}}, {' ', {0, 0, 0, 0, 0, 0, 0}},
};

const Glyph* glyph(char c) {
  for (const auto& g : kFont)
    if (g.c == c) return &g;
  const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // capitals without a glyph
  for (const auto& g : kFont)
    if (g.c == lower) return &g;
  return nullptr;
}

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * static_cast<size_t>(h) * 3, 255) {}
  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    auto* p = &px_[(static_cast<size_t>(y) * static_cast<size_t>(w_) + static_cast<size_t>(x)) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {  // inclusive corners, any order
    for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
      for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
  }
  void line(int x0, int y0, int x1, int y1, Rgb c, int dash = 0) {  // Bresenham; dash: on/off run length
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    for (int err = dx + dy, step = 0;; ++step) {
      if (!dash || (step / dash) % 2 == 0) rect(x0, y0, x0 + 1, y0 + 1, c);  // 2 px wide
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  // Text at scale 2 (12 px per character); `right` aligns its end at x.
  void text(int x, int y, const std::string& s, Rgb c, bool right = false) {
    if (right) x -= static_cast<int>(s.size()) * kCharWidth;
    for (char ch : s) {
      if (const Glyph* g = glyph(ch))
        for (int row = 0; row < 7; ++row)
          for (int col = 0; col < 5; ++col)
            if (g->rows[static_cast<size_t>(row)] & (0x10 >> col)) rect(x + 2 * col, y + 2 * row, x + 2 * col + 1, y + 2 * row + 1, c);
      x += kCharWidth;
    }
  }
  static constexpr int kCharWidth = 12, kCharHeight = 14;
  void save(const std::filesystem::path& path) const { png::write_rgb(path, w_, h_, px_); }

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
};

// 2^k bytes in binary units: "16 MiB".
std::string power_of_two_bytes(int k) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return fmt::format("{} {}", std::uint64_t{1} << (k % 10), units[std::min(k / 10, 6)]);
}

std::vector<std::uint64_t> read_column(h5::File& f, const std::string& name, const std::filesystem::path& file) {
  if (!f.exists(name))
    throw InputError(fmt::format("'{}' has no dataset '{}'; expected a tn.plan output", file.string(), name));
  h5::Dataset d = f.open_dataset(name);
  std::vector<std::uint64_t> v(d.shape().at(0));
  if (!v.empty()) d.read_all(v.data());
  return v;
}

}  // namespace

void plot_plan(const std::filesystem::path& plan_file, const std::filesystem::path& png_file) {
  h5::File f = h5::File::open(plan_file, h5::Mode::read_only);
  if (!f.has_attribute("qstage.stage") || f.string_attribute("qstage.stage") != "tn.plan")
    throw InputError(fmt::format("'{}' is not a tn.plan output; --plot draws a plan's tensor sizes along its path",
                                 plan_file.string()));
  const auto out = read_column(f, "steps/output_bytes", plan_file);
  const auto live = read_column(f, "steps/live_bytes", plan_file);
  if (out.empty()) throw InputError(fmt::format("'{}' has no steps to plot (a network of one tensor)", plan_file.string()));
  std::vector<bool> spilled(out.size(), false);  // results kept in host memory (out of core)
  const auto plan = tn::read_json_dataset(f, "plan");
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

  Canvas c(kWidth, kHeight);
  const int tick = std::max(1, (y_hi - y_lo + 9) / 10);  // at most about 10 labels
  for (int k = y_lo; k <= y_hi; k += tick) {
    const int y = y_of(std::uint64_t{1} << k);
    c.rect(kLeft, y, kRight, y, kGrid);
    c.text(kLeft - 8, y - Canvas::kCharHeight / 2, power_of_two_bytes(k), kBlack, true);
  }
  for (size_t s = 0; s < out.size(); ++s) c.line(x_of(s), kBottom, x_of(s), y_of(out[s]), spilled[s] ? kSpilled : kBars);
  for (size_t s = 1; s < live.size(); ++s) c.line(x_of(s - 1), y_of(live[s - 1]), x_of(s), y_of(live[s]), kLive);
  c.line(kLeft, y_of(arena), kRight, y_of(arena), kArena, 8);
  c.rect(kLeft, kTop, kLeft + 1, kBottom, kBlack);
  c.rect(kLeft, kBottom, kRight, kBottom + 1, kBlack);
  const size_t x_tick = std::max<size_t>(1, out.size() / 8);
  for (size_t s = 0; s < out.size(); s += x_tick) {
    c.rect(x_of(s), kBottom, x_of(s), kBottom + 6, kBlack);
    c.text(x_of(s) - Canvas::kCharWidth / 2, kBottom + 12, std::to_string(s), kBlack);
  }
  c.text((kLeft + kRight) / 2 - 2 * Canvas::kCharWidth, kBottom + 36, "step", kBlack);
  c.text(kLeft, 8, fmt::format("tn.plan: {} steps, {} slice{}, arena {}", out.size(), slices, slices == 1 ? "" : "s",
                                format_bytes(static_cast<double>(arena))), kBlack);
  // Legend, one row between the title and the plot.
  int lx = kLeft;
  std::vector<std::pair<Rgb, std::string>> legend = {{kBars, "intermediate"}};
  if (any_spilled) legend.push_back({kSpilled, "in host memory"});
  legend.push_back({kLive, "arena in use"});
  legend.push_back({kArena, "arena size"});
  for (const auto& [color, label] : legend) {
    c.rect(lx, 36 + 3, lx + 14, 36 + 10, color);
    c.text(lx + 20, 36, label, kBlack);
    lx += 20 + static_cast<int>(label.size()) * Canvas::kCharWidth + 24;
  }
  c.save(png_file);
}

}  // namespace qstage::cli
