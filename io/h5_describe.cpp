#include "io/h5_describe.hpp"

#include "io/h5.hpp"

namespace qstage::h5 {

using nlohmann::json;

namespace {

// An attribute as a JSON value: strings as strings, scalar numbers as numbers, integer lists as arrays.
json attribute_value(const Object& obj, const std::string& name) {
  hid_t attr = H5Aopen(obj.id(), name.c_str(), H5P_DEFAULT);
  if (attr < 0) return obj.attribute_as_text(name);
  hid_t type = H5Aget_type(attr);
  hid_t space = H5Aget_space(attr);
  const H5T_class_t cls = H5Tget_class(type);
  const auto points = H5Sget_simple_extent_npoints(space);
  const bool is_unsigned = cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE;
  H5Sclose(space);
  H5Tclose(type);
  H5Aclose(attr);
  if (cls == H5T_STRING) return obj.string_attribute(name);
  if (points == 1 && cls == H5T_FLOAT) return obj.double_attribute(name);
  if (points == 1 && cls == H5T_INTEGER) {
    if (is_unsigned) return std::stoull(obj.attribute_as_text(name));
    return obj.int_attribute(name);
  }
  if (cls == H5T_INTEGER) {  // a list of integers: attribute_as_text writes it as a JSON array
    const std::string text = obj.attribute_as_text(name);
    if (!text.empty() && text[0] == '[') return json::parse(text);
  }
  return obj.attribute_as_text(name);
}

json attributes(const Object& obj) {
  json out = json::object();
  for (const auto& name : obj.attribute_names()) out[name] = attribute_value(obj, name);
  return out;
}

json max_shape(const Dataset& d) {
  hid_t space = H5Dget_space(d.id());
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0))), maxdims(dims.size());
  H5Sget_simple_extent_dims(space, dims.data(), maxdims.data());
  H5Sclose(space);
  json out = json::array();
  for (auto m : maxdims) out.push_back(m == H5S_UNLIMITED ? json(nullptr) : json(m));
  return out;
}

}  // namespace

json describe_file(const std::filesystem::path& path) {
  File f = File::open(path, Mode::read_only);
  json out = {{"file", path.string()}, {"attributes", attributes(f)}, {"datasets", json::array()}};
  for (const auto& p : f.dataset_paths()) {
    Dataset d = f.open_dataset(p);
    std::uint64_t elements = 1;
    for (auto s : d.shape()) elements *= s;
    auto dtype = d.dtype();
    json entry = {{"path", p},
                  {"dtype", dtype ? std::string(dtype_name(*dtype)) : d.type_description()},
                  {"shape", d.shape()},
                  {"maxshape", max_shape(d)},
                  {"chunk", d.chunk().empty() ? json(nullptr) : json(d.chunk())},
                  {"bytes", dtype ? elements * dtype_size(*dtype) : 0},
                  {"attributes", attributes(d)}};
    out["datasets"].push_back(entry);
  }
  return out;
}

}  // namespace qstage::h5
