#pragma once
// Helpers shared by the tensor stages (and the other families' small results).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "stages/common/stage.hpp"

namespace qstage::stages::detail {

inline bool is_float_type(h5::DType t) {
  return t == h5::DType::float32 || t == h5::DType::float64 || t == h5::DType::complex64 ||
         t == h5::DType::complex128;
}

// The chunk shape for an output of `shape` with `chunk_rows` rows per chunk (full extent in the
// other axes). Checks HDF5's 4 GiB limit on a chunk.
inline h5::Shape row_chunk(const h5::Shape& shape, std::uint64_t chunk_rows, h5::DType dtype, std::string_view what) {
  h5::Shape chunk = shape;
  chunk[0] = std::max<std::uint64_t>(1, std::min(chunk_rows, std::max<std::uint64_t>(shape[0], 1)));
  std::uint64_t bytes = h5::dtype_size(dtype);
  for (auto d : chunk) bytes *= std::max<std::uint64_t>(d, 1);
  if (bytes >= (4ull << 30))
    throw InputError(fmt::format("{}: a chunk of {} rows would be {} bytes; HDF5 chunks must stay below 4 GiB, "
                                 "expected a smaller chunk_rows or narrower rows",
                                 what, chunk[0], bytes));
  return chunk;
}

// A small result dataset, contiguous and written whole, with its description (written the same
// way by every rank).
inline h5::Dataset write_array(h5::File& out, const char* name, h5::DType t, const Shape& shape, const void* values,
                               const char* doc) {
  h5::Dataset d = out.create_dataset(name, {{t, shape, {}}, false});
  if (shape_elements(shape) > 0) d.write_all(values);
  d.set_attribute("description", doc);
  return d;
}

// Dataset `group/key`: `field` of each of `rows` (an iteration, a schedule point), in order.
template <typename Row, typename Field>
h5::Dataset write_column(h5::File& out, const char* group, const std::vector<Row>& rows, const char* key, h5::DType type,
                         Field Row::*field, const char* doc) {
  std::vector<Field> v;
  for (const Row& r : rows) v.push_back(r.*field);
  return write_array(out, fmt::format("{}/{}", group, key).c_str(), type, {v.size()}, v.data(), doc);
}

// A scalar result dataset with its description.
inline h5::Dataset write_scalar(h5::File& out, const char* name, h5::DType t, const void* value, const char* doc) {
  return write_array(out, name, t, {}, value, doc);
}

}  // namespace qstage::stages::detail
