#include "io/h5.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <mutex>

namespace qstage::h5 {
namespace {

// The most specific message on HDF5's error stack (the innermost "minor" description), then
// clears the stack so the next failure starts clean.
std::string take_error_stack() {
  std::string reason;
  auto walk = [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
    auto* out = static_cast<std::string*>(data);
    if (err->desc && *err->desc) {
      if (!out->empty()) out->append("; ");
      out->append(err->desc);
    }
    return n >= 2 ? -1 : 0;  // the first few frames say enough
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("unknown HDF5 error") : reason;
}

[[noreturn]] void fail(std::string_view op, const Where& where) {
  throw Error(std::string(op), where.file, where.object, take_error_stack());
}

template <typename T>
T check(T result, std::string_view op, const Where& where) {
  if (result < 0) fail(op, where);
  return result;
}

Id plist(hid_t cls, const Where& where) { return Id(check(H5Pcreate(cls), "H5Pcreate", where), H5Pclose); }

bool parallel_comm(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return false;
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size > 1;
}

Id file_access(MPI_Comm comm, const Where& where) {
  Id fapl = plist(H5P_FILE_ACCESS, where);
  if (parallel_comm(comm)) {
    check(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio", where);
    // Collective metadata writes (at flush and close, which are collective anyway). Metadata
    // *reads* stay independent: raw reads are independent and look up chunk indexes themselves.
    check(H5Pset_coll_metadata_write(fapl.get(), true), "H5Pset_coll_metadata_write", where);
  }
  return fapl;
}

std::atomic<std::uint64_t> collective_calls{0};

Id collective_transfer(bool parallel, const Where& where) {
  if (parallel) collective_calls += 1;
  Id dxpl = plist(H5P_DATASET_XFER, where);
  if (parallel) check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio", where);
  return dxpl;
}

Id string_type(const Where& where) {
  Id t(check(H5Tcopy(H5T_C_S1), "H5Tcopy", where), H5Tclose);
  check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size", where);
  check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", where);
  return t;
}

Id scalar_space(const Where& where) { return Id(check(H5Screate(H5S_SCALAR), "H5Screate", where), H5Sclose); }

Shape space_dims(hid_t space, const Where& where) {
  int rank = check(H5Sget_simple_extent_ndims(space), "H5Sget_simple_extent_ndims", where);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "H5Sget_simple_extent_dims", where);
  return Shape(dims.begin(), dims.end());
}

std::string join_object(std::string_view parent, std::string_view name) {
  std::string out(parent.empty() || parent == "/" ? "" : parent);
  out += "/";
  out += name;
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------ Error
Error::Error(std::string operation, std::string file, std::string object, std::string reason)
    : std::runtime_error(fmt::format("HDF5 {} failed for '{}' in '{}': {}", operation, object.empty() ? "/" : object,
                                     file, reason)),
      operation_(std::move(operation)), file_(std::move(file)), object_(std::move(object)), reason_(std::move(reason)) {}


void quiet_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// ------------------------------------------------------------------------------------ Id
Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Id::reset() noexcept {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

void Id::close(std::string_view file, std::string_view object) {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = H5I_INVALID_HID;
  if (closer_(id) < 0) fail("close", Where{std::string(file), std::string(object)});
}

// ------------------------------------------------------------------------------------ types
Id memory_type(DType t) {
  const Where where{"", "memory type"};
  auto native = [](hid_t base) { return Id(H5Tcopy(base), H5Tclose); };
  switch (t) {
    case DType::float32: return native(H5T_NATIVE_FLOAT);
    case DType::float64: return native(H5T_NATIVE_DOUBLE);
    case DType::int32: return native(H5T_NATIVE_INT32);
    case DType::int64: return native(H5T_NATIVE_INT64);
    case DType::uint8: return native(H5T_NATIVE_UINT8);
    case DType::uint64: return native(H5T_NATIVE_UINT64);
    case DType::complex64:
    case DType::complex128: {
      const bool single = t == DType::complex64;
      const size_t part = single ? 4 : 8;
      Id c(check(H5Tcreate(H5T_COMPOUND, 2 * part), "H5Tcreate", where), H5Tclose);
      hid_t base = single ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
      check(H5Tinsert(c.get(), "r", 0, base), "H5Tinsert", where);
      check(H5Tinsert(c.get(), "i", part, base), "H5Tinsert", where);
      return c;
    }
  }
  throw std::logic_error("memory_type: unknown dtype");
}

std::optional<DType> dtype_of(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return DType::float32;
    if (size == 8) return DType::float64;
    return std::nullopt;
  }
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 1 && !is_signed) return DType::uint8;
    if (size == 4 && is_signed) return DType::int32;
    if (size == 8) return is_signed ? DType::int64 : DType::uint64;
    return std::nullopt;
  }
  if (cls == H5T_COMPOUND && H5Tget_nmembers(type) == 2) {
    hid_t a = H5Tget_member_type(type, 0), b = H5Tget_member_type(type, 1);
    std::optional<DType> result;
    if (H5Tget_class(a) == H5T_FLOAT && H5Tget_class(b) == H5T_FLOAT && H5Tget_size(a) == H5Tget_size(b) &&
        H5Tget_member_offset(type, 0) == 0 && H5Tget_member_offset(type, 1) == H5Tget_size(a) &&
        size == 2 * H5Tget_size(a)) {
      if (H5Tget_size(a) == 4) result = DType::complex64;
      if (H5Tget_size(a) == 8) result = DType::complex128;
    }
    H5Tclose(a);
    H5Tclose(b);
    return result;
  }
  return std::nullopt;
}

std::string describe_type(hid_t type) {
  if (auto d = dtype_of(type)) return std::string(dtype_name(*d));
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_2 ? "" : "u", 8 * size);
    case H5T_FLOAT: return fmt::format("float{}", 8 * size);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: {
      std::vector<std::string> names;
      for (int i = 0; i < H5Tget_nmembers(type); ++i) {
        char* n = H5Tget_member_name(type, static_cast<unsigned>(i));
        names.emplace_back(n ? n : "?");
        H5free_memory(n);
      }
      return fmt::format("compound{{{}}}", fmt::join(names, ","));
    }
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    default: return "unsupported type";
  }
}

Id row_selection(const Shape& shape, std::uint64_t row0, std::uint64_t nrows) {
  const Where where{"", "dataspace"};
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Id space(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple", where),
           H5Sclose);
  if (nrows == 0) {
    check(H5Sselect_none(space.get()), "H5Sselect_none", where);
    return space;
  }
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = row0;
  count[0] = nrows;
  check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
        "H5Sselect_hyperslab", where);
  return space;
}

// ------------------------------------------------------------------------------------ Object
bool Object::has_attribute(std::string_view name) const {
  std::string n(name);
  return check(H5Aexists(id(), n.c_str()), "H5Aexists", where_) > 0;
}

Id Object::open_attribute(std::string_view name) const {
  std::string n(name);
  Where w{where_.file, where_.object + "@" + n};
  return Id(check(H5Aopen(id(), n.c_str(), H5P_DEFAULT), "open attribute", w), H5Aclose);
}

Id Object::replace_attribute(std::string_view name, hid_t type, hid_t space) {
  std::string n(name);
  Where w{where_.file, where_.object + "@" + n};
  if (has_attribute(name)) check(H5Adelete(id(), n.c_str()), "delete attribute", w);
  return Id(check(H5Acreate2(id(), n.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), "create attribute", w),
            H5Aclose);
}

void Object::set_attribute(std::string_view name, std::string_view value) {
  Id type = string_type(where_);
  Id space = scalar_space(where_);
  Id attr = replace_attribute(name, type.get(), space.get());
  std::string copy(value);
  const char* p = copy.c_str();
  check(H5Awrite(attr.get(), type.get(), &p), "write attribute", Where{where_.file, where_.object + "@" + std::string(name)});
}

void Object::set_attribute(std::string_view name, double value) {
  Id space = scalar_space(where_);
  Id attr = replace_attribute(name, H5T_IEEE_F64LE, space.get());
  check(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), "write attribute", where_);
}

void Object::set_attribute(std::string_view name, std::int64_t value) {
  Id space = scalar_space(where_);
  Id attr = replace_attribute(name, H5T_STD_I64LE, space.get());
  check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), "write attribute", where_);
}

void Object::set_attribute(std::string_view name, std::uint64_t value) {
  Id space = scalar_space(where_);
  Id attr = replace_attribute(name, H5T_STD_U64LE, space.get());
  check(H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value), "write attribute", where_);
}

void Object::set_attribute(std::string_view name, const std::vector<std::uint64_t>& values) {
  const hsize_t n = values.size();
  Id space(check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple", where_), H5Sclose);
  Id attr = replace_attribute(name, H5T_STD_U64LE, space.get());
  if (n) check(H5Awrite(attr.get(), H5T_NATIVE_UINT64, values.data()), "write attribute", where_);
}

std::vector<std::uint64_t> Object::uint64s_attribute(std::string_view name) const {
  Id attr = open_attribute(name);
  Where w{where_.file, where_.object + "@" + std::string(name)};
  Id ftype(check(H5Aget_type(attr.get()), "H5Aget_type", w), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_INTEGER) throw Error("read attribute", w.file, w.object, "attribute is not integers");
  Id space(check(H5Aget_space(attr.get()), "H5Aget_space", w), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) throw Error("read attribute", w.file, w.object, "no extent");
  std::vector<std::uint64_t> values(static_cast<std::size_t>(n));
  if (n) check(H5Aread(attr.get(), H5T_NATIVE_UINT64, values.data()), "read attribute", w);
  return values;
}

std::string Object::string_attribute(std::string_view name) const {
  Id attr = open_attribute(name);
  Where w{where_.file, where_.object + "@" + std::string(name)};
  Id ftype(check(H5Aget_type(attr.get()), "H5Aget_type", w), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    throw Error("read string attribute", w.file, w.object, "attribute is not a string");
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Id mtype = string_type(where_);
    char* p = nullptr;
    check(H5Aread(attr.get(), mtype.get(), &p), "read attribute", w);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t size = H5Tget_size(ftype.get());
  std::string s(size, '\0');
  check(H5Aread(attr.get(), ftype.get(), s.data()), "read attribute", w);
  s.erase(std::find(s.begin(), s.end(), '\0'), s.end());
  return s;
}

double Object::double_attribute(std::string_view name) const {
  Id attr = open_attribute(name);
  double v = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), "read attribute", where_);
  return v;
}

std::int64_t Object::int_attribute(std::string_view name) const {
  Id attr = open_attribute(name);
  std::int64_t v = 0;
  check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), "read attribute", where_);
  return v;
}

std::vector<std::string> Object::attribute_names() const {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  check(H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names), "H5Aiterate2", where_);
  return names;
}

std::string Object::attribute_as_text(std::string_view name) const {
  Id attr = open_attribute(name);
  Id ftype(check(H5Aget_type(attr.get()), "H5Aget_type", where_), H5Tclose);
  Id space(check(H5Aget_space(attr.get()), "H5Aget_space", where_), H5Sclose);
  const auto npoints = H5Sget_simple_extent_npoints(space.get());
  switch (H5Tget_class(ftype.get())) {
    case H5T_STRING: return string_attribute(name);
    case H5T_FLOAT:
      if (npoints == 1) return fmt::format("{}", double_attribute(name));
      break;
    case H5T_INTEGER:
      if (npoints == 1) {
        if (H5Tget_sign(ftype.get()) == H5T_SGN_NONE) {
          std::uint64_t v = 0;
          check(H5Aread(attr.get(), H5T_NATIVE_UINT64, &v), "read attribute", where_);
          return fmt::format("{}", v);
        }
        return fmt::format("{}", int_attribute(name));
      }
      if (npoints > 0 && npoints <= 1024) {  // a short list: [a, b, ...]
        const bool is_unsigned = H5Tget_sign(ftype.get()) == H5T_SGN_NONE;
        std::vector<std::uint64_t> v(static_cast<std::size_t>(npoints));
        check(H5Aread(attr.get(), is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, v.data()), "read attribute", where_);
        std::string text = "[";
        for (std::size_t i = 0; i < v.size(); ++i)
          text += (i ? ", " : "") + (is_unsigned ? fmt::format("{}", v[i]) : fmt::format("{}", static_cast<std::int64_t>(v[i])));
        return text + "]";
      }
      break;
    default: break;
  }
  return fmt::format("<{} x{}>", describe_type(ftype.get()), npoints);
}

// ------------------------------------------------------------------------------------ Dataset
Shape Dataset::shape() const {
  Id space(check(H5Dget_space(id()), "H5Dget_space", where_), H5Sclose);
  return space_dims(space.get(), where_);
}

Shape Dataset::chunk() const {
  Id dcpl(check(H5Dget_create_plist(id()), "H5Dget_create_plist", where_), H5Pclose);
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return {};
  std::array<hsize_t, 32> dims{};
  int rank = check(H5Pget_chunk(dcpl.get(), static_cast<int>(dims.size()), dims.data()), "H5Pget_chunk", where_);
  return Shape(dims.begin(), dims.begin() + rank);
}

std::optional<DType> Dataset::dtype() const {
  Id t(check(H5Dget_type(id()), "H5Dget_type", where_), H5Tclose);
  return dtype_of(t.get());
}

std::string Dataset::type_description() const {
  Id t(check(H5Dget_type(id()), "H5Dget_type", where_), H5Tclose);
  return describe_type(t.get());
}

DType Dataset::memory_dtype() const {
  auto t = dtype();
  if (!t) throw Error("read", where_.file, where_.object, "unsupported element type " + type_description());
  return *t;
}

std::uint64_t Dataset::row_bytes() const { return Layout{memory_dtype(), shape(), {}}.row_bytes(); }

void Dataset::read_rows(std::uint64_t row0, std::uint64_t nrows, void* buf) const {
  if (nrows == 0) return;
  const Shape s = shape();
  if (s.empty()) throw Error("read rows", where_.file, where_.object, "dataset is a scalar");
  if (row0 + nrows > s[0])
    throw Error("read rows", where_.file, where_.object,
                fmt::format("rows [{}, {}) are outside the dataset's {} rows", row0, row0 + nrows, s[0]));
  // The file type's compound member names may differ from ours (e.g. "real"/"imag"); read with
  // the file's own type, converted to native byte order.
  Id ftype(check(H5Dget_type(id()), "H5Dget_type", where_), H5Tclose);
  Id mtype(check(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND), "H5Tget_native_type", where_), H5Tclose);
  Id fspace = row_selection(s, row0, nrows);
  Shape mshape = s;
  mshape[0] = nrows;
  Id mspace = row_selection(mshape, 0, nrows);
  check(H5Dread(id(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, buf),
        fmt::format("read rows [{}, {})", row0, row0 + nrows), where_);
}

void Dataset::write_rows(std::uint64_t row0, std::uint64_t nrows, const void* buf) {
  const Shape s = shape();
  if (nrows > 0 && row0 + nrows > s[0])
    throw Error("write rows", where_.file, where_.object,
                fmt::format("rows [{}, {}) are outside the dataset's {} rows", row0, row0 + nrows, s[0]));
  Id mtype = memory_type(memory_dtype());
  Id fspace = row_selection(s, row0, nrows);
  Shape mshape = s;
  mshape[0] = std::max<std::uint64_t>(nrows, 1);
  Id mspace = row_selection(mshape, 0, nrows);
  Id dxpl = collective_transfer(parallel_, where_);
  check(H5Dwrite(id(), mtype.get(), mspace.get(), fspace.get(), dxpl.get(), buf),
        fmt::format("write rows [{}, {})", row0, row0 + nrows), where_);
}

void Dataset::read_all(void* buf) const {
  Id ftype(check(H5Dget_type(id()), "H5Dget_type", where_), H5Tclose);
  Id mtype(check(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND), "H5Tget_native_type", where_), H5Tclose);
  check(H5Dread(id(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), "read", where_);
}

void Dataset::write_all(const void* buf) {
  Id mtype = memory_type(memory_dtype());
  Id dxpl = collective_transfer(parallel_, where_);
  check(H5Dwrite(id(), mtype.get(), H5S_ALL, H5S_ALL, dxpl.get(), buf), "write", where_);
}

void Dataset::set_rows(std::uint64_t rows) {
  Shape s = shape();
  s[0] = rows;
  std::vector<hsize_t> dims(s.begin(), s.end());
  if (parallel_) collective_calls += 1;
  check(H5Dset_extent(id(), dims.data()), fmt::format("set extent to {} rows", rows), where_);
}

std::uint64_t collective_dataset_calls() { return collective_calls.load(); }

// ------------------------------------------------------------------------------------ File
File File::create(const std::filesystem::path& path, MPI_Comm comm) {
  quiet_errors();
  Where where{path.string(), "/"};
  Id fapl = file_access(comm, where);
  Id fcpl = plist(H5P_FILE_CREATE, where);
  hid_t f = check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), "create file", where);
  File file;
  file.id_ = Id(f, H5Fclose);
  file.where_ = where;
  file.path_ = path;
  file.parallel_ = parallel_comm(comm);
  return file;
}

File File::open(const std::filesystem::path& path, Mode mode, MPI_Comm comm) {
  quiet_errors();
  Where where{path.string(), "/"};
  Id fapl = file_access(comm, where);
  hid_t f = check(H5Fopen(path.c_str(), mode == Mode::read_only ? H5F_ACC_RDONLY : H5F_ACC_RDWR, fapl.get()),
                  "open file", where);
  File file;
  file.id_ = Id(f, H5Fclose);
  file.where_ = where;
  file.path_ = path;
  file.parallel_ = parallel_comm(comm);
  return file;
}

bool File::is_hdf5(const std::filesystem::path& path) {
  quiet_errors();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  htri_t r = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

bool File::exists(std::string_view dataset_path) const {
  // H5Lexists fails on missing intermediate groups, so walk the path one component at a time.
  std::string path(dataset_path);
  if (path.empty() || path == "/") return true;
  size_t pos = 0;
  while (true) {
    size_t next = path.find('/', pos + 1);
    std::string prefix = path.substr(0, next);
    if (!prefix.empty() && prefix != "/") {
      htri_t r = H5Lexists(id(), prefix.c_str(), H5P_DEFAULT);
      if (r <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
    }
    if (next == std::string::npos) return true;
    pos = next;
  }
}

Dataset File::create_dataset(std::string_view name, const DatasetCreate& how, const std::vector<Filter>& filters) {
  std::string n(name);
  Where w{where_.file, n};
  const Layout& layout = how.layout;
  std::vector<hsize_t> dims(layout.shape.begin(), layout.shape.end());
  std::vector<hsize_t> maxdims = dims;
  if (how.extendible_rows) {
    if (!layout.chunked()) throw Error("create dataset", w.file, n, "an extendible dataset needs a chunk shape");
    maxdims[0] = H5S_UNLIMITED;
  }
  Id space = dims.empty()
                 ? scalar_space(w)
                 : Id(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()),
                            "H5Screate_simple", w),
                      H5Sclose);
  Id dcpl = plist(H5P_DATASET_CREATE, w);
  if (layout.chunked()) {
    if (layout.chunk.size() != layout.shape.size())
      throw Error("create dataset", w.file, n, "chunk rank differs from dataset rank");
    std::vector<hsize_t> chunk(layout.chunk.begin(), layout.chunk.end());
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk", w);
  }
  if (how.early_allocation)
    check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time", w);
  if (!filters.empty() && !layout.chunked()) throw Error("create dataset", w.file, n, "filters need a chunk shape");
  for (const auto& f : filters)
    check(H5Pset_filter(dcpl.get(), static_cast<H5Z_filter_t>(f.id), H5Z_FLAG_MANDATORY, f.cd_values.size(),
                        f.cd_values.data()),
          "H5Pset_filter", w);
  // Never write fill values (a full extra pass under MPI-IO); what was written is tracked outside.
  check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time", w);
  // No timestamps in object headers: identical runs give identical files.
  check(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times", w);
  Id lcpl = plist(H5P_LINK_CREATE, w);
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group", w);
  Id ftype = memory_type(layout.dtype);
  hid_t d = check(H5Dcreate2(id(), n.c_str(), ftype.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                  "create dataset", w);
  return Dataset(Id(d, H5Dclose), w, parallel_);
}

std::vector<unsigned> Dataset::filter_ids() const {
  Id dcpl(check(H5Dget_create_plist(id()), "H5Dget_create_plist", where_), H5Pclose);
  const int n = check(H5Pget_nfilters(dcpl.get()), "H5Pget_nfilters", where_);
  std::vector<unsigned> ids;
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0;
    std::size_t nelmts = 0;
    char name[64];
    unsigned config = 0;
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelmts, nullptr, sizeof name,
                                          name, &config);
    if (f < 0) throw Error("H5Pget_filter2", where_.file, where_.object, "cannot read the filter pipeline");
    ids.push_back(static_cast<unsigned>(f));
  }
  return ids;
}

void Dataset::write_stored_chunk(std::uint64_t index, const void* data, std::uint64_t bytes) {
  if (parallel_)
    throw Error("write stored chunk", where_.file, where_.object, "direct chunk writes need a serially opened file");
  const Shape s = shape();
  std::vector<hsize_t> offset(s.size(), 0);
  if (!s.empty()) offset[0] = index * chunk().at(0);
  check(H5Dwrite_chunk(id(), H5P_DEFAULT, 0, offset.data(), bytes, data), "H5Dwrite_chunk", where_);
}

std::vector<std::uint8_t> Dataset::read_stored_chunk(std::uint64_t index) const {
  const Shape s = shape();
  std::vector<hsize_t> offset(s.size(), 0);
  if (!s.empty()) offset[0] = index * chunk().at(0);
  hsize_t bytes = 0;
  check(H5Dget_chunk_storage_size(id(), offset.data(), &bytes), "H5Dget_chunk_storage_size", where_);
  std::vector<std::uint8_t> out(bytes);
  std::uint32_t mask = 0;
  check(H5Dread_chunk(id(), H5P_DEFAULT, offset.data(), &mask, out.data()), "H5Dread_chunk", where_);
  return out;
}

Dataset File::open_dataset(std::string_view name) const {
  std::string n(name);
  Where w{where_.file, n};
  if (!exists(n)) throw Error("open dataset", w.file, n, "no such dataset");
  hid_t d = check(H5Dopen2(id(), n.c_str(), H5P_DEFAULT), "open dataset", w);
  return Dataset(Id(d, H5Dclose), w, parallel_);
}

std::vector<std::string> File::dataset_paths() const {
  struct Walk {
    std::vector<std::string> paths;
  } walk;
  auto cb = [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type != H5L_TYPE_HARD) return 0;
    hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) {
      H5Eclear2(H5E_DEFAULT);
      return 0;
    }
    if (H5Iget_type(obj) == H5I_DATASET) static_cast<Walk*>(data)->paths.push_back(join_object("/", name));
    H5Oclose(obj);
    return 0;
  };
  check(H5Lvisit(id(), H5_INDEX_NAME, H5_ITER_INC, cb, &walk), "list datasets", where_);
  return walk.paths;
}

void File::flush() { check(H5Fflush(id(), H5F_SCOPE_LOCAL), "flush", where_); }

void File::close() { id_.close(where_.file, "/"); }

}  // namespace qstage::h5
