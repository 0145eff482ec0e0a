#include "stages/tn/network.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "kernels/tensor/random.hpp"
#include "stages/common/kept.hpp"

namespace qstage::tn {

using nlohmann::json;

std::int64_t Network::size_of(const std::vector<Mode>& modes) const {
  std::int64_t s = 1;
  for (Mode m : modes) s *= extent.at(m);
  return s;
}

void Network::validate(const std::string& what) const {
  std::map<Mode, int> uses;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto& T = tensors[t];
    std::set<Mode> seen;
    for (Mode m : T.modes) {
      if (!extent.count(m)) throw InputError(fmt::format("{}: tensor {} has mode {} with no extent", what, t, m));
      if (!seen.insert(m).second)
        throw InputError(fmt::format("{}: tensor {} lists mode {} twice; expected traces to be taken first", what, t, m));
      uses[m]++;
    }
    if (static_cast<std::int64_t>(T.data.size()) != size_of(T.modes))
      throw InputError(fmt::format("{}: tensor {} has {} values; its modes need {}", what, t, T.data.size(),
                                   size_of(T.modes)));
  }
  std::set<Mode> out(output.begin(), output.end());
  if (out.size() != output.size()) throw InputError(fmt::format("{}: the output lists a mode twice", what));
  for (Mode m : output)
    if (!uses.count(m)) throw InputError(fmt::format("{}: output mode {} appears in no tensor", what, m));
  for (auto [m, n] : uses) {
    if (n == 1 && !out.count(m))
      throw InputError(fmt::format("{}: mode {} appears in one tensor and not in the output; expected it in two tensors "
                                   "or in the output", what, m));
  }
}

json Network::to_json() const {
  json inputs = json::array();
  for (const auto& t : tensors) inputs.push_back(t.modes);
  json size = json::object();
  for (auto [m, e] : extent) size[std::to_string(m)] = e;
  return {{"inputs", inputs}, {"output", output}, {"size_dict", size}};
}

// ------------------------------------------------------------------------------ circuits
namespace {

struct Wiring {
  Network& n;
  std::vector<Mode> wire;
  Mode next = 0;
  Mode fresh() {
    n.extent[next] = 2;
    return next++;
  }
  void ket_zero(int q) {
    wire[static_cast<size_t>(q)] = fresh();
    n.tensors.push_back({{wire[static_cast<size_t>(q)]}, {1.0, 0.0}, fmt::format("|0> q{}", q)});
  }
  // U on the qubits: modes [out..., in...], data = U (row-major out x in, first qubit most significant).
  void apply(const std::vector<int>& qubits, const std::vector<cd>& u, const std::string& tag) {
    NetTensor t;
    t.tag = tag;
    std::vector<Mode> in;
    for (int q : qubits) in.push_back(wire[static_cast<size_t>(q)]);
    for (int q : qubits) t.modes.push_back(wire[static_cast<size_t>(q)] = fresh());
    t.modes.insert(t.modes.end(), in.begin(), in.end());
    t.data = u;
    n.tensors.push_back(std::move(t));
  }
};

std::vector<cd> dagger(const std::vector<cd>& u) {
  const size_t d = static_cast<size_t>(std::lround(std::sqrt(static_cast<double>(u.size()))));
  std::vector<cd> out(u.size());
  for (size_t r = 0; r < d; ++r)
    for (size_t c = 0; c < d; ++c) out[r * d + c] = std::conj(u[c * d + r]);
  return out;
}

std::string gate_tag(const Gate& g) {
  return fmt::format("{} q{} t{}", g.name, fmt::join(g.qubits, ",q"), g.time);
}

}  // namespace

Network amplitude_network(const Circuit& c, const std::vector<int>& open_qubits) {
  Network n;
  n.kind = "amplitude";
  n.qubits = c.qubits;
  n.open_qubits = open_qubits;
  n.description = fmt::format("amplitudes <x|C|0> of {}", c.source);
  std::set<int> open(open_qubits.begin(), open_qubits.end());
  for (int q : open_qubits)
    if (q < 0 || q >= c.qubits)
      throw InputError(fmt::format("open qubit {} is out of range; the circuit has qubits 0..{}", q, c.qubits - 1));
  if (open.size() != open_qubits.size()) throw InputError("open qubits: a qubit is listed twice");
  Wiring w{n, std::vector<Mode>(static_cast<size_t>(c.qubits), -1)};
  for (int q = 0; q < c.qubits; ++q) w.ket_zero(q);
  for (const auto& g : c.gates) w.apply(g.qubits, g.matrix, gate_tag(g));
  for (int q = 0; q < c.qubits; ++q) {
    if (open.count(q)) continue;
    NetTensor p{{w.wire[static_cast<size_t>(q)]}, {1.0, 0.0}, fmt::format("<x| q{}", q), q};
    n.tensors.push_back(std::move(p));
  }
  for (int q : open_qubits) n.output.push_back(w.wire[static_cast<size_t>(q)]);
  return n;
}

std::vector<std::pair<int, char>> parse_pauli(const std::string& text, int qubits) {
  std::vector<std::pair<int, char>> out;
  std::set<int> seen;
  size_t i = 0;
  auto fail = [&](const std::string& why) {
    throw InputError(fmt::format("Pauli string '{}': {}; expected letters X, Y, Z each followed by a qubit, e.g. 'Z0 Z3'",
                                 text, why));
  };
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '*' || c == ',') {
      ++i;
      continue;
    }
    if (c != 'X' && c != 'Y' && c != 'Z') fail(fmt::format("unexpected '{}'", c));
    ++i;
    if (i < text.size() && text[i] == '_') ++i;
    size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    if (j == i) fail(fmt::format("'{}' has no qubit", c));
    const int q = std::stoi(text.substr(i, j - i));
    if (q >= qubits) fail(fmt::format("qubit {} is out of range 0..{}", q, qubits - 1));
    if (!seen.insert(q).second) fail(fmt::format("qubit {} appears twice", q));
    out.push_back({q, c});
    i = j;
  }
  if (out.empty()) fail("it is empty");
  return out;
}

Network expectation_network(const Circuit& c, const std::vector<std::pair<int, char>>& pauli) {
  // The backward light cone of P's support.
  std::set<int> cone;
  for (auto [q, p] : pauli) cone.insert(q);
  std::vector<const Gate*> kept;
  for (auto it = c.gates.rbegin(); it != c.gates.rend(); ++it) {
    bool touches = false;
    for (int q : it->qubits) touches |= cone.count(q) > 0;
    if (!touches) continue;
    for (int q : it->qubits) cone.insert(q);
    kept.push_back(&*it);
  }
  std::reverse(kept.begin(), kept.end());
  Network n;
  n.kind = "expectation";
  n.qubits = c.qubits;
  std::vector<std::string> terms;
  for (auto [q, p] : pauli) terms.push_back(fmt::format("{}{}", p, q));
  n.pauli = fmt::format("{}", fmt::join(terms, " "));
  n.description = fmt::format("<0|C^+ {} C|0> of {}, light cone: {} of {} gates on {} qubits", fmt::join(terms, " "),
                              c.source, kept.size(), c.gates.size(), cone.size());
  Wiring w{n, std::vector<Mode>(static_cast<size_t>(c.qubits), -1)};
  for (int q : cone) w.ket_zero(q);
  for (const Gate* g : kept) w.apply(g->qubits, g->matrix, gate_tag(*g));
  for (auto [q, p] : pauli) {
    static const std::map<char, std::vector<cd>> paulis = {
        {'X', {0, 1, 1, 0}}, {'Y', {0, cd(0, -1), cd(0, 1), 0}}, {'Z', {1, 0, 0, -1}}};
    w.apply({q}, paulis.at(p), fmt::format("{} q{}", p, q));
  }
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) w.apply((*it)->qubits, dagger((*it)->matrix), gate_tag(**it) + " dagger");
  for (int q : cone) n.tensors.push_back({{w.wire[static_cast<size_t>(q)]}, {1.0, 0.0}, fmt::format("<0| q{}", q)});
  return n;
}

void set_bitstring(Network& n, const std::vector<std::uint8_t>& bits) {
  for (auto& t : n.tensors)
    if (t.projects_qubit >= 0) {
      const bool one = bits.at(static_cast<size_t>(t.projects_qubit)) != 0;
      t.data = {one ? 0.0 : 1.0, one ? 1.0 : 0.0};
    }
}

// ------------------------------------------------------------------------------ generic networks
namespace {

std::vector<std::string> labels_of(const json& j, const std::string& what) {
  std::vector<std::string> out;
  if (j.is_string()) {
    for (char c : j.get<std::string>()) out.push_back(std::string(1, c));
  } else if (j.is_array()) {
    for (const auto& l : j) out.push_back(l.is_string() ? l.get<std::string>() : l.dump());
  } else {
    throw InputError(fmt::format("{}: expected a list of labels or a string of one-letter labels", what));
  }
  return out;
}

}  // namespace

Network network_from_json(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("inputs") || !j.contains("size_dict"))
    throw InputError(fmt::format("{}: expected a JSON object with 'inputs', 'output' and 'size_dict'", what));
  Network n;
  n.description = what;
  std::map<std::string, Mode> ids;
  auto id = [&](const std::string& label) {
    auto it = ids.find(label);
    if (it != ids.end()) return it->second;
    const Mode m = static_cast<Mode>(ids.size());
    ids[label] = m;
    return m;
  };
  for (size_t t = 0; t < j["inputs"].size(); ++t) {
    NetTensor tensor;
    for (const auto& l : labels_of(j["inputs"][t], fmt::format("{}: inputs[{}]", what, t))) tensor.modes.push_back(id(l));
    n.tensors.push_back(std::move(tensor));
  }
  for (const auto& l : labels_of(j.value("output", json::array()), what + ": output")) {
    if (!ids.count(l)) throw InputError(fmt::format("{}: output label '{}' appears in no input", what, l));
    n.output.push_back(ids[l]);
  }
  for (const auto& [label, m] : ids) {
    auto key = label;
    if (!j["size_dict"].contains(key))
      throw InputError(fmt::format("{}: size_dict has no extent for label '{}'", what, label));
    const auto e = j["size_dict"][key];
    if (!e.is_number_integer() || e.get<std::int64_t>() < 1)
      throw InputError(fmt::format("{}: size_dict['{}'] is {}; expected a positive integer", what, label, e.dump()));
    n.extent[m] = e.get<std::int64_t>();
  }
  for (auto& t : n.tensors) t.data.assign(static_cast<size_t>(n.size_of(t.modes)), 0.0);
  for (const auto& [label, m] : ids) n.labels[m] = label;
  return n;
}

Network network_from_einsum(const std::string& expression, const std::map<std::string, std::int64_t>& extents,
                            const std::string& what) {
  const auto arrow = expression.find("->");
  if (arrow == std::string::npos)
    throw InputError(fmt::format("{}: einsum '{}' has no '->'; expected e.g. 'ab,bc->ac'", what, expression));
  json j;
  j["inputs"] = json::array();
  std::string lhs = expression.substr(0, arrow);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    std::string term = lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    term.erase(std::remove(term.begin(), term.end(), ' '), term.end());
    j["inputs"].push_back(term);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::string out = expression.substr(arrow + 2);
  out.erase(std::remove(out.begin(), out.end(), ' '), out.end());
  j["output"] = out;
  j["size_dict"] = extents;
  return network_from_json(j, what);
}

void fill_random(Network& n, std::uint64_t seed) {
  const std::uint64_t key = kernels::splitmix64(seed);
  std::uint64_t base = 0;
  for (auto& t : n.tensors) {
    for (size_t e = 0; e < t.data.size(); ++e) {
      const double re = kernels::random_double(kernels::random_bits(key, 2 * (base + e)));
      const double im = kernels::random_double(kernels::random_bits(key, 2 * (base + e) + 1));
      t.data[e] = cd(re, im);
    }
    base += t.data.size();
  }
}

// ------------------------------------------------------------------------------ storage
namespace {

json network_meta(const Network& n) {
  json meta = n.to_json();
  meta["kind"] = n.kind;
  meta["qubits"] = n.qubits;
  meta["open_qubits"] = n.open_qubits;
  meta["description"] = n.description;
  meta["pauli"] = n.pauli;
  if (n.semiring != "standard") meta["semiring"] = n.semiring;  // (standard networks' files unchanged)
  json projections = json::array(), tags = json::array();
  for (size_t t = 0; t < n.tensors.size(); ++t) {
    if (n.tensors[t].projects_qubit >= 0) projections.push_back({t, n.tensors[t].projects_qubit});
    tags.push_back(n.tensors[t].tag);
  }
  meta["projections"] = projections;
  meta["tags"] = tags;
  json labels = json::object();
  for (const auto& [m, l] : n.labels) labels[std::to_string(m)] = l;
  meta["labels"] = labels;
  return meta;
}

// Everything but the tensor data.
Network network_from_meta(const json& meta) {
  Network n;
  n.kind = meta.value("kind", "generic");
  n.qubits = meta.value("qubits", 0);
  n.open_qubits = meta.value("open_qubits", std::vector<int>{});
  n.description = meta.value("description", "");
  n.pauli = meta.value("pauli", "");
  n.semiring = meta.value("semiring", "standard");
  n.output = meta.at("output").get<std::vector<Mode>>();
  for (auto it = meta.at("size_dict").begin(); it != meta.at("size_dict").end(); ++it)
    n.extent[std::stoll(it.key())] = it.value().get<std::int64_t>();
  const json& inputs = meta.at("inputs");
  const json tags = meta.value("tags", json::array());
  for (size_t t = 0; t < inputs.size(); ++t) {
    NetTensor T;
    T.modes = inputs[t].get<std::vector<Mode>>();
    if (t < tags.size()) T.tag = tags[t].get<std::string>();
    T.data.resize(static_cast<size_t>(n.size_of(T.modes)));
    n.tensors.push_back(std::move(T));
  }
  for (const auto& p : meta.value("projections", json::array()))
    n.tensors.at(p[0].get<size_t>()).projects_qubit = p[1].get<int>();
  const json labels = meta.value("labels", json::object());
  for (auto it = labels.begin(); it != labels.end(); ++it) n.labels[std::stoll(it.key())] = it.value().get<std::string>();
  return n;
}

std::string tensor_name(size_t t) { return fmt::format("/tensors/t{:06}", t); }

}  // namespace

void save_network(const Network& n, h5::File& file) {
  const json meta = network_meta(n);
  write_json_dataset(file, "network", meta);
  for (size_t t = 0; t < n.tensors.size(); ++t) {
    const auto& T = n.tensors[t];
    h5::Shape shape;
    for (Mode m : T.modes) shape.push_back(static_cast<std::uint64_t>(n.extent.at(m)));
    if (shape.empty()) shape = {1};
    h5::Shape chunk = shape;
    std::uint64_t bytes = 16;
    for (auto d : shape) bytes *= d;
    while (bytes > (4u << 20) && chunk[0] > 1) {  // large tensors: chunks of about 4 MiB along axis 0
      chunk[0] = (chunk[0] + 1) / 2;
      bytes /= 2;
    }
    h5::Dataset d = file.create_dataset(tensor_name(t), {{h5::DType::complex128, shape, chunk}, false});
    d.write_all(T.data.data());
    d.set_attribute("modes", json(T.modes).dump());
    d.set_attribute("tag", T.tag);
  }
}

namespace {

constexpr std::uint64_t kKeptNetworkBytes = 256u << 20;  // larger networks are read each time
stages::Kept<Network> kept_network;                      // (stages/common/kept.hpp)

std::uint64_t data_bytes(const Network& n) {
  std::uint64_t bytes = 0;
  for (const auto& t : n.tensors) bytes += t.data.size() * sizeof(cd);
  return bytes;
}

}  // namespace

void keep_network(const std::string& step_key, const Network& n) {
  if (data_bytes(n) <= kKeptNetworkBytes) kept_network.keep(step_key, std::make_shared<const Network>(n));
}

Network load_network(const h5::File& file) {
  if (const auto kept = kept_network.find(file)) return *kept;
  if (!file.exists("/network"))
    throw InputError(fmt::format("'{}' holds no tensor network (no /network dataset); expected a tn.build output",
                                 file.path().string()));
  Network n = network_from_meta(read_json_dataset(file, "network"));
  for (size_t t = 0; t < n.tensors.size(); ++t) file.open_dataset(tensor_name(t)).read_all(n.tensors[t].data.data());
  keep_network(stages::step_key_of(file), n);
  return n;
}

std::string serialize_network(const Network& n) {
  const std::string meta = network_meta(n).dump();
  std::string out(8, '\0');
  const std::uint64_t len = meta.size();
  std::memcpy(out.data(), &len, 8);
  out += meta;
  for (const auto& t : n.tensors) out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(cd));
  return out;
}

Network deserialize_network(const std::string& bytes) {
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  Network n = network_from_meta(json::parse(bytes.substr(8, len)));
  size_t at = 8 + len;
  for (auto& t : n.tensors) {
    std::memcpy(t.data.data(), bytes.data() + at, t.data.size() * sizeof(cd));
    at += t.data.size() * sizeof(cd);
  }
  return n;
}

h5::Dataset write_json_dataset(h5::File& file, const std::string& name, const json& j) {
  const std::string text = j.dump();
  h5::Dataset d = file.create_dataset(name, {{h5::DType::uint8, {text.size()}, {}}, false});
  d.write_all(text.data());
  d.set_attribute("format", "JSON text as bytes: json.loads(bytes(f[name][()]))");
  return d;
}

json read_json_dataset(const h5::File& file, const std::string& name) {
  h5::Dataset d = file.open_dataset(name);
  std::string text(d.shape().at(0), '\0');
  d.read_all(text.data());
  return json::parse(text);
}

}  // namespace qstage::tn
