#pragma once
// A small RGB raster for plots: rectangles, 2-pixel lines (dashed or not), text in a built-in 5 x 7
// pixel font at scale 2, saved as PNG through io/png. Stages draw their `qstage inspect --plot`
// views with it (stages/common/views.hpp).
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace qstage::png {

struct Rgb {
  std::uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * static_cast<size_t>(h) * 3, 255) {}  // white
  void set(int x, int y, Rgb c);                                    // pixels outside are ignored
  void rect(int x0, int y0, int x1, int y1, Rgb c);                 // inclusive corners, any order
  void line(int x0, int y0, int x1, int y1, Rgb c, int dash = 0);  // Bresenham; dash: on/off run length
  // Text at scale 2 (12 px per character); `right` aligns its end at x. Capitals without a glyph
  // draw as small letters; characters without one as a blank.
  void text(int x, int y, const std::string& s, Rgb c, bool right = false);
  // A row of colour swatches with their labels, from (x, y) rightwards (a plot's key).
  void legend(int x, int y, const std::vector<std::pair<Rgb, std::string>>& items, Rgb text_color);
  static constexpr int kCharWidth = 12, kCharHeight = 14;
  void save(const std::filesystem::path& path) const;  // png::write_rgb: whole or not at all

 private:
  int w_, h_;
  std::vector<std::uint8_t> px_;
};

}  // namespace qstage::png
