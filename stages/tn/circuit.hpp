#pragma once
// Quantum circuits: the gate set, the qsim text format, OpenQASM 2.0, and seeded generators of
// random circuits (Sycamore/Zuchongzhi style) and QAOA MaxCut circuits.
//
// Convention: a k-qubit gate on qubits (q0, ..., q(k-1)) is a 2^k x 2^k matrix U[out][in] whose
// row and column index is sum_j bit(q_j) * 2^(k-1-j): the first listed qubit is the most
// significant bit. (qsim writes its CNOT with the first qubit least significant; the parser
// translates.) A state vector's index is sum_q bit(q) * 2^q, so character q of a bitstring,
// qubit q, is bit q - qsim's convention.
#include <complex>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qstage::tn {

using cd = std::complex<double>;

struct Gate {
  std::string name;
  std::vector<int> qubits;
  std::vector<double> params;
  std::vector<cd> matrix;  // 2^k x 2^k, row-major, convention above
  int time = 0;            // qsim's moment (QASM: order of appearance)
  int line = 0;            // source line, for messages (0: generated)
  int arity() const { return static_cast<int>(qubits.size()); }
};

struct Circuit {
  int qubits = 0;
  std::vector<Gate> gates;
  std::string source;  // file name or generator description
  std::vector<std::pair<int, int>> graph;  // QAOA: the MaxCut graph's edges (energies sum <Z_a Z_b> over them)
};

// The matrix of a named gate (qsim names and the qelib1.inc names), or throws InputError
// "<what>: unknown gate ...". `params` are angles in radians.
std::vector<cd> gate_matrix(std::string_view name, const std::vector<double>& params, std::string_view what);
int gate_arity(std::string_view name);        // 0 if unknown
int gate_param_count(std::string_view name);  // -1 if unknown

// qsim's text format: the first non-comment line is the qubit count, then one gate a line:
// "time name qubit... [param...]". Trailing spaces are tolerated. InputError names the line.
Circuit parse_qsim(std::string_view text, std::string source);

// OpenQASM 2.0 with qelib1.inc (and user `gate` definitions). measure and barrier are ignored,
// reset and if are refused. InputError names the line.
Circuit parse_qasm(std::string_view text, std::string source);

// Reads a circuit file, choosing the parser by content (OPENQASM header) or extension.
Circuit read_circuit(const std::string& path);

struct RandomCircuitOptions {
  int rows = 4, cols = 4;           // qubits on a rows x cols grid, qubit r * cols + c
  int cycles = 8;                   // layers of single-qubit gates + two-qubit gates
  std::uint64_t seed = 0;
  std::string pattern = "ABCDCDAB"; // coupler activation sequence (A/B vertical, C/D horizontal)
  std::string two_qubit = "fs";     // "fs": fSim(pi/2, pi/6) (Sycamore); "cz"
};
// Sycamore/Zuchongzhi-style: each cycle applies a random gate from {x_1_2, y_1_2, hz_1_2} to every
// qubit (never the one it had in the previous cycle), then the two-qubit gate on the couplers of
// the cycle's pattern; a final single-qubit layer closes the circuit.
Circuit random_circuit(const RandomCircuitOptions& options);

struct QaoaOptions {
  int nodes = 8;  // even
  int p = 1;
  std::vector<double> gammas, betas;  // p each
  std::uint64_t seed = 0;
};
// A random 3-regular graph (pairing model, retried until simple), seeded.
std::vector<std::pair<int, int>> random_regular_graph(int nodes, int degree, std::uint64_t seed);
// QAOA for MaxCut: H on every qubit, then p layers of exp(-i gamma Z_i Z_j) on every edge
// ("rzz", angle 2 gamma) and rx(2 beta) on every qubit.
Circuit qaoa_maxcut(const QaoaOptions& options, const std::vector<std::pair<int, int>>& edges);

// Trotterized many-body dynamics on a 2D lattice (seed 000 section III-D): the transverse-field
// Ising model H = sum_<ij> J_ij Z_i Z_j + h sum_i X_i on rows x cols sites (qubit r * cols + c),
// first-order Trotter steps exp(-i J_ij dt Z Z) on every edge ("rzz", angle 2 J_ij dt) then
// exp(-i h dt X) on every site ("rx", angle 2 h dt), from |0...0>. The couplings are J times a
// seeded factor in [1 - disorder, 1 + disorder] per edge.
struct LatticeOptions {
  std::string kind = "rectangular";  // rectangular | triangular | hexagonal
  int rows = 3, cols = 3, steps = 1;
  double dt = 0.1, J = 1.0, h = 1.0, disorder = 0.0;
  std::uint64_t seed = 0;
};
// The lattice's nearest-neighbour edges: rectangular (right and down), triangular (those and the
// down-right diagonal), hexagonal (a brick wall, the honeycomb's graph: every horizontal edge and
// the vertical ones below sites with r + c even). Throws InputError for an unknown kind or size.
std::vector<std::pair<int, int>> lattice_edges(const LatticeOptions& options);
Circuit lattice_dynamics(const LatticeOptions& options);

}  // namespace qstage::tn
