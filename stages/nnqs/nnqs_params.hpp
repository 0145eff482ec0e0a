#pragma once
// sci.nnqs's parameters (schemas/stages/sci.nnqs.json gives their defaults and ranges).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stages/sci/problem.hpp"

namespace qstage::nnqs {

struct NnqsParams {
  sci::StateRequest state;
  int max_iterations = 10;          // outer iterations: optimize on S, then grow S
  int steps = 200;                  // AdamW steps on E an iteration
  int fit_steps = 200;              // AdamW steps first fitting psi to H's lowest eigenvector within S
  std::uint64_t max_new_dets = 1000, max_dets = 1000000;
  double eps_couple = 0;            // the coupled set: excitations with |H_ai| > eps_couple
  double energy_tolerance = 1e-6;   // stop once an iteration changes E by less (Ha)
  double learning_rate = 1e-3, weight_decay = 0;
  std::uint64_t seed = 1;           // the network's initial weights
  std::uint64_t inference_batch = 65536;
  int embedding = 32, layers = 4, heads = 4;
  std::vector<int> phase_hidden{512, 512, 512};

  static NnqsParams from_json(const nlohmann::json& p) {
    NnqsParams s;
    s.state = sci::StateRequest::from_json(p);
    s.max_iterations = p.value("max_iterations", s.max_iterations);
    s.steps = p.value("steps", s.steps);
    s.fit_steps = p.value("fit_steps", s.fit_steps);
    s.max_new_dets = p.value("max_new_dets", s.max_new_dets);
    s.max_dets = p.value("max_dets", s.max_dets);
    s.eps_couple = p.value("eps_couple", s.eps_couple);
    s.energy_tolerance = p.value("energy_tolerance", s.energy_tolerance);
    s.learning_rate = p.value("learning_rate", s.learning_rate);
    s.weight_decay = p.value("weight_decay", s.weight_decay);
    s.seed = p.value("seed", s.seed);
    s.inference_batch = p.value("inference_batch", s.inference_batch);
    if (p.contains("model")) {
      const nlohmann::json& m = p.at("model");
      s.embedding = m.value("embedding", s.embedding);
      s.layers = m.value("layers", s.layers);
      s.heads = m.value("heads", s.heads);
      s.phase_hidden = m.value("phase_hidden", s.phase_hidden);
    }
    return s;
  }
};

}  // namespace qstage::nnqs
