#pragma once
// Reads NumPy's .npy files (format versions 1-3): what `numpy.save` writes. Little-endian
// float32, float64, complex64 and complex128 arrays in C order; anything else is refused with an
// InputError that names the file and says what was expected.
#include <complex>
#include <cstdint>
#include <filesystem>
#include <vector>

namespace qstage::npy {

struct Array {
  std::vector<std::uint64_t> shape;
  std::vector<std::complex<double>> values;  // converted to complex128, C order
};

Array read(const std::filesystem::path& path);

}  // namespace qstage::npy
