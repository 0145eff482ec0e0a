#pragma once
// Networks of seed 000's Fig. 1 beyond circuits and lattice dynamics, built from parameters:
//
//   (b) exact maximum-likelihood decoding of the rotated surface code: the probability of the
//       observed syndrome jointly with each logical class, as a contraction over every error
//       configuration (bit flips on the data qubits and, over several rounds, measurement flips);
//   (c) independent sets on a King's subgraph: the independence polynomial at a fugacity
//       (the number of independent sets at fugacity 1), or in the tropical semiring the maximum
//       independent set's size and the number of maximum independent sets;
//   and spin glasses on a square lattice: the partition function at an inverse temperature, or
//   in the tropical semiring the ground-state energy and degeneracy (Liu, Wang and Zhang,
//   PRL 126, 090506 (2021), seed 000's refs [7] and [11]).
//
// All are generic networks of extent-2 modes. Each comes with a JSON description of the instance
// (the graph, the detectors and the syndrome), written by tn.build as the attribute "problem".
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stages/tn/network.hpp"

namespace qstage::tn {

struct Problem {
  Network network;
  nlohmann::json about;  // the instance, for the user and for tests' independent oracles
};

// Sites (r, c) of a rows x cols grid, each kept with probability `fill` (seeded), edges between
// kept sites a king's move apart. Vertex v: a copy tensor over its edges' modes, 1 for "out" and
// `fugacity` for "in"; edge (u, v): [[1, 1], [1, 0]] (not both in). A kept site without
// neighbours: [1, fugacity] joined to [1, 1]. The contraction is sum over independent sets S of
// fugacity^|S|.
//
// Tropical (Network::semiring, kernels/linalg/tropical.hpp): "in" is (1, 1), "out" (0, 1) and a
// forbidden pair zero, so the contraction is (the largest |S|, how many S reach it); the fugacity
// plays no part.
struct IndependentSetOptions {
  int rows = 4, cols = 4;
  double fill = 0.8;
  std::uint64_t seed = 0;
  double fugacity = 1.0;
  bool tropical = false;
};
Problem king_independent_sets(const IndependentSetOptions& o);

// An Ising spin glass on a rows x cols square lattice, open boundaries: spins s_v = +-1 (bit b:
// s = 1 - 2b), E(s) = sum over lattice edges (u, v) of J_uv s_u s_v, couplings J_uv = +-1 with
// equal probability (seeded) or Gaussian (mean 0, variance 1). Vertex v: a copy tensor over its
// edges' modes; edge (u, v): exp(-beta J_uv s_u s_v). The contraction is Z = sum_s exp(-beta E(s)).
// Tropical: an edge's entries are (-J_uv s_u s_v, 1), so the contraction is (-E_0, the number
// of ground states); with +-1 couplings every exponent is an integer, so the count is exact.
struct SpinGlassOptions {
  int rows = 4, cols = 4;
  std::string couplings = "pm1";  // "pm1" or "gaussian"
  std::uint64_t seed = 0;
  double beta = 1.0;
  bool tropical = false;
};
Problem square_spin_glass(const SpinGlassOptions& o);

// Decoding from a detector error model: independent error mechanisms, each flipping a set of
// detectors and of logical observables with its probability (stim's .dem files describe these).
struct ErrorMechanism {
  double p = 0;
  std::vector<int> detectors, observables;
};
struct DecodingModel {
  int detectors = 0, observables = 0;
  std::vector<ErrorMechanism> mechanisms;
};

// A detector error model in stim's text format: error(p) with D<k>, L<k> and ^ targets,
// detector, logical_observable, shift_detectors and (nested) repeat N { ... } blocks, # comments.
// InputError naming `what` and the line for anything else, and for a model of more than 2^20
// instructions or detectors once expanded (counted before expanding). Throws StopRequested if a
// stop is requested while it expands the repeat blocks.
DecodingModel read_detector_error_model(const std::string& text, const std::string& what);

// The syndrome (one 0/1 character per detector) given, or sampled from `seed` (each mechanism
// fires with its probability, in order); a sampled error's observables are recorded.
struct Syndrome {
  std::optional<std::string> given;
  std::uint64_t seed = 0;
};

// How a decoding problem becomes a network. `checks`: every mechanism a copy tensor with its
// weights, joined to the detectors and observables it flips; every detector a parity tensor fixed
// to its syndrome bit; every observable a parity tensor with an open mode (parities over many legs
// as chains of 3-leg tensors). `fourier`: each parity check written as the sum over a dual bit y,
// delta(x1 + .. + xk = s mod 2) = 1/2 sum_y (-1)^(y (x1 + .. + xk + s)), summed over the errors
// first: every detector and observable is then a hyperindex y held by the mechanisms that flip it,
// each mechanism one tensor (1 - p) + p (-1)^(sum of its legs) of at most a few legs, each detector
// a vector (-1)^(y s) / 2 and each observable a matrix (-1)^(y l) / 2 with l open. The same value
// with far cheaper paths under circuit-level noise (detectors of tens of mechanisms are chains in
// the first form), as a sum of signed terms.
enum class DecodingForm { checks, fourier };

// The network of a decoding problem in the given form. The result, over the open modes L0, L1, ... (row-major), is P(syndrome, observables): maximum-likelihood
// decoding picks the largest. `about` gains detectors, observables, mechanisms, the syndrome and
// a sampled error's true_observables (L0 first).
Problem decoding_network(const DecodingModel& model, const Syndrome& syndrome, DecodingForm form, std::string description,
                         nlohmann::json about);
// "checks" or "fourier"; InputError naming `what` otherwise.
DecodingForm decoding_form(const std::string& name, const std::string& what);
struct DetectorErrorModelOptions {
  std::string text, file;  // the model, and where it came from (for messages)
  Syndrome syndrome;
  DecodingForm form = DecodingForm::checks;
};
Problem detector_error_model_decoding(const DetectorErrorModelOptions& o);

// Rotated surface code of odd distance d (data qubit (r, c) is r * d + c; Z checks detect the
// bit flips), `rounds` rounds of Z-check measurement, the last one perfect (the data's readout):
// each data qubit flips with probability p each round, each earlier measurement with probability
// q (phenomenological noise; rounds 1 is code capacity). Detectors: a check's change from one
// round to the next. The output mode is the logical class (the flips' parity on Z_L = Z on row
// 0), so the result is [P(syndrome, class 0), P(syndrome, class 1)]: the larger is the maximum-
// likelihood decision. Detectors are numbered check-major within a round, rounds in order; the
// network is decoding_network's for the mechanisms (the data flips round by round, then the
// misreadings), observable L0 the class.
struct SurfaceCodeOptions {
  int distance = 3, rounds = 1;
  double p = 0.05;
  std::optional<double> q;  // default: p
  Syndrome syndrome;
  DecodingForm form = DecodingForm::checks;
};
Problem surface_code_decoding(const SurfaceCodeOptions& o);

}  // namespace qstage::tn
