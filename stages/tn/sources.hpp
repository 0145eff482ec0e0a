#pragma once
// Parameters tn.build and tn.statevector share: where the circuit comes from and what to
// compute of it. tn.statevector reads them itself (it is the independent oracle, so it does not
// take tn.build's network).
//
//   circuit: path.qsim | path.qasm        one of these three
//   random: {rows, cols, cycles, seed, pattern, gate}
//   qaoa: {nodes, p, gammas, betas, seed}
//   lattice: {kind, rows, cols, steps, dt, J, h, disorder, seed}   (Trotterized Ising dynamics)
//   bitstrings: ["0101..", ...]          amplitudes of these (character q = qubit q), or
//   bitstrings_file: path                 lines of 0/1 (the first `count`), or
//   random_bitstrings: {count, seed}
//   open: [q, ...]                        qubits left open: 2^k amplitudes per bitstring
//   pauli: "Z0 Z1"                        the expectation value instead of amplitudes
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

using Files = std::map<std::string, std::filesystem::path>;

// The JSON pointers of the file parameters above.
std::vector<std::string> source_file_parameters();

// The parameters above, read once (part of tn.build's and tn.statevector's Params). Files are
// flagged here and read from the step's resolved file parameters (Files).
struct SourceParams {
  int circuit_sources = 0;  // how many of circuit, random, qaoa and lattice are given (one expected)
  bool circuit = false;     // a circuit file: Files "/circuit"
  std::optional<RandomCircuitOptions> random;
  std::optional<QaoaOptions> qaoa;
  std::optional<LatticeOptions> lattice;
  std::optional<std::vector<std::string>> bitstrings;
  bool bitstrings_file = false;  // Files "/bitstrings_file"
  std::optional<std::uint64_t> count;  // lines of bitstrings_file read (none or 0: all)
  std::optional<std::pair<std::uint64_t, std::uint64_t>> random_bitstrings;  // (count, seed)
  std::vector<int> open;
  std::optional<std::string> pauli;
  bool has_circuit() const { return circuit_sources > 0; }
  static SourceParams from_json(const nlohmann::json& params);
};

Circuit circuit_from_params(const SourceParams& params, const Files& files);
// Default: one bitstring of zeros. InputError for wrong lengths or characters.
std::vector<std::vector<std::uint8_t>> bitstrings_from_params(const SourceParams& params, const Files& files,
                                                              int qubits);
std::optional<std::vector<std::pair<int, char>>> pauli_from_params(const SourceParams& params, int qubits);
std::vector<int> open_qubits_from_params(const SourceParams& params, int qubits);

// The "bitstrings" dataset tn.build, tn.contract and tn.statevector write: uint8 [rows, qubits].
void write_bitstrings(h5::File& out, const std::vector<std::vector<std::uint8_t>>& bits, int qubits);
std::vector<std::vector<std::uint8_t>> read_bitstrings(const h5::File& file);  // empty if absent
// The result layout of tn.contract and tn.statevector for circuits (after "amplitudes" or, with
// a Pauli string, "value" exists): the bitstrings, descriptions, and attributes qubits,
// open_qubits (JSON list), pauli, precision.
void write_result_layout(h5::File& out, const std::vector<std::vector<std::uint8_t>>& bits, int qubits,
                         const std::vector<int>& open, const std::string& pauli, const std::string& precision);

}  // namespace qstage::tn
