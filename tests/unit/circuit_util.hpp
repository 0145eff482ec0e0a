#pragma once
// The seeded random grid circuits the tensor-network unit tests build their networks from, and
// their state vectors from the gate kernel (the oracle the contractions are checked against).
#include <cstdint>
#include <vector>

#include "kernels/tn/statevector.hpp"
#include "stages/tn/circuit.hpp"

namespace qstage::test {

// A seeded random circuit on a rows x cols grid.
inline tn::Circuit grid_circuit(int rows, int cols, int cycles, std::uint64_t seed) {
  tn::RandomCircuitOptions o;
  o.rows = rows;
  o.cols = cols;
  o.cycles = cycles;
  o.seed = seed;
  return tn::random_circuit(o);
}

// The circuit's state vector from |0...0>, gate after gate through kernels::apply_gate_cpu.
inline std::vector<tn::cd> state_vector(const tn::Circuit& c) {
  std::vector<tn::cd> s(std::size_t{1} << c.qubits, 0.0);
  s[0] = 1;
  for (const auto& g : c.gates) {
    kernels::ApplyGate a;
    a.state = s.data();
    a.qubits = c.qubits;
    a.gate.k = g.arity();
    for (int j = 0; j < g.arity(); ++j) a.gate.targets[j] = g.qubits[static_cast<std::size_t>(j)];
    for (std::size_t i = 0; i < g.matrix.size(); ++i) {
      a.gate.matrix[2 * i] = g.matrix[i].real();
      a.gate.matrix[2 * i + 1] = g.matrix[i].imag();
    }
    kernels::apply_gate_cpu(a);
  }
  return s;
}

}  // namespace qstage::test
