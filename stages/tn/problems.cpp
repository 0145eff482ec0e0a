#include "stages/tn/problems.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/signals.hpp"
#include "kernels/tensor/random.hpp"

namespace qstage::tn {
namespace {

using nlohmann::json;

// The j-th number of the seeded stream, uniform on [0, 1).
double uniform01(std::uint64_t key, std::uint64_t j) { return kernels::random_unit(kernels::random_bits(key, j)); }

// Builds a network of extent-2 modes tensor by tensor.
struct Builder {
  Network net;
  Mode next = 0;
  Mode mode() {
    net.extent[next] = 2;
    return next++;
  }
  void add(std::vector<Mode> modes, std::vector<cd> data, std::string tag) {
    net.tensors.push_back({std::move(modes), std::move(data), std::move(tag), -1});
  }
};

// Over k binary modes: `zero` where all are 0, `one` where all are 1, 0 elsewhere (a variable
// shared by k constraints, with its weight).
std::vector<cd> copy_tensor(std::size_t k, cd zero, cd one) {
  std::vector<cd> t(std::size_t{1} << k);
  t.front() = zero;
  t.back() += one;  // (k = 0: one value, zero + one; add_copy never asks for it)
  return t;
}

// Over k binary modes: 1 where their XOR equals `parity`, 0 elsewhere.
std::vector<cd> parity_tensor(std::size_t k, int parity) {
  std::vector<cd> t(std::size_t{1} << k);
  for (std::size_t i = 0; i < t.size(); ++i)
    if (static_cast<int>(std::popcount(i) & 1) == parity) t[i] = 1.0;
  return t;
}

void check_probability(double v, const char* name, bool zero_allowed) {
  if (!std::isfinite(v) || v > 0.5 || v < 0 || (!zero_allowed && v == 0))
    throw InputError(fmt::format("surface_code: {} = {}; expected a probability in {}0, 0.5]", name, v, zero_allowed ? "[" : "("));
}

// A parity constraint over `legs` (their XOR equals `parity`): one tensor up to 4 legs, else a
// chain of 3-leg XORs through new carry modes. No legs: a factor 1, or 0 for parity 1.
void add_parity(Builder& b, const std::vector<Mode>& legs, int parity, const std::string& tag) {
  if (legs.empty()) {
    if (parity == 0) return;
    const Mode m = b.mode();
    b.add({m}, {0.0, 0.0}, tag + " (no error reaches it)");
    b.add({m}, {1.0, 1.0}, tag);
    return;
  }
  if (legs.size() <= 4) return b.add(legs, parity_tensor(legs.size(), parity), tag);
  Mode carry = b.mode();
  b.add({legs[0], legs[1], carry}, parity_tensor(3, 0), tag);
  for (std::size_t k = 2; k + 1 < legs.size(); ++k) {
    const Mode next = b.mode();
    b.add({legs[k], carry, next}, parity_tensor(3, 0), tag);
    carry = next;
  }
  b.add({legs.back(), carry}, parity_tensor(2, parity), tag);
}

// A variable shared by `legs` with weights (zero, one): one copy tensor up to 4 legs, else a
// chain of 3-leg copies (the weights on the first).
void add_copy(Builder& b, const std::vector<Mode>& legs, double zero, double one, const std::string& tag) {
  if (legs.empty()) return;  // (summed over, a variable that reaches nothing is a factor zero + one)
  if (legs.size() <= 4) return b.add(legs, copy_tensor(legs.size(), zero, one), tag);
  Mode carry = b.mode();
  b.add({legs[0], legs[1], carry}, copy_tensor(3, zero, one), tag);
  for (std::size_t k = 2; k + 1 < legs.size(); ++k) {
    const Mode next = b.mode();
    b.add({legs[k], carry, next}, copy_tensor(3, 1.0, 1.0), tag);
    carry = next;
  }
  b.add({legs.back(), carry}, copy_tensor(2, 1.0, 1.0), tag);
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// The most instructions (every repetition of a repeat block counted) and detectors a detector
// error model may have, checked before it is expanded: past a million, its network is beyond
// exact contraction anyway, and the expansion alone would take minutes and gigabytes.
constexpr std::int64_t kMaxDemSize = std::int64_t{1} << 20;
// The shift measure() carries on: beyond it only matters that a later detector is past the limit
// (a message's count of detectors is exact below it).
constexpr std::int64_t kMaxDemShift = std::int64_t{1} << 32;

// A line of a detector error model, split once into its instruction, (arguments) and targets.
struct DemLine {
  int number;        // 1-based, for messages
  std::string text;  // without comment and surrounding blanks
  std::string name;  // error, detector, ..., repeat, or "}"
  std::vector<double> args;
  std::vector<std::string> targets;
};

struct DemReader {
  const std::vector<DemLine>& lines;
  const std::string& what;
  DecodingModel model;
  std::int64_t offset = 0;  // shift_detectors so far

  [[noreturn]] void fail(const DemLine& l, const std::string& why) const {
    throw InputError(fmt::format("{} line {}: {}", what, l.number, why));
  }
  std::int64_t index(const DemLine& l, const std::string& token, std::size_t from) const {
    std::size_t used = 0;
    std::int64_t k = -1;
    try {
      k = std::stoll(token.substr(from), &used);
    } catch (const std::exception&) {
    }
    if (k < 0 || used != token.size() - from || k > (1 << 30)) fail(l, fmt::format("target '{}'; expected D<k>, L<k> or ^ with k >= 0", token));
    return k;
  }
  // Splits a line's text into its name, (arguments) and targets.
  void split(DemLine& l) const {
    l.name = l.text.substr(0, l.text.find_first_of(" (\t{"));
    std::string rest = l.text.substr(l.name.size());
    if (const auto open = rest.find('('); open != std::string::npos && trim(rest.substr(0, open)).empty()) {
      const auto close = rest.find(')', open);
      if (close == std::string::npos) fail(l, "'(' without ')'");
      std::string inner = rest.substr(open + 1, close - open - 1);
      for (std::size_t at = 0; at <= inner.size();) {
        const auto comma = std::min(inner.find(',', at), inner.size());
        const std::string a = trim(inner.substr(at, comma - at));
        if (!a.empty()) {
          try {
            l.args.push_back(std::stod(a));
          } catch (const std::exception&) {
            fail(l, fmt::format("argument '{}'; expected a number", a));
          }
        }
        at = comma + 1;
      }
      rest = rest.substr(close + 1);
    }
    std::istringstream in(rest);
    for (std::string t; in >> t;) l.targets.push_back(t);
  }
  // A repeat line's count; the index of its block's '}' (before `end`).
  std::int64_t repeat_count(const DemLine& l) const {
    if (l.targets.size() != 2 || l.targets[1] != "{") fail(l, "expected 'repeat N {'");
    return index(l, l.targets[0], 0);
  }
  std::size_t block_end(std::size_t i, std::size_t end) const {
    std::size_t close = i + 1;
    for (int depth = 1; close < end; ++close) {
      if (lines[close].text.ends_with("{")) ++depth;
      if (lines[close].text == "}" && --depth == 0) break;
    }
    if (close >= end) fail(lines[i], "repeat block without its '}'");
    return close;
  }

  // The size of lines [begin, end) once their repeat blocks are expanded, counted without
  // expanding them (a `repeat 1000000000` grew the model until the OOM killer ended the run).
  struct Extent {
    std::int64_t instructions = 0;  // run, every repetition counted
    std::int64_t shift = 0;         // shift_detectors in total, at most kMaxDemShift
    std::int64_t detectors = 0;     // 1 + the largest detector index reached, from the shift at `begin`
  };
  Extent measure(std::size_t begin, std::size_t end) const {
    Extent x;
    for (std::size_t i = begin; i < end; ++i) {
      const DemLine& l = lines[i];
      ++x.instructions;
      if (l.name == "repeat") {
        const std::int64_t times = repeat_count(l);
        const std::size_t close = block_end(i, end);
        // (body's counts are at most kMaxDemShift + 2^30 and times at most 2^30: no overflow)
        const Extent body = measure(i + 1, close);
        x.instructions += times * body.instructions;
        if (times > 0 && body.detectors > 0) x.detectors = std::max(x.detectors, x.shift + (times - 1) * body.shift + body.detectors);
        x.shift += times * body.shift;
        i = close;
      } else if (l.name == "shift_detectors" && l.targets.size() == 1) {
        x.shift += index(l, l.targets[0], 0);
      } else if (l.name == "error" || l.name == "detector") {
        for (const std::string& t : l.targets)
          if (t.starts_with("D")) x.detectors = std::max(x.detectors, x.shift + index(l, t, 1) + 1);
      }
      x.shift = std::min(x.shift, kMaxDemShift);
      const bool too_many_instructions = x.instructions > kMaxDemSize;
      if (too_many_instructions || x.detectors > kMaxDemSize)
        fail(l, fmt::format("'{}' takes the model to {} {} (repeat blocks expanded); expected at most {} (2^20)", l.text,
                            too_many_instructions ? x.instructions : x.detectors, too_many_instructions ? "instructions" : "detectors",
                            kMaxDemSize));
    }
    return x;
  }

  // The lines [begin, end) once; a repeat block's body as many times as it says.
  void run(std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const DemLine& l = lines[i];
      const std::string& name = l.name;
      const std::vector<double>& args = l.args;
      const std::vector<std::string>& targets = l.targets;
      if (name == "}") fail(l, "'}' without its repeat block");
      if (name == "repeat") {
        const std::int64_t times = repeat_count(l);
        const std::size_t close = block_end(i, end);
        for (std::int64_t r = 0; r < times; ++r) {
          if (signals::stop_requested()) throw StopRequested("stopped while expanding the detector error model");
          run(i + 1, close);
        }
        i = close;
      } else if (name == "error") {
        if (args.size() != 1 || !(args[0] >= 0 && args[0] <= 1)) fail(l, "expected error(p) with p a probability from 0 to 1");
        std::set<int> detectors, observables;  // (a target twice cancels: the components of ^ are XORed)
        for (const std::string& t : targets) {
          if (t == "^") continue;
          if (t.starts_with("D")) {
            const auto d = static_cast<int>(offset + index(l, t, 1));
            if (!detectors.erase(d)) detectors.insert(d);
            model.detectors = std::max(model.detectors, d + 1);
          } else if (t.starts_with("L")) {
            const auto o = static_cast<int>(index(l, t, 1));
            if (!observables.erase(o)) observables.insert(o);
            model.observables = std::max(model.observables, o + 1);
          } else {
            fail(l, fmt::format("target '{}'; expected D<k>, L<k> or ^", t));
          }
        }
        if (args[0] > 0 && !(detectors.empty() && observables.empty()))
          model.mechanisms.push_back({args[0], {detectors.begin(), detectors.end()}, {observables.begin(), observables.end()}});
      } else if (name == "detector" || name == "logical_observable") {
        for (const std::string& t : targets) {
          if (name == "detector" && t.starts_with("D")) model.detectors = std::max(model.detectors, static_cast<int>(offset + index(l, t, 1)) + 1);
          else if (name == "logical_observable" && t.starts_with("L")) model.observables = std::max(model.observables, static_cast<int>(index(l, t, 1)) + 1);
          else fail(l, fmt::format("target '{}' of {}", t, name));
        }
      } else if (name == "shift_detectors") {
        if (targets.size() != 1) fail(l, "expected shift_detectors N");
        offset += index(l, targets[0], 0);
      } else {
        fail(l, fmt::format("instruction '{}'; expected error, detector, logical_observable, shift_detectors or repeat", name));
      }
    }
  }
};


}  // namespace

Problem king_independent_sets(const IndependentSetOptions& o) {
  if (o.rows < 1 || o.cols < 1 || static_cast<std::int64_t>(o.rows) * o.cols > (1 << 20))
    throw InputError(fmt::format("independent_sets: {} x {} sites; expected 1 to 2^20 sites", o.rows, o.cols));
  if (!(o.fill >= 0 && o.fill <= 1)) throw InputError(fmt::format("independent_sets: fill = {}; expected 0 to 1", o.fill));
  if (!std::isfinite(o.fugacity)) throw InputError(fmt::format("independent_sets: fugacity = {}; expected a finite number", o.fugacity));
  const std::uint64_t key = kernels::splitmix64(o.seed ^ 0x4b696e6773ULL);
  std::vector<int> index(static_cast<std::size_t>(o.rows) * o.cols, -1);  // site -> vertex, -1 where removed
  json sites = json::array();
  int vertices = 0;
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c)
      if (uniform01(key, static_cast<std::uint64_t>(r) * o.cols + c) < o.fill) {
        index[static_cast<std::size_t>(r) * o.cols + c] = vertices++;
        sites.push_back({r, c});
      }
  if (vertices == 0)
    throw InputError(fmt::format("independent_sets: no site of the {} x {} grid kept at fill {} (seed {}); expected a larger "
                                 "fill or grid", o.rows, o.cols, o.fill, o.seed));
  auto at = [&](int r, int c) { return r < 0 || c < 0 || r >= o.rows || c >= o.cols ? -1 : index[static_cast<std::size_t>(r) * o.cols + c]; };
  // The semiring's one, and the weight of a vertex in the set (tropical: exponent 1, count 1).
  const cd one = o.tropical ? cd(0, 1) : cd(1), in = o.tropical ? cd(1, 1) : cd(o.fugacity);
  Builder b;
  std::vector<std::vector<Mode>> legs(static_cast<std::size_t>(vertices));
  json edges = json::array();
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c) {
      const int u = at(r, c);
      if (u < 0) continue;
      // (each edge once: the neighbours right, below left, below and below right)
      for (const auto& [dr, dc] : {std::pair{0, 1}, {1, -1}, {1, 0}, {1, 1}}) {
        const int v = at(r + dr, c + dc);
        if (v < 0) continue;
        const Mode mu = b.mode(), mv = b.mode();
        legs[static_cast<std::size_t>(u)].push_back(mu);
        legs[static_cast<std::size_t>(v)].push_back(mv);
        b.add({mu, mv}, {one, one, one, 0.0}, fmt::format("edge {} {}", u, v));
        edges.push_back({u, v});
      }
    }
  for (int v = 0; v < vertices; ++v) {
    auto& l = legs[static_cast<std::size_t>(v)];
    const std::string tag = fmt::format("vertex {} ({}, {})", v, sites[static_cast<std::size_t>(v)][0].get<int>(),
                                        sites[static_cast<std::size_t>(v)][1].get<int>());
    if (l.empty()) {  // (a mode must join two tensors: the vertex's weights and a sum over it)
      const Mode m = b.mode();
      b.add({m}, {one, in}, tag);
      b.add({m}, {one, one}, fmt::format("sum over vertex {}", v));
      continue;
    }
    b.add(l, copy_tensor(l.size(), one, in), tag);
  }
  b.net.description = o.tropical ? fmt::format("maximum independent sets of a King's subgraph: {} of {} x {} sites (fill {}, "
                                               "seed {}), {} edges, tropical", vertices, o.rows, o.cols, o.fill, o.seed,
                                               edges.size())
                                 : fmt::format("independent sets of a King's subgraph: {} of {} x {} sites (fill {}, seed {}), "
                                               "{} edges, fugacity {}", vertices, o.rows, o.cols, o.fill, o.seed,
                                               edges.size(), o.fugacity);
  if (o.tropical) b.net.semiring = "tropical";
  Problem p{std::move(b.net), json::object()};
  p.about = {{"problem", "independent_sets"}, {"graph", "king"}, {"rows", o.rows}, {"cols", o.cols}, {"fill", o.fill},
             {"seed", o.seed}, {"fugacity", o.fugacity}, {"vertices", vertices}, {"sites", sites}, {"edges", edges},
             {"value", "sum over the independent sets S of fugacity^|S|"}};
  if (o.tropical) {
    p.about.erase("fugacity");
    p.about["semiring"] = "tropical";
    p.about["value"] = "(the largest |S| of an independent set S, the number of such S) as exponent + i count";
  }
  return p;
}

Problem square_spin_glass(const SpinGlassOptions& o) {
  if (o.rows < 1 || o.cols < 1 || static_cast<std::int64_t>(o.rows) * o.cols > (1 << 20))
    throw InputError(fmt::format("spin_glass: {} x {} spins; expected 1 to 2^20 spins", o.rows, o.cols));
  if (o.couplings != "pm1" && o.couplings != "gaussian")
    throw InputError(fmt::format("spin_glass: couplings '{}'; expected pm1 or gaussian", o.couplings));
  if (!std::isfinite(o.beta)) throw InputError(fmt::format("spin_glass: beta = {}; expected a finite number", o.beta));
  const std::uint64_t key = kernels::splitmix64(o.seed ^ 0x5370696e47ULL);
  const int n = o.rows * o.cols;
  Builder b;
  std::vector<std::vector<Mode>> legs(static_cast<std::size_t>(n));
  json edges = json::array(), couplings = json::array();
  std::uint64_t draw = 0;
  auto coupling = [&] {
    if (o.couplings == "pm1") return uniform01(key, draw++) < 0.5 ? 1.0 : -1.0;
    // (Box-Muller from two draws)
    const double u1 = std::max(uniform01(key, draw++), 1e-300), u2 = uniform01(key, draw++);
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  };
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c)
      for (const auto& [dr, dc] : {std::pair{0, 1}, {1, 0}}) {  // (each edge once: right, below)
        if (r + dr >= o.rows || c + dc >= o.cols) continue;
        const int u = r * o.cols + c, v = (r + dr) * o.cols + c + dc;
        const double J = coupling();
        const Mode mu = b.mode(), mv = b.mode();
        legs[static_cast<std::size_t>(u)].push_back(mu);
        legs[static_cast<std::size_t>(v)].push_back(mv);
        std::vector<cd> t(4);
        for (int su = 0; su < 2; ++su)
          for (int sv = 0; sv < 2; ++sv) {
            const double e = J * (1 - 2 * su) * (1 - 2 * sv);  // J s_u s_v
            t[static_cast<std::size_t>(2 * su + sv)] = o.tropical ? cd(-e, 1) : cd(std::exp(-o.beta * e));
          }
        b.add({mu, mv}, std::move(t), fmt::format("edge {} {}", u, v));
        edges.push_back({u, v});
        couplings.push_back(J);
      }
  const cd one = o.tropical ? cd(0, 1) : cd(1);
  for (int v = 0; v < n; ++v) {
    auto& l = legs[static_cast<std::size_t>(v)];
    const std::string tag = fmt::format("spin {} ({}, {})", v, v / o.cols, v % o.cols);
    if (l.empty()) {  // (a lone spin: both states, no energy)
      const Mode m = b.mode();
      b.add({m}, {one, one}, tag);
      b.add({m}, {one, one}, fmt::format("sum over spin {}", v));
      continue;
    }
    b.add(l, copy_tensor(l.size(), one, one), tag);
  }
  b.net.description = fmt::format("Ising spin glass on a {} x {} square lattice, {} couplings (seed {}), {}", o.rows,
                                  o.cols, o.couplings, o.seed,
                                  o.tropical ? std::string("tropical") : fmt::format("beta {}", o.beta));
  if (o.tropical) b.net.semiring = "tropical";
  Problem p{std::move(b.net), json::object()};
  p.about = {{"problem", "spin_glass"}, {"lattice", "square"}, {"rows", o.rows}, {"cols", o.cols},
             {"couplings", o.couplings}, {"seed", o.seed}, {"edges", edges}, {"J", couplings},
             {"energy", "E(s) = sum over edges (u, v) of J_uv s_u s_v, s = 1 - 2 bit"}};
  if (o.tropical) {
    p.about["semiring"] = "tropical";
    p.about["value"] = "(-E_0, the number of ground states) as exponent + i count";
  } else {
    p.about["beta"] = o.beta;
    p.about["value"] = "Z = sum over s of exp(-beta E(s))";
  }
  return p;
}

DecodingModel read_detector_error_model(const std::string& text, const std::string& what) {
  std::vector<DemLine> lines;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    std::string t = trim(line.substr(0, line.find('#')));
    if (!t.empty()) lines.push_back({number, std::move(t), {}, {}, {}});
  }
  DemReader reader{lines, what, {}, 0};
  for (DemLine& l : lines) reader.split(l);
  reader.measure(0, lines.size());
  reader.run(0, lines.size());
  if (reader.model.detectors == 0) throw InputError(fmt::format("{}: no detector; expected a detector error model", what));
  if (reader.model.observables == 0)
    throw InputError(fmt::format("{}: no logical observable; expected an error or logical_observable naming L0", what));
  return std::move(reader.model);
}

namespace {

Builder checks_network(const DecodingModel& model, const std::string& bits) {
  const int D = model.detectors, K = model.observables;
  Builder b;
  std::vector<std::vector<Mode>> detector_legs(static_cast<std::size_t>(D)), observable_legs(static_cast<std::size_t>(K));
  for (std::size_t i = 0; i < model.mechanisms.size(); ++i) {
    const ErrorMechanism& m = model.mechanisms[i];
    std::vector<Mode> legs;
    for (int d : m.detectors) detector_legs[static_cast<std::size_t>(d)].push_back(legs.emplace_back(b.mode()));
    for (int o : m.observables) observable_legs[static_cast<std::size_t>(o)].push_back(legs.emplace_back(b.mode()));
    add_copy(b, legs, 1 - m.p, m.p, fmt::format("error {}", i));
  }
  for (int d = 0; d < D; ++d) add_parity(b, detector_legs[static_cast<std::size_t>(d)], bits[static_cast<std::size_t>(d)] - '0', fmt::format("D{}", d));
  for (int o = 0; o < K; ++o) {
    auto& legs = observable_legs[static_cast<std::size_t>(o)];
    b.net.output.push_back(legs.emplace_back(b.mode()));
    add_parity(b, legs, 0, fmt::format("L{}", o));
  }
  return b;
}

Builder fourier_network(const DecodingModel& model, const std::string& bits) {
  const int D = model.detectors, K = model.observables;
  Builder b;
  std::vector<Mode> dual_of_detector(static_cast<std::size_t>(D), -1), dual_of_observable(static_cast<std::size_t>(K), -1);
  for (std::size_t i = 0; i < model.mechanisms.size(); ++i) {
    const ErrorMechanism& m = model.mechanisms[i];
    std::vector<Mode> legs;
    auto dual = [&](Mode& y) {
      if (y < 0) y = b.mode();
      legs.push_back(y);
    };
    for (int d : m.detectors) dual(dual_of_detector[static_cast<std::size_t>(d)]);
    for (int o : m.observables) dual(dual_of_observable[static_cast<std::size_t>(o)]);
    if (legs.empty()) continue;  // flips nothing: a factor (1 - p) + p = 1
    std::vector<cd> t(std::size_t{1} << legs.size());
    for (std::size_t y = 0; y < t.size(); ++y) t[y] = std::popcount(y) % 2 ? 1 - 2 * m.p : 1.0;
    b.add(legs, std::move(t), fmt::format("error {}", i));
  }
  for (int d = 0; d < D; ++d) {
    const int s = bits[static_cast<std::size_t>(d)] - '0';
    const Mode y = dual_of_detector[static_cast<std::size_t>(d)];
    if (y >= 0) b.add({y}, {0.5, s ? -0.5 : 0.5}, fmt::format("D{}", d));
    else if (s) b.add({}, {0.0}, fmt::format("D{} (no error reaches it)", d));  // a flip nothing explains
  }
  for (int o = 0; o < K; ++o) {
    const Mode y = dual_of_observable[static_cast<std::size_t>(o)];
    const Mode l = b.mode();
    b.net.output.push_back(l);
    if (y >= 0) b.add({y, l}, {0.5, 0.5, 0.5, -0.5}, fmt::format("L{}", o));
    else b.add({l}, {1.0, 0.0}, fmt::format("L{} (no error reaches it)", o));
  }
  return b;
}

}  // namespace

DecodingForm decoding_form(const std::string& name, const std::string& what) {
  if (name == "checks") return DecodingForm::checks;
  if (name == "fourier") return DecodingForm::fourier;
  throw InputError(fmt::format("{}: form '{}'; expected checks or fourier", what, name));
}

Problem decoding_network(const DecodingModel& model, const Syndrome& syndrome, DecodingForm form, std::string description,
                         nlohmann::json about) {
  const int D = model.detectors, K = model.observables;
  std::string bits;
  std::optional<std::string> true_observables;
  if (syndrome.given) {
    bits = *syndrome.given;
    const bool binary = bits.find_first_not_of("01") == std::string::npos;
    if (static_cast<int>(bits.size()) != D || !binary)
      throw InputError(fmt::format("{}: syndrome has {} characters{}; expected {} characters 0 or 1 (one a detector)",
                                   about.value("problem", "decoding"), bits.size(), binary ? "" : " other than 0 and 1", D));
  } else {
    const std::uint64_t key = kernels::splitmix64(syndrome.seed ^ 0x5c0deULL);
    std::vector<int> flipped(static_cast<std::size_t>(D), 0), observed(static_cast<std::size_t>(K), 0);
    std::uint64_t j = 0;
    for (const ErrorMechanism& m : model.mechanisms)
      if (uniform01(key, j++) < m.p) {
        for (int d : m.detectors) flipped[static_cast<std::size_t>(d)] ^= 1;
        for (int o : m.observables) observed[static_cast<std::size_t>(o)] ^= 1;
      }
    for (int f : flipped) bits.push_back(static_cast<char>('0' + f));
    true_observables.emplace();
    for (int f : observed) true_observables->push_back(static_cast<char>('0' + f));
  }
  Builder b = form == DecodingForm::fourier ? fourier_network(model, bits) : checks_network(model, bits);
  b.net.description = std::move(description);
  about["detectors"] = D, about["observables"] = K, about["mechanisms"] = model.mechanisms.size();
  about["syndrome"] = bits, about["sampled"] = !syndrome.given.has_value();
  if (true_observables) about["seed"] = syndrome.seed, about["true_observables"] = *true_observables;
  about["value"] = "P(syndrome, observables): one value per assignment of L0, L1, ... (row-major, L0 slowest)";
  if (form == DecodingForm::fourier) about["form"] = "fourier";
  return Problem{std::move(b.net), std::move(about)};
}

Problem detector_error_model_decoding(const DetectorErrorModelOptions& o) {
  const DecodingModel model = read_detector_error_model(o.text, fmt::format("detector_error_model: '{}'", o.file));
  return decoding_network(model, o.syndrome, o.form,
                          fmt::format("maximum-likelihood decoding from the detector error model '{}': {} detectors, {} "
                                      "observables, {} error mechanisms", o.file, model.detectors, model.observables,
                                      model.mechanisms.size()),
                          {{"problem", "detector_error_model"}, {"file", o.file}});
}

Problem surface_code_decoding(const SurfaceCodeOptions& o) {
  const int d = o.distance, T = o.rounds;
  if (d < 3 || d > 51 || d % 2 == 0) throw InputError(fmt::format("surface_code: distance = {}; expected an odd number from 3 to 51", d));
  if (T < 1 || T > 1000) throw InputError(fmt::format("surface_code: rounds = {}; expected 1 to 1000", T));
  const double q = o.q.value_or(o.p);
  check_probability(o.p, "p", false);
  check_probability(q, "q", true);
  // The Z checks: corners (i, j) of the data grid, 0 <= i, j <= d, Z where i + j is odd; weight 4
  // inside, weight 2 on the left and right edges (the X checks take the top and bottom ones).
  std::vector<std::vector<int>> checks;
  for (int i = 0; i <= d; ++i)
    for (int j = 0; j <= d; ++j) {
      if ((i + j) % 2 == 0 || i == 0 || i == d) continue;
      std::vector<int> qubits;
      for (const auto& [r, c] : {std::pair{i - 1, j - 1}, {i - 1, j}, {i, j - 1}, {i, j}})
        if (r >= 0 && c >= 0 && r < d && c < d) qubits.push_back(r * d + c);
      checks.push_back(std::move(qubits));
    }
  const auto S = static_cast<int>(checks.size());  // (d^2 - 1) / 2
  std::vector<std::vector<int>> checks_of(static_cast<std::size_t>(d) * d);
  for (int s = 0; s < S; ++s)
    for (int qb : checks[static_cast<std::size_t>(s)]) checks_of[static_cast<std::size_t>(qb)].push_back(s);
  // The mechanisms: each data qubit's flip in each round (its checks' detectors of that round;
  // L0 on row 0), then each check's misreading in every round but the last (this round's
  // detector and the next's).
  DecodingModel model{S * T, 1, {}};
  for (int t = 0; t < T; ++t)
    for (int qb = 0; qb < d * d; ++qb) {
      ErrorMechanism m{o.p, {}, {}};
      for (int s : checks_of[static_cast<std::size_t>(qb)]) m.detectors.push_back(t * S + s);
      if (qb < d) m.observables.push_back(0);
      model.mechanisms.push_back(std::move(m));
    }
  for (int t = 0; t + 1 < T; ++t)
    for (int s = 0; s < S; ++s) model.mechanisms.push_back({q, {t * S + s, (t + 1) * S + s}, {}});
  std::vector<int> row_zero(static_cast<std::size_t>(d));
  for (int c = 0; c < d; ++c) row_zero[static_cast<std::size_t>(c)] = c;
  return decoding_network(model, o.syndrome, o.form,
                          fmt::format("maximum-likelihood decoding of the distance-{} rotated surface code, {} round{} (p = {}, "
                                      "q = {}): [P(syndrome, class 0), P(syndrome, class 1)]", d, T, T == 1 ? "" : "s", o.p, q),
                          {{"problem", "surface_code"}, {"distance", d}, {"rounds", T}, {"p", o.p}, {"q", q}, {"checks", checks},
                           {"logical", row_zero}});
}

}  // namespace qstage::tn
