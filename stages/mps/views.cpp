// The `qstage inspect --plot` view of mps.tebd's output (stages/common/views.hpp): the densities
// <n_j>(t) and the von Neumann entropies S(bond, t) as heat maps (site or bond across, time
// upwards, as light-cone plots are drawn), each with its colour bar, and the half-chain entropy
// against time.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/layout.hpp"
#include "io/canvas.hpp"
#include "io/h5.hpp"
#include "stages/mps/mps_stages.hpp"

namespace qstage::stages::mps {

namespace {

using png::Rgb;
constexpr Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225}, kVn{31, 119, 180}, kRenyi{255, 127, 14};

// The geometry (tests/python/test_mps_resume.py reads the heat maps' pixels by it).
constexpr int kWidth = 1280, kHeight = 720, kTop = 80, kBottom = 560;
constexpr int kDensityLeft = 90, kEntropyLeft = 530, kMapWidth = 360, kLineLeft = 980, kLineRight = 1250;
constexpr int kBarTop = 610, kBarBottom = 625;

// Viridis at nine evenly spaced points, linearly interpolated between them.
Rgb viridis(double x) {
  static constexpr std::array<Rgb, 9> kStops{{{68, 1, 84},
                                              {71, 44, 122},
                                              {59, 81, 139},
                                              {44, 113, 142},
                                              {33, 144, 141},
                                              {39, 173, 129},
                                              {92, 200, 99},
                                              {170, 220, 50},
                                              {253, 231, 37}}};
  if (!(x > 0)) return kStops.front();  // (NaN too)
  if (x >= 1) return kStops.back();
  const double s = x * (kStops.size() - 1);
  const auto i = static_cast<std::size_t>(s);
  const double f = s - static_cast<double>(i);
  auto mix = [f](std::uint8_t a, std::uint8_t b) { return static_cast<std::uint8_t>(std::lround(a + f * (b - a))); };
  return {mix(kStops[i].r, kStops[i + 1].r), mix(kStops[i].g, kStops[i + 1].g), mix(kStops[i].b, kStops[i + 1].b)};
}

// A float64 dataset of an mps.tebd output, whole, with its shape.
std::vector<double> read_series(const h5::File& f, const std::string& name, const std::filesystem::path& file,
                         std::vector<std::uint64_t>& shape) {
  if (!f.exists(name))
    throw InputError(fmt::format("'{}' has no dataset '{}'; expected an mps.tebd output (a time series)", file.string(), name));
  h5::Dataset d = f.open_dataset(name);
  shape = d.shape();
  std::vector<double> v(shape_elements(shape));
  if (!v.empty()) d.read_all(v.data());
  return v;
}

// A heat map of `values` (T rows of `cols`) over [left, left + kMapWidth] x [kTop, kBottom]:
// column c across, time upwards, each pixel row showing the last measurement at or before its
// time; its colour bar below, from lo to hi.
void heat_map(png::Canvas& c, int left, const std::vector<double>& times, const std::vector<double>& values,
              std::size_t cols, double lo, double hi, const std::string& title, const std::string& across,
              int first_label) {
  const double t_max = times.back(), range = hi > lo ? hi - lo : 1;
  for (int y = kTop; y <= kBottom; ++y) {
    const double t = t_max * (kBottom - y) / (kBottom - kTop);
    const auto k = static_cast<std::size_t>(std::upper_bound(times.begin(), times.end(), t) - times.begin()) - 1;
    for (int x = left; x < left + kMapWidth; ++x) {
      const auto col = static_cast<std::size_t>(x - left) * cols / kMapWidth;
      c.set(x, y, viridis((values[k * cols + col] - lo) / range));
    }
  }
  c.rect(left - 1, kTop - 1, left + kMapWidth, kTop - 1, kBlack);
  c.rect(left - 1, kBottom + 1, left + kMapWidth, kBottom + 1, kBlack);
  c.rect(left - 1, kTop - 1, left - 1, kBottom + 1, kBlack);
  c.rect(left + kMapWidth, kTop - 1, left + kMapWidth, kBottom + 1, kBlack);
  c.text(left, kTop - 24, title, kBlack);
  // Ticks: the first and last column's index, and the times 0, t_max / 2, t_max.
  c.text(left, kBottom + 8, std::to_string(first_label), kBlack);
  c.text(left + kMapWidth, kBottom + 8, std::to_string(first_label + static_cast<int>(cols) - 1), kBlack, true);
  c.text(left + kMapWidth / 2 - static_cast<int>(across.size()) * png::Canvas::kCharWidth / 2, kBottom + 8, across, kBlack);
  for (int i = 0; i <= 2; ++i) {
    const int y = kBottom - i * (kBottom - kTop) / 2;
    c.rect(left - 6, y, left - 2, y, kBlack);
    c.text(left - 8, y - png::Canvas::kCharHeight / 2, fmt::format("{:.3g}", t_max * i / 2), kBlack, true);
  }
  c.text(left - 30, kTop - 24, "t", kBlack);
  for (int x = left; x < left + kMapWidth; ++x)
    c.rect(x, kBarTop, x, kBarBottom, viridis(static_cast<double>(x - left) / (kMapWidth - 1)));
  c.text(left, kBarBottom + 6, fmt::format("{:.4g}", lo), kBlack);
  c.text(left + kMapWidth, kBarBottom + 6, fmt::format("{:.4g}", hi), kBlack, true);
}

void plot_evolution(const h5::File& f, const std::filesystem::path& file, const std::filesystem::path& png_file) {
  std::vector<std::uint64_t> ts, ds, es, rs;
  const auto times = read_series(f, "times", file, ts);
  const auto density = read_series(f, "density", file, ds);
  const auto entropy = read_series(f, "entropy_vN", file, es);
  const auto renyi = read_series(f, "entropy_2", file, rs);
  const std::size_t T = times.size();
  if (ts.size() != 1 || ds.size() != 2 || es.size() != 2 || ds[0] != T || es[0] != T || rs != es || T < 2)
    throw InputError(fmt::format("'{}' has no time series to plot (times {}, density {}, entropy_vN {}); expected an "
                                 "mps.tebd output with at least two measurements",
                                 file.string(), ts, ds, es));
  const std::size_t L = ds[1], bonds = es[1];
  if (bonds == 0) throw InputError(fmt::format("'{}' is a chain of {} site: it has no bond entropies to plot", file.string(), L));
  const auto [dlo, dhi] = std::minmax_element(density.begin(), density.end());
  const double smax = std::max(*std::max_element(entropy.begin(), entropy.end()), 0.0);

  png::Canvas c(kWidth, kHeight);
  c.text(kDensityLeft, 12,
         fmt::format("mps.tebd: L = {}, {} measurements to t = {:.6g}; max S_vN {:.4f}", L, T, times.back(), smax), kBlack);
  heat_map(c, kDensityLeft, times, density, L, *dlo, *dhi, "density n_j(t)", "site", 0);
  heat_map(c, kEntropyLeft, times, entropy, bonds, 0, smax, "entropy S_vN(bond, t)", "bond", 1);

  // The half-chain entropies (bond L/2) against time.
  const std::size_t half = L / 2 - 1;  // (the column of bond L/2)
  const double hi = std::max({smax, 1e-12, *std::max_element(renyi.begin(), renyi.end())}) * 1.05;
  auto x_of = [&](double t) { return kLineLeft + static_cast<int>(std::lround(t / times.back() * (kLineRight - kLineLeft))); };
  auto y_of = [&](double s) { return kBottom - static_cast<int>(std::lround(s / hi * (kBottom - kTop))); };
  for (int i = 0; i <= 4; ++i) {
    const double s = hi * i / 4;
    c.rect(kLineLeft, y_of(s), kLineRight, y_of(s), kGrid);
    c.text(kLineLeft - 6, y_of(s) - png::Canvas::kCharHeight / 2, fmt::format("{:.2f}", s), kBlack, true);
  }
  for (std::size_t k = 1; k < T; ++k) {
    c.line(x_of(times[k - 1]), y_of(renyi[(k - 1) * bonds + half]), x_of(times[k]), y_of(renyi[k * bonds + half]), kRenyi);
    c.line(x_of(times[k - 1]), y_of(entropy[(k - 1) * bonds + half]), x_of(times[k]), y_of(entropy[k * bonds + half]), kVn);
  }
  c.rect(kLineLeft, kTop, kLineLeft + 1, kBottom, kBlack);
  c.rect(kLineLeft, kBottom, kLineRight, kBottom + 1, kBlack);
  c.text(kLineLeft, kTop - 24, fmt::format("bond {} (half chain)", L / 2), kBlack);
  c.text(kLineLeft, kBottom + 8, "0", kBlack);
  c.text(kLineRight, kBottom + 8, fmt::format("{:.4g}", times.back()), kBlack, true);
  c.text((kLineLeft + kLineRight) / 2 - png::Canvas::kCharWidth / 2, kBottom + 8, "t", kBlack);
  c.legend(kLineLeft, kBarTop, {{kVn, "S_vN"}, {kRenyi, "S_2"}}, kBlack);
  c.save(png_file);
}

}  // namespace

}  // namespace qstage::stages::mps

namespace qstage::stages {

std::vector<View> mps_views() {
  return {{"mps.tebd", "the densities and entanglement entropies against time",
           "heat maps of the densities <n_j>(t) (site across, time upwards) and of the von Neumann entropy of every "
           "bond S_vN(bond, t), each with its colour bar (viridis, the data's range; entropies from 0), and the "
           "half-chain S_vN and S_2 against t",
           mps::plot_evolution}};
}

}  // namespace qstage::stages
