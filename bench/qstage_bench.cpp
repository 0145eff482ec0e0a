// qstage_bench: the ceilings a streamed step is compared with, measured on the machine at hand
// through the same backend qstage uses, and in-memory peers.
//
//   qstage_bench ceilings --device cuda --m 2048 --n 16384 --k 16384 [--io-dir DIR --io-bytes 4GiB]
//       host<->device copies (each way, both at once, and as 4 MiB transfers), the GEMM rate for an m x k . k x n
//       complex64 product (fp32 and, on cuda, TF32), the device copy rate, and HDF5 write/read rates
//   qstage_bench inmemory-matmul --a FILE:/data --b FILE:/data
//       reads A and B whole and times one threaded OpenBLAS cgemm of the same product
// Output: one JSON object on stdout. Timings are medians of repeats after a warm-up.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <complex>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "kernels/gemm.hpp"
#include "kernels/random.hpp"

using namespace qstage;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::map<std::string, std::string> parse_args(int argc, char** argv, int first) {
  std::map<std::string, std::string> a;
  for (int i = first; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw InputError("expected --option value pairs, got " + key);
    a[key.substr(2)] = argv[i + 1];
  }
  return a;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Median wall time of `body` (which must finish its device work itself), after one warm-up.
template <typename F>
double median_seconds(F&& body, int repeats = 7) {
  body();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    body();
    t.push_back(seconds_since(start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

json copy_rates(Backend& be, std::size_t bytes) {
  Buffer host_a = be.alloc_host(bytes, "bench host a"), host_b = be.alloc_host(bytes, "bench host b");
  Buffer dev_a = be.alloc_device(bytes, "bench dev a"), dev_b = be.alloc_device(bytes, "bench dev b");
  std::memset(host_a.data(), 1, bytes);
  std::memset(host_b.data(), 2, bytes);
  auto s1 = be.make_stream(), s2 = be.make_stream();
  const double h2d = median_seconds([&] {
    be.copy_to_device(dev_a.data(), host_a.data(), bytes, *s1);
    s1->synchronize();
  });
  const double d2h = median_seconds([&] {
    be.copy_to_host(host_b.data(), dev_b.data(), bytes, *s1);
    s1->synchronize();
  });
  // Both directions at once on two streams (separate copy engines on a GPU).
  const double duplex = median_seconds([&] {
    be.copy_to_device(dev_a.data(), host_a.data(), bytes, *s1);
    be.copy_to_host(host_b.data(), dev_b.data(), bytes, *s2);
    s1->synchronize();
    s2->synchronize();
  });
  // The same bytes as 4 MiB transfers in a row (out-of-core blocks are copied like this): what a
  // transfer costs beyond its bytes.
  constexpr std::size_t kChunk = 4u << 20;
  const double chunked = median_seconds([&] {
    for (std::size_t at = 0; at + kChunk <= bytes; at += kChunk)
      be.copy_to_device(static_cast<char*>(dev_a.data()) + at, static_cast<char*>(host_a.data()) + at, kChunk, *s1);
    s1->synchronize();
  });
  return {{"bytes", bytes},
          {"h2d_GBps", bytes / h2d / 1e9},
          {"h2d_4MiB_transfers_GBps", static_cast<double>(bytes / kChunk * kChunk) / chunked / 1e9},
          {"d2h_GBps", bytes / d2h / 1e9},
          {"duplex_each_way_GBps", bytes / duplex / 1e9}};
}

json gemm_rate(Backend& be, std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::size_t a_bytes = m * k * 8, b_bytes = k * n * 8, c_bytes = m * n * 8;
  Buffer a = be.alloc_device(a_bytes, "bench A"), b = be.alloc_device(b_bytes, "bench B"),
         c = be.alloc_device(c_bytes, "bench C");
  auto s = be.make_stream(/*with_blas=*/true);
  // Random operands (not zeros: zeros run faster than real data on some GPUs).
  kernels::random_fill(*s, {h5::DType::complex64, 1, 0, static_cast<std::uint64_t>(2 * m * k), a.data()});
  kernels::random_fill(*s, {h5::DType::complex64, 2, 0, static_cast<std::uint64_t>(2 * k * n), b.data()});
  s->synchronize();
  json out = {{"m", m}, {"n", n}, {"k", k}};
  for (bool tf32 : {false, true}) {
    if (tf32 && be.kind() != BackendKind::cuda) break;
    kernels::Gemm g{h5::DType::complex64, m, n, k, a.data(), k, b.data(), n, c.data(), n, tf32};
    const double t = median_seconds([&] {
      kernels::gemm(*s, g);
      s->synchronize();
    });
    out[tf32 ? "tf32_TFLOPs" : "fp32_TFLOPs"] = kernels::gemm_flops(g) / t / 1e12;
  }
  return out;
}

json hdf5_rates(const std::filesystem::path& dir, std::uint64_t bytes) {
  std::filesystem::create_directories(dir);
  const auto path = dir / "qstage_bench_io.h5";
  const std::uint64_t row = 8 << 20;  // rows of 8 MiB, chunks of one row
  const std::uint64_t rows = std::max<std::uint64_t>(1, bytes / row);
  std::vector<char> buf(row * 16);  // 128 MiB per call, like a large batch
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 31);
  auto start = Clock::now();
  {
    h5::File f = h5::File::create(path);
    h5::Dataset d = f.create_dataset("x", {h5::DType::uint8, {rows, row}, {1, row}, false});
    for (std::uint64_t r = 0; r < rows; r += 16) d.write_rows(r, std::min<std::uint64_t>(16, rows - r), buf.data());
    f.close();
  }
  const double write = seconds_since(start);
  start = Clock::now();
  {
    h5::File f = h5::File::open(path, h5::Mode::read_only);
    h5::Dataset d = f.open_dataset("x");
    for (std::uint64_t r = 0; r < rows; r += 16) d.read_rows(r, std::min<std::uint64_t>(16, rows - r), buf.data());
  }
  const double read = seconds_since(start);
  std::filesystem::remove(path);
  return {{"dir", dir.string()}, {"bytes", rows * row}, {"write_GBps", rows * row / write / 1e9},
          {"read_GBps", rows * row / read / 1e9}, {"note", "one thread; reads likely from the page cache"}};
}

int ceilings(const std::map<std::string, std::string>& a) {
  const std::string device = a.count("device") ? a.at("device") : "auto";
  auto be = make_backend({device, parse_size(a.count("device-memory") ? a.at("device-memory") : "0", "--device-memory"),
                          0, 0});
  const std::int64_t m = std::stoll(a.at("m")), n = std::stoll(a.at("n")), k = std::stoll(a.at("k"));
  json out = {{"device", be->description()}, {"backend", std::string(backend_name(be->kind()))}};
  out["copies"] = copy_rates(*be, 1ull << 30);
  out["gemm_complex64"] = gemm_rate(*be, m, n, k);
  if (a.count("io-dir"))
    out["hdf5"] = hdf5_rates(a.at("io-dir"), parse_size(a.count("io-bytes") ? a.at("io-bytes") : "2GiB", "--io-bytes"));
  std::cout << out.dump(2) << "\n";
  return 0;
}

std::vector<std::complex<float>> read_matrix(const std::string& ref, std::int64_t& rows, std::int64_t& cols) {
  const auto colon = ref.rfind(':');
  h5::File f = h5::File::open(ref.substr(0, colon), h5::Mode::read_only);
  h5::Dataset d = f.open_dataset(ref.substr(colon + 1));
  const auto shape = d.shape();
  rows = static_cast<std::int64_t>(shape[0]);
  cols = static_cast<std::int64_t>(shape[1]);
  std::vector<std::complex<float>> v(static_cast<std::size_t>(rows * cols));
  d.read_all(v.data());
  return v;
}

int inmemory_matmul(const std::map<std::string, std::string>& a) {
  std::int64_t m, k, k2, n;
  auto start = Clock::now();
  auto A = read_matrix(a.at("a"), m, k);
  auto B = read_matrix(a.at("b"), k2, n);
  const double read = seconds_since(start);
  std::vector<std::complex<float>> C(static_cast<std::size_t>(m * n));
  openblas_set_num_threads(omp_get_max_threads());
  const std::complex<float> one(1), zero(0);
  start = Clock::now();
  cblas_cgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, &one, A.data(), k, B.data(), n, &zero, C.data(), n);
  const double t = seconds_since(start);
  json out = {{"m", m}, {"n", n}, {"k", k}, {"threads", omp_get_max_threads()}, {"read_seconds", read},
              {"gemm_seconds", t}, {"GFLOPs", 8.0 * m * n * k / t / 1e9}, {"openblas", openblas_get_config()}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: qstage_bench ceilings --m M --n N --k K [--device cuda|cpu] [--io-dir DIR --io-bytes SIZE]\n"
                 "       qstage_bench inmemory-matmul --a FILE:/dataset --b FILE:/dataset\n";
    return 2;
  }
  try {
    h5::quiet_errors();
    const std::string cmd = argv[1];
    auto args = parse_args(argc, argv, 2);
    if (cmd == "ceilings") return ceilings(args);
    if (cmd == "inmemory-matmul") return inmemory_matmul(args);
    std::cerr << "unknown command " << cmd << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "qstage_bench: " << e.what() << "\n";
    return 1;
  }
}
