#include "core/dtype.hpp"

#include <cstring>
#include <stdexcept>

namespace qstage {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::complex64: return "complex64";
    case DType::complex128: return "complex128";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
    case DType::uint64: return "uint64";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::float32, DType::float64, DType::complex64, DType::complex128, DType::int32, DType::int64,
                  DType::uint8, DType::uint64})
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::uint8: return 1;
    case DType::float32:
    case DType::int32: return 4;
    case DType::float64:
    case DType::complex64:
    case DType::int64:
    case DType::uint64: return 8;
    case DType::complex128: return 16;
  }
  return 0;
}

bool dtype_is_complex(DType t) { return t == DType::complex64 || t == DType::complex128; }

std::complex<double> element_as_complex(const void* data, DType t, std::uint64_t i) {
  const auto* at = static_cast<const char*>(data) + i * dtype_size(t);
  switch (t) {
    case DType::float32: { float v; std::memcpy(&v, at, 4); return {v, 0}; }
    case DType::float64: { double v; std::memcpy(&v, at, 8); return {v, 0}; }
    case DType::complex64: { float v[2]; std::memcpy(v, at, 8); return {v[0], v[1]}; }
    case DType::complex128: { double v[2]; std::memcpy(v, at, 16); return {v[0], v[1]}; }
    default: throw std::invalid_argument("element_as_complex: not a float or complex type");
  }
}

}  // namespace qstage
