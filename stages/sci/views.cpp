// The `qstage inspect --plot` view of sci.solve's output (stages/common/views.hpp): the energy against
// the size of the space, iteration by iteration, with the reference energy when the run had one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/canvas.hpp"
#include "io/h5.hpp"
#include "stages/sci/sci_stages.hpp"

namespace qstage::sci {

namespace {

using png::Rgb;
constexpr Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225}, kVar{31, 119, 180}, kTotal{255, 127, 14}, kReference{214, 39, 40};

template <typename T>
std::vector<double> column(const h5::File& f, const std::string& name, const std::filesystem::path& file) {
  if (!f.exists(name))
    throw InputError(fmt::format("'{}' has no dataset '{}'; expected a sci.solve output", file.string(), name));
  h5::Dataset d = f.open_dataset(name);
  std::vector<T> v(d.shape().at(0));
  if (!v.empty()) d.read_all(v.data());
  return {v.begin(), v.end()};
}

void plot_convergence(const h5::File& f, const std::filesystem::path& file, const std::filesystem::path& png_file) {
  const auto dets = column<std::uint64_t>(f, "iterations/dets", file);
  const auto e_var = column<double>(f, "iterations/e_var", file);
  const auto e_pt2 = column<double>(f, "iterations/e_pt2", file);
  if (dets.empty()) throw InputError(fmt::format("'{}' has no iterations to plot", file.string()));
  std::vector<double> total(e_var.size());
  for (std::size_t k = 0; k < e_var.size(); ++k) total[k] = e_var[k] + e_pt2[k];
  const bool has_reference = f.has_attribute("reference_energy");
  const double reference = has_reference ? f.double_attribute("reference_energy") : 0;

  constexpr int kWidth = 960, kHeight = 540, kLeft = 170, kRight = 930, kTop = 60, kBottom = 470;
  // The range of E_var and the reference: early iterations' PT2 (from a space far from converged)
  // may lie far outside it, and those points are left out rather than squeezing the rest.
  double lo = *std::min_element(e_var.begin(), e_var.end()), hi = *std::max_element(e_var.begin(), e_var.end());
  if (has_reference) {
    lo = std::min(lo, reference);
    hi = std::max(hi, reference);
  }
  for (double t : total)
    if (t >= lo - (hi - lo) && t <= hi) lo = std::min(lo, t);
  if (hi - lo < 1e-6) {
    lo -= 5e-7;
    hi += 5e-7;
  }
  const double pad = 0.05 * (hi - lo);
  lo -= pad;
  hi += pad;
  const double x_lo = std::floor(std::log10(std::max(1.0, dets.front()))),
               x_hi = std::max(x_lo + 1, std::ceil(std::log10(std::max(1.0, dets.back()))));
  auto x_of = [&](double n) {
    return kLeft + static_cast<int>(std::lround((std::log10(std::max(1.0, n)) - x_lo) / (x_hi - x_lo) * (kRight - kLeft)));
  };
  auto y_of = [&](double e) { return kBottom - static_cast<int>(std::lround((e - lo) / (hi - lo) * (kBottom - kTop))); };

  png::Canvas c(kWidth, kHeight);
  for (int k = 0; k <= 8; ++k) {
    const double e = lo + (hi - lo) * k / 8;
    c.rect(kLeft, y_of(e), kRight, y_of(e), kGrid);
    c.text(kLeft - 8, y_of(e) - png::Canvas::kCharHeight / 2, fmt::format("{:.6f}", e), kBlack, true);
  }
  for (int p = static_cast<int>(x_lo); p <= static_cast<int>(x_hi); ++p) {
    const int x = x_of(std::pow(10.0, p));
    c.rect(x, kTop, x, kBottom, kGrid);
    c.text(x - png::Canvas::kCharWidth, kBottom + 12, fmt::format("1e{}", p), kBlack);
  }
  if (has_reference) c.line(kLeft, y_of(reference), kRight, y_of(reference), kReference, 8);
  auto series = [&](const std::vector<double>& e, Rgb color) {
    auto shown = [&](std::size_t k) { return e[k] >= lo && e[k] <= hi; };
    for (std::size_t k = 0; k < e.size(); ++k) {
      if (!shown(k)) continue;
      c.rect(x_of(dets[k]) - 3, y_of(e[k]) - 3, x_of(dets[k]) + 3, y_of(e[k]) + 3, color);
      if (k && shown(k - 1)) c.line(x_of(dets[k - 1]), y_of(e[k - 1]), x_of(dets[k]), y_of(e[k]), color);
    }
  };
  series(e_var, kVar);
  series(total, kTotal);
  c.rect(kLeft, kTop, kLeft + 1, kBottom, kBlack);
  c.rect(kLeft, kBottom, kRight, kBottom + 1, kBlack);
  c.text((kLeft + kRight) / 2 - 7 * png::Canvas::kCharWidth, kBottom + 36, "determinants (log)", kBlack);
  c.text(kLeft, 8, fmt::format("sci.solve: {} iterations, {} determinants, E_var {:.8f}", dets.size(),
                                static_cast<std::uint64_t>(dets.back()), e_var.back()), kBlack);
  std::vector<std::pair<Rgb, std::string>> legend = {{kVar, "E_var"}, {kTotal, "E_var with PT2"}};
  if (has_reference) legend.push_back({kReference, fmt::format("reference {:.8f} Ha", reference)});
  c.legend(kLeft, 36, legend, kBlack);
  c.save(png_file);
}

}  // namespace

}  // namespace qstage::sci

namespace qstage::stages {

std::vector<View> sci_views() {
  return {{"sci.solve", "the energy against the determinants, iteration by iteration",
           "E_var and E_var + E_PT2 of each iteration against the size of its space (log), with the "
           "reference energy when the run was given one",
           sci::plot_convergence}};
}

}  // namespace qstage::stages
