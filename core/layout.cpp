#include "core/layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace qstage {

std::string shape_text(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::uint64_t Layout::row_bytes() const {
  std::uint64_t n = dtype_size(dtype);
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::uint64_t shape_elements(const Shape& shape) {
  std::uint64_t n = 1;
  for (std::uint64_t extent : shape) n *= extent;
  return n;
}

}  // namespace qstage
