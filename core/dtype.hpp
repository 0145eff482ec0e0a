#pragma once
// The element types qstage stores and computes on, known to every layer (kernels included)
// without HDF5 or MPI headers. Complex numbers are two floats (or doubles), real part first: the
// layout numpy's complex64/complex128 and HDF5's compound {r, i} (io/h5.hpp) share.
#include <complex>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qstage {

enum class DType { float32, float64, complex64, complex128, int32, int64, uint8, uint64 };

std::string_view dtype_name(DType t);             // "float32", "complex64", ...
std::optional<DType> parse_dtype(std::string_view name);
std::size_t dtype_size(DType t);                  // bytes per element
bool dtype_is_complex(DType t);
// Element i of packed values of a float or complex type (float32, float64, complex64,
// complex128) as complex<double>; throws std::invalid_argument for other types.
std::complex<double> element_as_complex(const void* data, DType t, std::uint64_t i);

}  // namespace qstage
