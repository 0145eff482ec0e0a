#pragma once
// The seeded random grid circuits the tensor-network unit tests build their networks from.
#include <cstdint>

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

}  // namespace qstage::test
