#pragma once
// How a dataset's values are laid out: element type, shape and chunk shape. One description for
// every layer that names a dataset before or while it exists: the HDF5 wrapper creating it
// (h5::DatasetCreate), a stage planning with it (stages::DatasetInfo) and a pass writing it
// (engine::OutputDecl). Axis 0 is the row axis the streaming engine cuts into batches.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace qstage {

// The extent of each axis, axis 0 (the rows) first; empty for a scalar.
using Shape = std::vector<std::uint64_t>;

// "[4, 3]" ("[]" for a scalar), as messages show a shape.
std::string shape_text(const Shape& shape);
// The product of the extents: values in an array of that shape (1 for a scalar).
std::uint64_t shape_elements(const Shape& shape);

struct Layout {
  DType dtype = DType::float32;
  Shape shape;
  Shape chunk;  // the shape of one chunk; empty: contiguous

  bool chunked() const { return !chunk.empty(); }
  // Extent of axis 0; a scalar is one row.
  std::uint64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  // Bytes of one row (one slice along axis 0): the element size times the other axes' extents.
  std::uint64_t row_bytes() const;
  // Values in the whole dataset (1 for a scalar).
  std::uint64_t elements() const { return shape_elements(shape); }
};

}  // namespace qstage
