#pragma once
// State-vector kernels: apply a k-qubit gate (k <= 3) to a 2^n amplitude vector in place, and
// gather amplitudes at given basis states. Amplitude index = sum_q bit(q) * 2^q (qubit q is bit q).
// The gate matrix uses the circuit convention: its index is sum_j bit(target_j) * 2^(k-1-j).
#include <complex>
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"
#include "kernels/common.hpp"

namespace qstage::kernels {

constexpr int kMaxGateQubits = 3;

struct GateOperands {
  int k = 0;
  int targets[kMaxGateQubits] = {0, 0, 0};
  double matrix[2 * 64] = {};  // (2^k)^2 complex values as re, im pairs, row-major
};

struct ApplyGate {
  DType dtype = DType::complex128;  // complex64 or complex128
  void* state = nullptr;                    // device memory: 2^qubits amplitudes
  int qubits = 0;
  GateOperands gate;
};

struct Gather {
  DType dtype = DType::complex128;
  const void* state = nullptr;
  const std::uint64_t* indices = nullptr;  // device memory: basis states
  std::uint64_t count = 0;
  void* out = nullptr;                     // device memory: count amplitudes
};

// The basis index of local index l (bit j of l, from the top, goes to target j) inserted into
// the "other qubits" index i.
QSTAGE_HD std::uint64_t spread_index(std::uint64_t i, const int* sorted_targets, int k) {
  for (int j = 0; j < k; ++j) {  // insert a 0 bit at each target position, lowest first
    const std::uint64_t low = i & ((std::uint64_t{1} << sorted_targets[j]) - 1);
    i = ((i >> sorted_targets[j]) << (sorted_targets[j] + 1)) | low;
  }
  return i;
}

void apply_gate(Stream& stream, const ApplyGate& args);
void apply_gate_cpu(const ApplyGate& args);
void gather_amplitudes(Stream& stream, const Gather& args);
void gather_amplitudes_cpu(const Gather& args);

namespace detail {
void apply_gate_cuda(void* cuda_stream, const ApplyGate& args);
void gather_amplitudes_cuda(void* cuda_stream, const Gather& args);
}

}  // namespace qstage::kernels
