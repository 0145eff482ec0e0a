#pragma once
// A small RAII layer over the HDF5 C API (HighFive-style): one class per handle, every C call
// checked, every failure a typed h5::Error that says which file, object and operation failed.
//
// Files opened with a communicator of more than one rank use the MPI-IO driver; writes are then
// collective (every rank calls, a rank with nothing to write passes an empty selection) and reads
// are independent. With one rank the plain POSIX driver is used.
#include <hdf5.h>
#include <mpi.h>

#include "core/dtype.hpp"
#include "core/layout.hpp"

#include <complex>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qstage::h5 {

// An HDF5 call failed. what() reads "<operation> failed for <object> in <file>: <HDF5's reason>".
class Error : public std::runtime_error {
 public:
  Error(std::string operation, std::string file, std::string object, std::string reason);
  const std::string& operation() const { return operation_; }
  const std::string& file() const { return file_; }
  const std::string& object() const { return object_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string operation_, file_, object_, reason_;
};

// The element types (core/dtype.hpp) and shapes (core/layout.hpp), here under h5:: as well. On file, complex numbers are a
// compound of two floats named r and i, the layout h5py writes and reads as numpy
// complex64/complex128.
using qstage::DType;
using qstage::dtype_is_complex;
using qstage::dtype_name;
using qstage::dtype_size;
using qstage::element_as_complex;
using qstage::parse_dtype;
using qstage::Shape;

// Turns off HDF5's printing of error stacks (we report them ourselves). Idempotent.
void quiet_errors();

// Collective MPI-IO calls on datasets this process has made (raw writes and extent changes of
// files open with MPI-IO): what a pass's rounds should not cost (tests/mpi check it).
std::uint64_t collective_dataset_calls();

// An owned HDF5 identifier, closed with the matching H5?close on destruction.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& o) noexcept;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() noexcept;
  // Closes now and reports a failure (a destructor cannot).
  void close(std::string_view file, std::string_view object);

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Where a handle lives, for error messages.
struct Where {
  std::string file;
  std::string object;
};

// In-memory type for a DType (complex as the r/i compound).
Id memory_type(DType t);
// The DType an HDF5 type corresponds to, or nullopt (e.g. strings, enums, odd compounds).
std::optional<DType> dtype_of(hid_t type);
// A human description of any HDF5 type, for error messages ("string", "compound{a,b}", "int16").
std::string describe_type(hid_t type);

// A dataspace selection of whole rows [row0, row0 + nrows) of a dataset of the given shape.
Id row_selection(const Shape& shape, std::uint64_t row0, std::uint64_t nrows);

// Something that carries attributes (a file's root group or a dataset).
class Object {
 public:
  const Where& where() const { return where_; }
  hid_t id() const { return id_.get(); }
  bool has_attribute(std::string_view name) const;
  // Attributes are written the same way by every rank (metadata writes are collective).
  void set_attribute(std::string_view name, std::string_view value);  // UTF-8 variable-length string
  void set_attribute(std::string_view name, const char* value) { set_attribute(name, std::string_view(value)); }
  void set_attribute(std::string_view name, double value);
  void set_attribute(std::string_view name, std::int64_t value);
  void set_attribute(std::string_view name, std::uint64_t value);
  void set_attribute(std::string_view name, const std::vector<std::uint64_t>& values);  // 1-D
  std::string string_attribute(std::string_view name) const;  // variable or fixed length strings
  double double_attribute(std::string_view name) const;
  std::int64_t int_attribute(std::string_view name) const;
  std::vector<std::uint64_t> uint64s_attribute(std::string_view name) const;  // 1-D integers (or one)
  std::vector<std::string> attribute_names() const;
  // The attribute rendered as text (strings as they are, numbers in full precision).
  std::string attribute_as_text(std::string_view name) const;

 protected:
  Object() = default;
  Object(Id id, Where where) : id_(std::move(id)), where_(std::move(where)) {}
  Id id_;
  Where where_;

 private:
  Id open_attribute(std::string_view name) const;
  Id replace_attribute(std::string_view name, hid_t type, hid_t space);
};

// A filter in a dataset's pipeline (HDF5's id and its client data).
struct Filter {
  unsigned id = 0;
  std::vector<unsigned> cd_values;
};

// How a dataset is created: its layout, and how HDF5 is to keep it.
struct DatasetCreate {
  Layout layout;
  bool extendible_rows = false;  // axis 0 unlimited (needs a chunked layout)
  bool early_allocation = false; // allocate storage at creation and on every extent change
};

class Dataset : public Object {
 public:
  Dataset() = default;
  Dataset(Id id, Where where, bool parallel) : Object(std::move(id), std::move(where)), parallel_(parallel) {}
  Shape shape() const;
  Shape chunk() const;                  // empty if not chunked
  std::optional<DType> dtype() const;   // nullopt if not a qstage type
  std::string type_description() const;
  std::uint64_t row_bytes() const;      // bytes of one slice along axis 0
  // Reads rows [row0, row0+nrows) into buf (C order). Independent I/O.
  void read_rows(std::uint64_t row0, std::uint64_t nrows, void* buf) const;
  // Writes rows [row0, row0+nrows) from buf. Collective when the file is parallel:
  // every rank must call, nrows == 0 is allowed (an empty selection).
  void write_rows(std::uint64_t row0, std::uint64_t nrows, const void* buf);
  void read_all(void* buf) const;
  void write_all(const void* buf);  // collective when parallel; every rank writes the same data
  void set_rows(std::uint64_t rows);  // extends or shrinks axis 0 (collective)
  // The ids of the dataset's filters, in pipeline order.
  std::vector<unsigned> filter_ids() const;
  // Stores chunk `index` (along axis 0; chunks must hold whole rows) as the given bytes, already
  // filtered, bypassing the pipeline (H5Dwrite_chunk). Serial files only: parallel HDF5 1.10
  // does not coordinate direct chunk writes of several ranks.
  void write_stored_chunk(std::uint64_t index, const void* data, std::uint64_t bytes);
  // Chunk `index` (along axis 0) as it is stored, still filtered (H5Dread_chunk).
  std::vector<std::uint8_t> read_stored_chunk(std::uint64_t index) const;
  bool parallel() const { return parallel_; }  // the file is open with MPI-IO

 private:
  bool parallel_ = false;
  DType memory_dtype() const;
};

enum class Mode { read_only, read_write };

class File : public Object {
 public:
  File() = default;
  // Creates (truncating) a file. comm == MPI_COMM_NULL or a communicator of size 1: serial.
  static File create(const std::filesystem::path& path, MPI_Comm comm = MPI_COMM_NULL);
  static File open(const std::filesystem::path& path, Mode mode, MPI_Comm comm = MPI_COMM_NULL);
  // True if the file exists and is an HDF5 file.
  static bool is_hdf5(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  bool parallel() const { return parallel_; }
  bool exists(std::string_view dataset_path) const;
  // `filters`: mandatory filters, in pipeline order (a chunked layout only).
  Dataset create_dataset(std::string_view name, const DatasetCreate& how, const std::vector<Filter>& filters = {});
  Dataset open_dataset(std::string_view name) const;
  // Every dataset path in the file, depth-first in name order ("/a", "/g/b").
  std::vector<std::string> dataset_paths() const;
  void flush();  // under MPI-IO this also syncs the file (MPI_File_sync)
  void close();  // reports errors that a destructor would hide

 private:
  std::filesystem::path path_;
  bool parallel_ = false;
};

}  // namespace qstage::h5
