#include "stages/tn/circuit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "kernels/common.hpp"

namespace qstage::tn {

namespace {

// qsim's names that differ from ours.
std::string qsim_name(const std::string& name) {
  if (name == "cp") return "cp_qsim";  // qsim: diag(1, 1, 1, e^{-i phi}); qelib1's cp is e^{+i phi}
  return name;
}

const std::set<std::string>& qsim_gates() {
  static const std::set<std::string> g = {"id1", "h",  "t",  "x",     "y",   "z",  "x_1_2", "y_1_2", "hz_1_2", "rx",
                                          "ry",  "rz", "rxy", "s",    "id2", "cz", "cx",    "cnot",  "sw",     "is",
                                          "fs",  "cp"};
  return g;
}

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream ss(line);
  std::vector<std::string> words;
  std::string w;
  while (ss >> w) words.push_back(w);
  return words;
}

bool parse_int(const std::string& s, long long& v) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  try {
    v = std::stoll(s);
  } catch (...) {
    return false;
  }
  return true;
}

bool parse_double(const std::string& s, double& v) {
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end && *end == '\0' && !s.empty() && std::isfinite(v);
}

// A tiny deterministic generator (SplitMix64) for the circuit generators.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    state += kernels::kGolden;
    return kernels::splitmix64(state);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

}  // namespace

Circuit parse_qsim(std::string_view text, std::string source) {
  Circuit c;
  c.source = source;
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  std::vector<long long> last_time;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto words = split_words(line);
    if (words.empty() || words[0][0] == '#') continue;
    auto fail = [&](const std::string& what) {
      throw InputError(fmt::format("{}:{}: {} (line: '{}')", source, number, what, line));
    };
    if (c.qubits == 0) {
      long long n = 0;
      if (words.size() != 1 || !parse_int(words[0], n) || n <= 0 || n > 4096)
        fail("expected the number of qubits (a positive integer) on the first line");
      c.qubits = static_cast<int>(n);
      last_time.assign(static_cast<size_t>(n), -1);
      continue;
    }
    if (words.size() < 3) fail("expected 'time gate qubit... [parameter...]'");
    long long time = 0;
    if (!parse_int(words[0], time)) fail(fmt::format("'{}' is not a time (a non-negative integer)", words[0]));
    const std::string name = words[1];
    if (name == "m") continue;  // measurements: amplitudes are computed, not sampled
    if (name == "c") fail("controlled gates ('c ...') are not supported; expected one of the qsim gates");
    if (!qsim_gates().count(name)) {
      std::vector<std::string> names(qsim_gates().begin(), qsim_gates().end());
      fail(fmt::format("unknown gate '{}'; expected one of {}", name, fmt::join(names, ", ")));
    }
    Gate g;
    g.name = qsim_name(name);
    g.time = static_cast<int>(time);
    g.line = number;
    const int arity = gate_arity(g.name), nparams = gate_param_count(g.name);
    if (static_cast<int>(words.size()) != 2 + arity + nparams)
      fail(fmt::format("gate '{}' takes {} qubit(s) and {} parameter(s); got {} value(s)", name, arity, nparams,
                       words.size() - 2));
    for (int i = 0; i < arity; ++i) {
      long long q = 0;
      if (!parse_int(words[2 + i], q)) fail(fmt::format("'{}' is not a qubit index", words[2 + i]));
      if (q >= c.qubits) fail(fmt::format("qubit {} is out of range; the circuit has qubits 0..{}", q, c.qubits - 1));
      if (std::find(g.qubits.begin(), g.qubits.end(), q) != g.qubits.end())
        fail(fmt::format("gate '{}' names qubit {} twice", name, q));
      g.qubits.push_back(static_cast<int>(q));
    }
    for (int i = 0; i < nparams; ++i) {
      double v = 0;
      if (!parse_double(words[2 + arity + i], v)) fail(fmt::format("'{}' is not a number", words[2 + arity + i]));
      g.params.push_back(v);
    }
    for (int q : g.qubits) {
      if (time <= last_time[static_cast<size_t>(q)])
        fail(fmt::format("gate on qubit {} at time {} does not come after its previous gate (time {})", q, time,
                         last_time[static_cast<size_t>(q)]));
      last_time[static_cast<size_t>(q)] = time;
    }
    g.matrix = gate_matrix(g.name, g.params, fmt::format("{}:{}", source, number));
    c.gates.push_back(std::move(g));
  }
  if (c.qubits == 0) throw InputError(fmt::format("{}: no qubit count; expected a qsim circuit", source));
  return c;
}

Circuit read_circuit(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(fmt::format("circuit file '{}' does not exist; expected a qsim or OpenQASM 2.0 file", path));
  const std::string text = fsutil::read_file(path);
  const bool qasm = text.find("OPENQASM") != std::string::npos || std::filesystem::path(path).extension() == ".qasm";
  return qasm ? parse_qasm(text, path) : parse_qsim(text, path);
}

// ------------------------------------------------------------------------------ generators
Circuit random_circuit(const RandomCircuitOptions& o) {
  if (o.rows <= 0 || o.cols <= 0 || o.rows * o.cols < 2)
    throw InputError(fmt::format("random circuit: a {}x{} grid; expected at least 2 qubits", o.rows, o.cols));
  if (o.cycles < 0) throw InputError("random circuit: cycles must be >= 0");
  for (char p : o.pattern)
    if (p < 'A' || p > 'D') throw InputError(fmt::format("random circuit: pattern '{}'; expected letters A-D", o.pattern));
  if (o.pattern.empty()) throw InputError("random circuit: empty pattern; expected e.g. ABCDCDAB");
  if (o.two_qubit != "fs" && o.two_qubit != "cz")
    throw InputError(fmt::format("random circuit: two-qubit gate '{}'; expected fs or cz", o.two_qubit));
  Circuit c;
  c.qubits = o.rows * o.cols;
  c.source = fmt::format("random circuit {}x{}, {} cycles, pattern {}, {}, seed {}", o.rows, o.cols, o.cycles, o.pattern,
                         o.two_qubit, o.seed);
  Rng rng{kernels::splitmix64(o.seed ^ 0x5eedc12c1u)};
  static const char* single[] = {"x_1_2", "y_1_2", "hz_1_2"};
  std::vector<int> previous(static_cast<size_t>(c.qubits), -1);
  int time = 0;
  auto layer = [&] {
    for (int q = 0; q < c.qubits; ++q) {
      int k;
      do k = static_cast<int>(rng.below(3));
      while (k == previous[static_cast<size_t>(q)]);
      previous[static_cast<size_t>(q)] = k;
      c.gates.push_back({single[k], {q}, {}, gate_matrix(single[k], {}, "random circuit"), time, 0});
    }
    ++time;
  };
  const std::vector<double> fs_params = {M_PI / 2, M_PI / 6};
  for (int cycle = 0; cycle < o.cycles; ++cycle) {
    layer();
    const char p = o.pattern[static_cast<size_t>(cycle) % o.pattern.size()];
    // A/B: vertical couplers (r, c)-(r+1, c) with (r + c) even/odd; C/D: horizontal, likewise.
    const bool vertical = p == 'A' || p == 'B';
    const int parity = (p == 'A' || p == 'C') ? 0 : 1;
    for (int r = 0; r < o.rows; ++r)
      for (int col = 0; col < o.cols; ++col) {
        if ((r + col) % 2 != parity) continue;
        const int r2 = vertical ? r + 1 : r, c2 = vertical ? col : col + 1;
        if (r2 >= o.rows || c2 >= o.cols) continue;
        Gate g{o.two_qubit, {r * o.cols + col, r2 * o.cols + c2}, {}, {}, time, 0};
        if (o.two_qubit == "fs") g.params = fs_params;
        g.matrix = gate_matrix(g.name, g.params, "random circuit");
        c.gates.push_back(std::move(g));
      }
    ++time;
  }
  layer();
  return c;
}

std::vector<std::pair<int, int>> random_regular_graph(int nodes, int degree, std::uint64_t seed) {
  if (nodes <= degree || (nodes * degree) % 2 != 0)
    throw InputError(fmt::format("a {}-regular graph on {} nodes does not exist; expected more nodes than the degree "
                                 "and an even number of edge ends",
                                 degree, nodes));
  Rng rng{kernels::splitmix64(seed ^ 0x9a9b5u)};
  for (int attempt = 0; attempt < 10000; ++attempt) {
    // Pairing model: shuffle node stubs, pair them up, retry on loops or multi-edges.
    std::vector<int> stubs;
    for (int v = 0; v < nodes; ++v)
      for (int d = 0; d < degree; ++d) stubs.push_back(v);
    for (size_t i = stubs.size() - 1; i > 0; --i) std::swap(stubs[i], stubs[rng.below(i + 1)]);
    std::set<std::pair<int, int>> edges;
    bool simple = true;
    for (size_t i = 0; i < stubs.size() && simple; i += 2) {
      int a = std::min(stubs[i], stubs[i + 1]), b = std::max(stubs[i], stubs[i + 1]);
      simple = a != b && edges.insert({a, b}).second;
    }
    if (simple) return {edges.begin(), edges.end()};
  }
  throw InputError(fmt::format("could not draw a simple {}-regular graph on {} nodes", degree, nodes));
}

std::vector<std::pair<int, int>> lattice_edges(const LatticeOptions& o) {
  if (o.rows < 1 || o.cols < 1 || o.rows * o.cols < 2)
    throw InputError(fmt::format("lattice: {} x {} sites; expected at least 2", o.rows, o.cols));
  if (o.kind != "rectangular" && o.kind != "triangular" && o.kind != "hexagonal")
    throw InputError(fmt::format("lattice: kind '{}'; expected rectangular, triangular or hexagonal", o.kind));
  auto at = [&](int r, int c) { return r * o.cols + c; };
  std::vector<std::pair<int, int>> edges;
  for (int r = 0; r < o.rows; ++r)
    for (int c = 0; c < o.cols; ++c) {
      if (c + 1 < o.cols) edges.push_back({at(r, c), at(r, c + 1)});
      if (r + 1 < o.rows && (o.kind != "hexagonal" || (r + c) % 2 == 0)) edges.push_back({at(r, c), at(r + 1, c)});
      if (o.kind == "triangular" && r + 1 < o.rows && c + 1 < o.cols) edges.push_back({at(r, c), at(r + 1, c + 1)});
    }
  return edges;
}

Circuit lattice_dynamics(const LatticeOptions& o) {
  if (o.steps < 1) throw InputError(fmt::format("lattice: steps = {}; expected at least 1", o.steps));
  if (o.disorder < 0 || o.disorder > 1) throw InputError(fmt::format("lattice: disorder = {}; expected 0 to 1", o.disorder));
  const std::vector<std::pair<int, int>> edges = lattice_edges(o);
  Rng rng{kernels::splitmix64(o.seed ^ 0x1a77u)};
  std::vector<double> couplings;
  for (std::size_t e = 0; e < edges.size(); ++e) {
    const double u = static_cast<double>(rng.below(std::uint64_t{1} << 53)) / static_cast<double>(std::uint64_t{1} << 53);
    couplings.push_back(o.J * (1 + o.disorder * (2 * u - 1)));
  }
  Circuit c;
  c.qubits = o.rows * o.cols;
  c.source = fmt::format("transverse-field Ising dynamics on a {} {} x {} lattice, {} Trotter steps of dt = {}, J = {} (disorder {}, "
                         "seed {}), h = {}", o.kind, o.rows, o.cols, o.steps, o.dt, o.J, o.disorder, o.seed, o.h);
  c.graph = edges;
  int time = 0;
  for (int s = 0; s < o.steps; ++s) {
    for (std::size_t e = 0; e < edges.size(); ++e) {
      Gate g{"rzz", {edges[e].first, edges[e].second}, {2 * couplings[e] * o.dt}, {}, time++, 0};
      g.matrix = gate_matrix(g.name, g.params, "lattice");
      c.gates.push_back(std::move(g));
    }
    for (int q = 0; q < c.qubits; ++q) {
      Gate g{"rx", {q}, {2 * o.h * o.dt}, {}, time, 0};
      g.matrix = gate_matrix(g.name, g.params, "lattice");
      c.gates.push_back(std::move(g));
    }
    ++time;
  }
  return c;
}

Circuit qaoa_maxcut(const QaoaOptions& o, const std::vector<std::pair<int, int>>& edges) {
  if (o.p < 1) throw InputError("qaoa: p must be at least 1");
  if (static_cast<int>(o.gammas.size()) != o.p || static_cast<int>(o.betas.size()) != o.p)
    throw InputError(fmt::format("qaoa: p = {} needs {} gammas and {} betas; got {} and {}", o.p, o.p, o.p,
                                 o.gammas.size(), o.betas.size()));
  Circuit c;
  c.qubits = o.nodes;
  c.source = fmt::format("QAOA MaxCut, {} nodes, 3-regular, p = {}, seed {}", o.nodes, o.p, o.seed);
  c.graph = edges;
  int time = 0;
  for (int q = 0; q < o.nodes; ++q) c.gates.push_back({"h", {q}, {}, gate_matrix("h", {}, "qaoa"), time, 0});
  ++time;
  for (int l = 0; l < o.p; ++l) {
    for (const auto& [a, b] : edges) {
      Gate g{"rzz", {a, b}, {2 * o.gammas[static_cast<size_t>(l)]}, {}, time++, 0};
      g.matrix = gate_matrix(g.name, g.params, "qaoa");
      c.gates.push_back(std::move(g));
    }
    for (int q = 0; q < o.nodes; ++q) {
      Gate g{"rx", {q}, {2 * o.betas[static_cast<size_t>(l)]}, {}, time, 0};
      g.matrix = gate_matrix(g.name, g.params, "qaoa");
      c.gates.push_back(std::move(g));
    }
    ++time;
  }
  return c;
}

}  // namespace qstage::tn
