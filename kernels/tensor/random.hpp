#pragma once
// Counter-based random numbers: component j of a tensor drawn with `seed` depends only on
// (seed, j), so any split into batches, ranks or backends gives the same bits.
//   key   = splitmix64(seed)
//   u_j   = splitmix64(key + (j + 1) * 0x9e3779b97f4a7c15)           (SplitMix64's j-th output)
//   float32 component:  (u_j >> 40) * 2^-23 - 1     uniform on [-1, 1), exact in float
//   float64 component:  (u_j >> 11) * 2^-52 - 1     uniform on [-1, 1), exact in double
// A complex element e has components j = 2e (real) and 2e + 1 (imaginary).
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"
#include "kernels/common.hpp"

namespace qstage::kernels {

struct RandomFill {
  DType dtype = DType::float32;  // float32, float64, complex64 or complex128
  std::uint64_t seed = 0;
  std::uint64_t first_component = 0;  // global index of the first component written
  std::uint64_t components = 0;       // how many float/double components to write
  void* out = nullptr;                // device memory (host memory on the cpu backend)
};

QSTAGE_HD std::uint64_t random_bits(std::uint64_t key, std::uint64_t j) { return splitmix64(key + (j + 1) * kGolden); }
QSTAGE_HD float random_float(std::uint64_t bits) { return static_cast<float>(bits >> 40) * 0x1p-23f - 1.0f; }
QSTAGE_HD double random_double(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-52 - 1.0; }
// Uniform on [0, 1) (53 bits): probabilities drawn from the same stream (tn.build's sampled instances).
QSTAGE_HD double random_unit(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

// Enqueues the fill on `stream` (cpu: runs now).
void random_fill(Stream& stream, const RandomFill& args);
// The CPU twin, callable directly (tests compare it with the GPU kernel).
void random_fill_cpu(const RandomFill& args);

namespace detail {
void random_fill_cuda(void* cuda_stream, const RandomFill& args);
}

}  // namespace qstage::kernels
