#include "io/npy.hpp"

#include <fmt/format.h>

#include <map>
#include <regex>
#include <string>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "io/h5.hpp"

namespace qstage::npy {

namespace {

std::string header_field(const std::string& header, const std::string& key, const std::string& pattern,
                         const std::filesystem::path& path) {
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'" + key + "'\\s*:\\s*" + pattern)))
    throw InputError(fmt::format("'{}': the .npy header has no '{}' (header: {})", path.string(), key, header));
  return m[1].str();
}

}  // namespace

Array read(const std::filesystem::path& path) {
  const std::string bytes = fsutil::read_file(path);
  // Magic, version (major, minor), header length (2 bytes in version 1, 4 in 2 and 3), header.
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw InputError(fmt::format("'{}' is not a .npy file (no \\x93NUMPY magic); expected what numpy.save writes",
                                 path.string()));
  const int major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3)
    throw InputError(fmt::format("'{}': .npy format version {} is not supported; expected 1, 2 or 3", path.string(), major));
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::uint32_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) header_len |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t data_at = 8 + len_bytes + header_len;
  if (bytes.size() < data_at) throw InputError(fmt::format("'{}': the .npy header is truncated", path.string()));
  const std::string header = bytes.substr(8 + len_bytes, header_len);

  const std::string descr = header_field(header, "descr", "'([^']*)'", path);
  if (header_field(header, "fortran_order", "(True|False)", path) == "True")
    throw InputError(fmt::format("'{}' is in Fortran order; expected C order (numpy.ascontiguousarray before saving)",
                                 path.string()));
  Array a;
  const std::string dims = header_field(header, "shape", "\\(([^)]*)\\)", path);
  const std::regex number("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), number); it != std::sregex_iterator(); ++it)
    a.shape.push_back(std::stoull(it->str()));
  std::uint64_t count = 1;
  for (auto d : a.shape) count *= d;

  const std::map<std::string, h5::DType> types = {{"<f4", h5::DType::float32}, {"<f8", h5::DType::float64},
                                                   {"<c8", h5::DType::complex64}, {"<c16", h5::DType::complex128}};
  const auto type = types.find(descr);
  if (type == types.end())
    throw InputError(fmt::format("'{}' holds dtype '{}'; expected little-endian float32, float64, complex64 or "
                                 "complex128 ('<f4', '<f8', '<c8', '<c16')", path.string(), descr));
  const size_t size = h5::dtype_size(type->second);
  if (bytes.size() - data_at != count * size)
    throw InputError(fmt::format("'{}' has {} data bytes; its header (shape ({}), '{}') says {}", path.string(),
                                 bytes.size() - data_at, dims, descr, count * size));
  a.values.resize(count);
  for (std::uint64_t i = 0; i < count; ++i) a.values[i] = h5::element_as_complex(bytes.data() + data_at, type->second, i);
  return a;
}

}  // namespace qstage::npy
