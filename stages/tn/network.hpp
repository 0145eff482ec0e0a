#pragma once
// Tensor networks: tensors with integer mode labels, open (output) modes, and mode extents -
// the {inputs, output, size_dict} layout cotengra's benchmark files use, plus tensor data.
//
// Amplitude networks for circuits end in one projection tensor per qubit; those tensors are
// marked with the qubit they project, so one contraction plan serves a whole batch of
// bitstrings: the executor swaps the projection data per bitstring.
#include <complex>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/h5.hpp"
#include "stages/tn/circuit.hpp"

namespace qstage::tn {

using Mode = std::int64_t;

struct NetTensor {
  std::vector<Mode> modes;
  std::vector<cd> data;    // row-major over modes
  std::string tag;         // what it is, e.g. "fs q3,q4 t7", "<x| q3"
  int projects_qubit = -1; // >= 0: an output projection <x_q|, whose data follows the bitstring
};

// A value per mode: a map by label (iterated in label order), with a table of pointers into it
// for labels below kTabled, so that the planners' lookups (several per mode of every step) do not
// walk the tree. The map's nodes never move, so the pointers stay valid as it grows.
template <typename V>
class ModeMap {
 public:
  using Map = std::map<Mode, V>;
  ModeMap() = default;
  ModeMap(std::initializer_list<typename Map::value_type> init) : map_(init) { reindex(); }
  ModeMap(const ModeMap& o) : map_(o.map_) { reindex(); }
  ModeMap(ModeMap&&) noexcept = default;
  ModeMap& operator=(const ModeMap& o) {
    if (this != &o) {
      map_ = o.map_;
      reindex();
    }
    return *this;
  }
  ModeMap& operator=(ModeMap&&) noexcept = default;

  V at(Mode m) const {  // std::out_of_range for a mode it lacks, as std::map's
    if (m >= 0 && static_cast<std::uint64_t>(m) < table_.size() && table_[static_cast<size_t>(m)])
      return *table_[static_cast<size_t>(m)];
    return map_.at(m);
  }
  V& operator[](Mode m) {
    auto [it, inserted] = map_.try_emplace(m, V{});
    if (inserted) index(it);
    return it->second;
  }
  size_t count(Mode m) const { return map_.count(m); }
  size_t erase(Mode m) {
    if (m >= 0 && static_cast<std::uint64_t>(m) < table_.size()) table_[static_cast<size_t>(m)] = nullptr;
    return map_.erase(m);
  }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  typename Map::const_iterator begin() const { return map_.begin(); }
  typename Map::const_iterator end() const { return map_.end(); }
  typename Map::iterator begin() { return map_.begin(); }
  typename Map::iterator end() { return map_.end(); }
  typename Map::const_reverse_iterator rbegin() const { return map_.rbegin(); }
  typename Map::const_reverse_iterator rend() const { return map_.rend(); }
  bool operator==(const ModeMap& o) const { return map_ == o.map_; }

 private:
  static constexpr Mode kTabled = Mode{1} << 22;
  void index(typename Map::iterator it) {
    if (it->first < 0 || it->first >= kTabled) return;
    const auto m = static_cast<size_t>(it->first);
    if (table_.size() <= m) table_.resize(m + 1, nullptr);
    table_[m] = &it->second;
  }
  void reindex() {
    table_.clear();
    for (auto it = map_.begin(); it != map_.end(); ++it) index(it);
  }
  Map map_;
  std::vector<V*> table_;  // by label below kTabled: its value in map_, or null
};

// Every mode's extent.
using ModeExtents = ModeMap<std::int64_t>;

struct Network {
  std::vector<NetTensor> tensors;
  std::vector<Mode> output;             // open modes, in the output's order
  ModeExtents extent;                   // every mode's extent
  std::string kind = "generic";         // "amplitude", "expectation" or "generic"
  int qubits = 0;                       // circuits: the qubit count
  std::vector<int> open_qubits;         // amplitude networks: qubits left open (output modes, in order)
  std::string pauli;                    // expectation networks: the Pauli string, e.g. "Z0 Z3"
  std::map<Mode, std::string> labels;   // generic networks: the original labels (for imported sliced modes)
  std::string description;
  // How entries multiply and add: "standard", or "tropical" (each complex128 entry an (exponent,
  // count) pair, kernels/linalg/tropical.hpp), for counting and optimization problems.
  std::string semiring = "standard";

  std::int64_t size_of(const std::vector<Mode>& modes) const;
  // Checks labels: every mode has an extent; a closed mode appears in two tensors or more (three
  // or more: a hyperindex, summed once over all its holders, as a copy tensor joining them would);
  // output modes appear in some tensor; no tensor lists a mode twice. Throws InputError.
  void validate(const std::string& what) const;
  // {inputs, output, size_dict} with integer labels (cotengra's layout, labels as numbers).
  nlohmann::json to_json() const;
};

// Amplitudes <x|C|0>: one projection tensor per closed qubit (data from `bitstring`, which may
// be changed per contraction), the last wire of every qubit in `open_qubits` left open.
Network amplitude_network(const Circuit& c, const std::vector<int>& open_qubits = {});

// <0|C^dagger P C|0> for a Pauli string P = {(qubit, 'X'|'Y'|'Z')}; gates outside P's backward
// light cone cancel and are left out, and so are qubits the cone never reaches.
Network expectation_network(const Circuit& c, const std::vector<std::pair<int, char>>& pauli);

// "Z0 Z3", "X1Y2" or "Z_0 Z_3" into (qubit, letter) pairs; InputError naming the string.
std::vector<std::pair<int, char>> parse_pauli(const std::string& text, int qubits);

// A generic network from cotengra's JSON layout: inputs as lists of labels (or strings of one-
// character labels), output likewise, size_dict mapping labels to extents. Labels are renamed to
// integers in order of first appearance. Data: `data` per tensor, or seeded random values.
Network network_from_json(const nlohmann::json& j, const std::string& what);
// An einsum expression "ab,bc->ac" with extents per letter.
Network network_from_einsum(const std::string& expression, const std::map<std::string, std::int64_t>& extents,
                            const std::string& what);
// Uniform random tensor data on [-1, 1) + i[-1, 1) from a seed (tensor t, element e: the
// counter-based generator of tensor.random with components 2(base + e), 2(base + e) + 1).
void fill_random(Network& n, std::uint64_t seed);

// The projection data of `bitstring` (one byte per qubit, 0 or 1) for the network's projections.
void set_bitstring(Network& n, const std::vector<std::uint8_t>& bitstring);

// HDF5: the root attribute "network" (JSON: inputs, output, size_dict, kind, qubits, open
// qubits, projections) and one chunked complex128 dataset per tensor, /tensors/tNNNNNN, with
// attributes "modes" (JSON list) and "tag". Rank-0 tensors are stored with shape [1].
void save_network(const Network& n, h5::File& file);
// A step's output, read (or taken from what this process kept of it: stages/common/kept.hpp).
Network load_network(const h5::File& file);
// Keeps `n` for the steps after the one of `step_key` that wrote it (networks up to 256 MiB of data).
void keep_network(const std::string& step_key, const Network& n);

// A network as bytes (for handing a computed network to every rank): meta JSON + tensor data.
std::string serialize_network(const Network& n);
Network deserialize_network(const std::string& bytes);

// JSON stored as a uint8 dataset (h5py: bytes(f[name][()]).decode()), for the computed outputs
// other steps name (network, path, plan).
h5::Dataset write_json_dataset(h5::File& file, const std::string& name, const nlohmann::json& j);
nlohmann::json read_json_dataset(const h5::File& file, const std::string& name);

}  // namespace qstage::tn
