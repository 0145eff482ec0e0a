#pragma once
// <x|y> = sum_i conj(x_i) y_i as per-tile partials (complex128), summed by the caller in tile
// order: deterministic on each backend.
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"

namespace qstage::kernels {

struct Dotc {
  DType dtype = DType::complex128;  // complex64 or complex128
  const void* x = nullptr;                  // device memory
  const void* y = nullptr;
  std::uint64_t n = 0;
  std::uint64_t tile = 1 << 16;
  double* partials = nullptr;               // device memory: 2 doubles (re, im) per tile
};

std::uint64_t dotc_tiles(const Dotc& args);
void dotc(Stream& stream, const Dotc& args);
void dotc_cpu(const Dotc& args);

namespace detail {
void dotc_cuda(void* cuda_stream, const Dotc& args);
}

}  // namespace qstage::kernels
