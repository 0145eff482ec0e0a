// The HDF5 layer: round trips, h5py-compatible complex types, attributes, and errors that name
// the file, the object and the operation.
#include <gtest/gtest.h>

#include <complex>

#include "io/h5.hpp"
#include "io/h5_describe.hpp"
#include "test_util.hpp"

using namespace qstage;

TEST(H5, RowsRoundTripAndExtend) {
  test::TempDir dir;
  const auto path = dir.path / "a.h5";
  std::vector<std::complex<float>> data(100 * 3);
  for (size_t i = 0; i < data.size(); ++i) data[i] = {float(i), -float(i)};
  {
    h5::File f = h5::File::create(path);
    h5::Dataset d = f.create_dataset("/group/z", {h5::DType::complex64, {0, 3}, {16, 3}, true});
    d.set_rows(60);
    d.write_rows(0, 60, data.data());
    d.set_rows(100);
    d.write_rows(60, 40, data.data() + 60 * 3);
    f.close();
  }
  h5::File f = h5::File::open(path, h5::Mode::read_only);
  EXPECT_TRUE(f.exists("/group/z"));
  EXPECT_FALSE(f.exists("/group/missing"));
  EXPECT_FALSE(f.exists("/nogroup/z"));
  h5::Dataset d = f.open_dataset("/group/z");
  EXPECT_EQ(d.shape(), (h5::Shape{100, 3}));
  EXPECT_EQ(d.chunk(), (h5::Shape{16, 3}));
  EXPECT_EQ(*d.dtype(), h5::DType::complex64);
  EXPECT_EQ(d.row_bytes(), 24u);
  std::vector<std::complex<float>> back(40 * 3);
  d.read_rows(50, 40, back.data());
  EXPECT_EQ(back[0], data[150]);
  EXPECT_EQ(f.dataset_paths(), std::vector<std::string>{"/group/z"});
}

TEST(H5, ComplexWithOtherMemberNamesIsRecognisedAndReadable) {
  // Other tools name the parts "real"/"imag"; qstage reads by layout, not by name.
  test::TempDir dir;
  const auto path = dir.path / "b.h5";
  {
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t type = H5Tcreate(H5T_COMPOUND, 16);
    H5Tinsert(type, "real", 0, H5T_IEEE_F64LE);
    H5Tinsert(type, "imag", 8, H5T_IEEE_F64LE);
    hsize_t dims[1] = {4};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t d = H5Dcreate2(file, "z", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::complex<double> v[4] = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(d);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(file);
  }
  h5::File f = h5::File::open(path, h5::Mode::read_only);
  h5::Dataset d = f.open_dataset("z");
  EXPECT_EQ(*d.dtype(), h5::DType::complex128);
  std::complex<double> back[2];
  d.read_rows(2, 2, back);
  EXPECT_EQ(back[0], std::complex<double>(5, 6));
  EXPECT_EQ(back[1], std::complex<double>(7, 8));
}

TEST(H5, AttributesOfEveryKind) {
  test::TempDir dir;
  h5::File f = h5::File::create(dir.path / "c.h5");
  f.set_attribute("text", "héllo");
  f.set_attribute("pi", 3.25);
  f.set_attribute("count", std::int64_t{-7});
  f.set_attribute("big", std::uint64_t{1} << 63);
  f.set_attribute("text", "replaced");
  EXPECT_EQ(f.string_attribute("text"), "replaced");
  EXPECT_EQ(f.double_attribute("pi"), 3.25);
  EXPECT_EQ(f.int_attribute("count"), -7);
  EXPECT_EQ(f.attribute_as_text("big"), "9223372036854775808");
  EXPECT_TRUE(f.has_attribute("pi"));
  EXPECT_FALSE(f.has_attribute("nope"));
  h5::Dataset s = f.create_dataset("scalar", {h5::DType::float64, {}, {}, false});
  const double v = 2.5;
  s.write_all(&v);
  double back = 0;
  s.read_all(&back);
  EXPECT_EQ(back, 2.5);
  f.close();
  auto described = h5::describe_file(dir.path / "c.h5");
  EXPECT_EQ(described["attributes"]["count"], -7);
  EXPECT_EQ(described["attributes"]["text"], "replaced");
  EXPECT_EQ(described["datasets"][0]["path"], "/scalar");
}

TEST(H5, ErrorsNameFileObjectAndOperation) {
  test::TempDir dir;
  const auto path = dir.path / "d.h5";
  h5::File::create(path).close();
  h5::File f = h5::File::open(path, h5::Mode::read_only);
  try {
    f.open_dataset("/missing");
    FAIL();
  } catch (const h5::Error& e) {
    EXPECT_EQ(e.file(), path.string());
    EXPECT_EQ(e.object(), "/missing");
    EXPECT_EQ(e.operation(), "open dataset");
  }
  try {
    h5::File::open(dir.path / "absent.h5", h5::Mode::read_only);
    FAIL();
  } catch (const h5::Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.h5"), std::string::npos);
    EXPECT_EQ(e.operation(), "open file");
  }
  EXPECT_FALSE(h5::File::is_hdf5(dir.path / "absent.h5"));
  test::write_text(dir.path / "text.h5", "not hdf5");
  EXPECT_FALSE(h5::File::is_hdf5(dir.path / "text.h5"));
}

TEST(H5, ReadsOutsideTheDatasetAreRefused) {
  test::TempDir dir;
  h5::File f = h5::File::create(dir.path / "e.h5");
  h5::Dataset d = f.create_dataset("x", {h5::DType::float32, {10}, {}, false});
  std::vector<float> buf(20);
  EXPECT_THROW(d.read_rows(5, 10, buf.data()), h5::Error);
  EXPECT_THROW(d.write_rows(8, 4, buf.data()), h5::Error);
}
