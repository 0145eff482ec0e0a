#include "stages/tn/sources.hpp"

#include <fmt/format.h>

#include <fstream>

#include "core/error.hpp"
#include "kernels/common.hpp"
#include "stages/tn/network.hpp"

namespace qstage::tn {

using nlohmann::json;

std::vector<std::string> source_file_parameters() { return {"/circuit", "/bitstrings_file"}; }

SourceParams SourceParams::from_json(const json& p) {
  SourceParams s;
  s.circuit = p.contains("circuit");
  s.circuit_sources = s.circuit + p.contains("random") + p.contains("qaoa") + p.contains("lattice");
  if (p.contains("random")) {
    const json& r = p["random"];
    RandomCircuitOptions o;
    o.rows = r.value("rows", 4);
    o.cols = r.value("cols", 4);
    o.cycles = r.value("cycles", 8);
    o.seed = r.value("seed", std::uint64_t{0});
    o.pattern = r.value("pattern", std::string("ABCDCDAB"));
    o.two_qubit = r.value("gate", std::string("fs"));
    s.random = o;
  }
  if (p.contains("qaoa")) {
    const json& q = p["qaoa"];
    QaoaOptions o;
    o.nodes = q.value("nodes", 8);
    o.p = q.value("p", 1);
    o.gammas = q.value("gammas", std::vector<double>(static_cast<size_t>(o.p), 0.4));
    o.betas = q.value("betas", std::vector<double>(static_cast<size_t>(o.p), 0.3));
    o.seed = q.value("seed", std::uint64_t{0});
    s.qaoa = o;
  }
  if (p.contains("lattice")) {
    const json& l = p["lattice"];
    LatticeOptions o;
    o.kind = l.value("kind", o.kind);
    o.rows = l.value("rows", o.rows);
    o.cols = l.value("cols", o.cols);
    o.steps = l.value("steps", o.steps);
    o.dt = l.value("dt", o.dt);
    o.J = l.value("J", o.J);
    o.h = l.value("h", o.h);
    o.disorder = l.value("disorder", o.disorder);
    o.seed = l.value("seed", o.seed);
    s.lattice = o;
  }
  if (p.contains("bitstrings")) s.bitstrings = p["bitstrings"].get<std::vector<std::string>>();
  s.bitstrings_file = p.contains("bitstrings_file");
  if (p.contains("count")) s.count = p["count"].get<std::uint64_t>();
  if (p.contains("random_bitstrings"))
    s.random_bitstrings = {p["random_bitstrings"].value("count", std::uint64_t{1}),
                           p["random_bitstrings"].value("seed", std::uint64_t{0})};
  s.open = p.value("open", std::vector<int>{});
  if (p.contains("pauli")) s.pauli = p["pauli"].get<std::string>();
  return s;
}

Circuit circuit_from_params(const SourceParams& p, const Files& files) {
  if (p.circuit_sources != 1)
    throw InputError(fmt::format("params: {} circuit sources given; expected exactly one of circuit (a file), random, "
                                 "qaoa or lattice", p.circuit_sources));
  if (p.circuit) return read_circuit(files.at("/circuit").string());
  if (p.random) return random_circuit(*p.random);
  if (p.lattice) return lattice_dynamics(*p.lattice);
  return qaoa_maxcut(*p.qaoa, random_regular_graph(p.qaoa->nodes, 3, p.qaoa->seed));
}

namespace {

std::vector<std::uint8_t> parse_bits(const std::string& s, int qubits, const std::string& what) {
  std::string t = s;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (static_cast<int>(t.size()) != qubits)
    throw InputError(fmt::format("{}: bitstring '{}' has {} characters; expected {} (one per qubit)", what, t, t.size(),
                                 qubits));
  std::vector<std::uint8_t> bits;
  for (char c : t) {
    if (c != '0' && c != '1') throw InputError(fmt::format("{}: bitstring '{}' has '{}'; expected only 0 and 1", what, t, c));
    bits.push_back(c == '1');
  }
  return bits;
}

}  // namespace

std::vector<std::vector<std::uint8_t>> bitstrings_from_params(const SourceParams& p, const Files& files, int qubits) {
  std::vector<std::vector<std::uint8_t>> out;
  const std::uint64_t count = p.count.value_or(0);
  if (p.bitstrings) {
    for (const auto& b : *p.bitstrings) out.push_back(parse_bits(b, qubits, "params.bitstrings"));
  } else if (p.bitstrings_file) {
    const auto path = files.at("/bitstrings_file");
    std::ifstream in(path);
    std::string line;
    int number = 0;
    while (std::getline(in, line) && (count == 0 || out.size() < count)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      out.push_back(parse_bits(line, qubits, fmt::format("{}:{}", path.string(), number)));
    }
  } else if (p.random_bitstrings) {
    const auto [n, seed] = *p.random_bitstrings;
    std::uint64_t state = kernels::splitmix64(seed);
    for (std::uint64_t i = 0; i < n; ++i) {
      std::vector<std::uint8_t> bits;
      for (int q = 0; q < qubits; ++q) {
        state += kernels::kGolden;
        bits.push_back(static_cast<std::uint8_t>(kernels::splitmix64(state) >> 63));
      }
      out.push_back(std::move(bits));
    }
  } else {
    out.push_back(std::vector<std::uint8_t>(static_cast<size_t>(qubits), 0));
  }
  if (out.empty()) throw InputError("params: no bitstrings; expected at least one");
  return out;
}

std::optional<std::vector<std::pair<int, char>>> pauli_from_params(const SourceParams& p, int qubits) {
  if (!p.pauli) return std::nullopt;
  return parse_pauli(*p.pauli, qubits);
}

std::vector<int> open_qubits_from_params(const SourceParams& p, int qubits) {
  const auto& open = p.open;
  for (size_t i = 0; i < open.size(); ++i) {
    if (open[i] < 0 || open[i] >= qubits)
      throw InputError(fmt::format("params.open: qubit {} is out of range; expected 0..{}", open[i], qubits - 1));
    for (size_t j = 0; j < i; ++j)
      if (open[j] == open[i]) throw InputError(fmt::format("params.open: qubit {} is listed twice", open[i]));
  }
  return open;
}

void write_bitstrings(h5::File& out, const std::vector<std::vector<std::uint8_t>>& bits, int qubits) {
  std::vector<std::uint8_t> flat;
  for (const auto& b : bits) flat.insert(flat.end(), b.begin(), b.end());
  h5::Dataset d = out.create_dataset("bitstrings", {{h5::DType::uint8, {bits.size(), static_cast<std::uint64_t>(qubits)}, {}}, false});
  if (!flat.empty()) d.write_all(flat.data());
  d.set_attribute("description", "one row per bitstring; column q is qubit q (0 or 1)");
}

void write_result_layout(h5::File& out, const std::vector<std::vector<std::uint8_t>>& bits, int qubits,
                         const std::vector<int>& open, const std::string& pauli, const std::string& precision) {
  if (pauli.empty()) {
    write_bitstrings(out, bits, qubits);
    out.open_dataset("amplitudes")
        .set_attribute("description", "<x|C|0> for row x of bitstrings; with open qubits, 2^k values per row indexed by "
                                      "their bits, the first open qubit most significant");
  } else {
    out.open_dataset("value").set_attribute("description", "<psi|P|psi> for the Pauli string P in the attribute 'pauli'");
    out.set_attribute("pauli", pauli);
  }
  out.set_attribute("qubits", static_cast<std::int64_t>(qubits));
  out.set_attribute("open_qubits", json(open).dump());
  out.set_attribute("precision", precision);
}

std::vector<std::vector<std::uint8_t>> read_bitstrings(const h5::File& file) {
  std::vector<std::vector<std::uint8_t>> out;
  if (!file.exists("/bitstrings")) return out;
  h5::Dataset d = file.open_dataset("bitstrings");
  const auto shape = d.shape();
  if (shape.size() != 2 || d.dtype() != h5::DType::uint8)
    throw InputError(fmt::format("'{}': dataset 'bitstrings' is {} [{}]; expected uint8 [bitstrings, qubits]",
                                 file.path().string(), d.type_description(), fmt::join(shape, " x ")));
  std::vector<std::uint8_t> flat(shape[0] * shape[1]);
  if (!flat.empty()) d.read_all(flat.data());
  for (std::uint64_t b = 0; b < shape[0]; ++b)
    out.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(b * shape[1]),
                     flat.begin() + static_cast<std::ptrdiff_t>((b + 1) * shape[1]));
  return out;
}

}  // namespace qstage::tn
