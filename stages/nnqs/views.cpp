// The `qstage inspect --plot` view of sci.nnqs's output (stages/common/views.hpp): the energy error
// against iterations on a log scale, like seed 004's Fig. 7: the network's energy and the lowest
// energy its space allows, against the run's reference_energy (or, without one, against the
// lowest energy of the last space), with chemical accuracy marked.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/canvas.hpp"
#include "io/h5.hpp"
#include "stages/nnqs/nnqs_stages.hpp"

namespace qstage::nnqs {

namespace {

using png::Rgb;
constexpr Rgb kBlack{0, 0, 0}, kGrid{225, 225, 225}, kNetwork{31, 119, 180}, kSpace{255, 127, 14},
    kAccuracy{214, 39, 40};
constexpr double kChemicalAccuracy = 1.6e-3;  // Ha
constexpr double kFloor = 1e-9;               // errors below (or at) zero are drawn here

std::vector<double> column(const h5::File& f, const std::string& name, const std::filesystem::path& file) {
  if (!f.exists(name))
    throw InputError(fmt::format("'{}' has no dataset '{}'; expected a sci.nnqs output", file.string(), name));
  h5::Dataset d = f.open_dataset(name);
  std::vector<double> v(d.shape().at(0));
  if (!v.empty()) d.read_all(v.data());
  return v;
}

void plot_energy_error(const h5::File& f, const std::filesystem::path& file, const std::filesystem::path& png_file) {
  const std::vector<double> energy = column(f, "iterations/energy", file);
  const std::vector<double> space = column(f, "iterations/ci_energy", file);
  if (energy.empty()) throw InputError(fmt::format("'{}' has no iterations to plot", file.string()));
  const bool has_reference = f.has_attribute("reference_energy");
  const double reference =
      has_reference ? f.double_attribute("reference_energy") : *std::min_element(space.begin(), space.end());
  auto error = [&](double e) { return std::max(e - reference, kFloor); };

  // Geometry: plot area [kLeft, kRight] x [kTop, kBottom]; y is log10 of the error in Ha.
  constexpr int kWidth = 960, kHeight = 540, kLeft = 110, kRight = 930, kTop = 70, kBottom = 470;
  double lo = has_reference ? kChemicalAccuracy : 1.0, hi = lo;
  for (const auto* series : {&energy, &space})
    for (const double e : *series) lo = std::min(lo, error(e)), hi = std::max(hi, error(e));
  const int y_lo = static_cast<int>(std::floor(std::log10(lo))), y_hi = std::max(y_lo + 1, static_cast<int>(std::ceil(std::log10(hi))));
  const double last = static_cast<double>(std::max<std::size_t>(energy.size() - 1, 1));
  auto x_of = [&](std::size_t k) { return kLeft + static_cast<int>(std::lround(static_cast<double>(k) / last * (kRight - kLeft))); };
  auto y_of = [&](double v) {
    return kBottom - static_cast<int>(std::lround((std::log10(v) - y_lo) / (y_hi - y_lo) * (kBottom - kTop)));
  };

  png::Canvas c(kWidth, kHeight);
  for (int p = y_lo; p <= y_hi; ++p) {
    c.rect(kLeft, y_of(std::pow(10.0, p)), kRight, y_of(std::pow(10.0, p)), kGrid);
    c.text(kLeft - 8, y_of(std::pow(10.0, p)) - png::Canvas::kCharHeight / 2, fmt::format("1e{}", p), kBlack, true);
  }
  const std::size_t tick = std::max<std::size_t>(1, energy.size() / 10);
  for (std::size_t k = 0; k < energy.size(); k += tick) {
    c.rect(x_of(k), kTop, x_of(k), kBottom, kGrid);
    c.text(x_of(k) - png::Canvas::kCharWidth / 2, kBottom + 12, fmt::format("{}", k), kBlack);
  }
  if (has_reference) c.line(kLeft, y_of(kChemicalAccuracy), kRight, y_of(kChemicalAccuracy), kAccuracy, 8);
  auto series = [&](const std::vector<double>& e, Rgb color) {
    for (std::size_t k = 0; k < e.size(); ++k) {
      c.rect(x_of(k) - 3, y_of(error(e[k])) - 3, x_of(k) + 3, y_of(error(e[k])) + 3, color);
      if (k) c.line(x_of(k - 1), y_of(error(e[k - 1])), x_of(k), y_of(error(e[k])), color);
    }
  };
  series(space, kSpace);
  series(energy, kNetwork);
  c.rect(kLeft, kTop, kLeft + 1, kBottom, kBlack);
  c.rect(kLeft, kBottom, kRight, kBottom + 1, kBlack);
  c.text((kLeft + kRight) / 2 - 5 * png::Canvas::kCharWidth, kBottom + 36, "iteration", kBlack);
  c.text(10, 8,
         fmt::format("sci.nnqs: E {:.8f} Ha, {} iterations, error (Ha) against {}", energy.back(), energy.size(),
                     has_reference ? fmt::format("{:.8f}", reference) : "the last space's lowest E"),
         kBlack);
  std::vector<std::pair<Rgb, std::string>> legend = {{kNetwork, "network"}, {kSpace, "lowest on its space"}};
  if (has_reference) legend.push_back({kAccuracy, "chemical accuracy (1.6 mHa)"});
  c.legend(kLeft, 40, legend, kBlack);
  c.save(png_file);
}

}  // namespace

}  // namespace qstage::nnqs

namespace qstage::stages {

std::vector<View> nnqs_views() {
  return {{"sci.nnqs", "the energy error against iterations",
           "the error (log scale) of the network's energy and of the lowest energy its space allows, iteration by "
           "iteration, against the run's reference_energy with chemical accuracy marked (without one, against the "
           "last space's lowest energy)",
           nnqs::plot_energy_error}};
}

}  // namespace qstage::stages
