#pragma once
// sci.nnqs's parameters (schemas/stages/sci.nnqs.json gives their defaults and ranges).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stages/nnqs/network.hpp"
#include "stages/sci/problem.hpp"

namespace qstage::nnqs {

struct NnqsParams {
  sci::StateRequest state;
  int max_iterations = 10;          // outer iterations: optimize on S, then grow S
  int steps = 200;                  // AdamW steps on E an iteration
  int fit_steps = 200;              // AdamW steps first fitting psi to H's lowest eigenvector within S
  double fit_tolerance = 0;         // the fit stops early once its infidelity is below this
  std::uint64_t max_new_dets = 1000, max_dets = 1000000;
  double eps_couple = 0;            // the coupled set: excitations with |H_ai| > eps_couple
  double energy_tolerance = 1e-6;   // stop once an iteration changes E by less (Ha)
  std::uint64_t inference_batch = 65536;
  std::uint64_t train_batch = 4096;  // rows a gradient unit takes (forward and backward at once)
  std::optional<double> reference_energy;  // a known energy, kept with the output for plots
  NetworkShape network;             // sizes, AdamW's rates and the seed (the run sets the orbitals and electrons)

  static NnqsParams from_json(const nlohmann::json& p) {
    NnqsParams s;
    s.state = sci::StateRequest::from_json(p);
    s.max_iterations = p.value("max_iterations", s.max_iterations);
    s.steps = p.value("steps", s.steps);
    s.fit_steps = p.value("fit_steps", s.fit_steps);
    s.fit_tolerance = p.value("fit_tolerance", s.fit_tolerance);
    s.max_new_dets = p.value("max_new_dets", s.max_new_dets);
    s.max_dets = p.value("max_dets", s.max_dets);
    s.eps_couple = p.value("eps_couple", s.eps_couple);
    s.energy_tolerance = p.value("energy_tolerance", s.energy_tolerance);
    s.inference_batch = p.value("inference_batch", s.inference_batch);
    s.train_batch = p.value("train_batch", s.train_batch);
    if (p.contains("reference_energy")) s.reference_energy = p.at("reference_energy").get<double>();
    NetworkShape& n = s.network;
    n.learning_rate = p.value("learning_rate", n.learning_rate);
    n.weight_decay = p.value("weight_decay", n.weight_decay);
    n.seed = p.value("seed", n.seed);
    n.model_file = p.value("model_file", n.model_file);  // (the spec's path; the run takes the resolved one)
    if (p.contains("model")) {
      const nlohmann::json& m = p.at("model");
      n.embedding = m.value("embedding", n.embedding);
      n.layers = m.value("layers", n.layers);
      n.heads = m.value("heads", n.heads);
      n.phase_hidden = m.value("phase_hidden", n.phase_hidden);
    }
    return s;
  }
};

}  // namespace qstage::nnqs
