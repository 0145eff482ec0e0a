// qstage_bench: the ceilings a streamed step is compared with, measured on the machine at hand
// through the same backend qstage uses, and in-memory peers.
//
//   qstage_bench ceilings --device cuda --m 2048 --n 16384 --k 16384 [--io-dir DIR --io-bytes 4GiB]
//       host<->device copies (each way, both at once, and as 4 MiB transfers), the GEMM rate for an m x k . k x n
//       complex64 product (fp32 and, on cuda, TF32), the device copy rate, and HDF5 write/read rates
//   qstage_bench inmemory-matmul --a FILE:/data --b FILE:/data
//       reads A and B whole and times one threaded OpenBLAS cgemm of the same product
//   qstage_bench codec --data FILE:/data [--device cuda] [--pipelines szx,...] [--bounds 1e-2,1e-3] [--block 256]
//       the codec on a float or complex dataset (complex128 and float64 cast to single precision): per
//       pipeline and bound (t = e, relative to the range), ratio, compress and decompress input GB/s
//       (wall time from device data to a host stream and back, copies and framing included; and
//       on cuda, device_only: the GPU work alone, data and parts in device memory),
//       largest error over the range, and fidelity |<a|b>| / (|a| |b|)
//   qstage_bench looped --steps FILE.json [--device cuda] [--dtype complex64]
//       the looped kernel (kernels/looped_gemm) on each step of FILE.json, a list of
//       {"m": M, "n": N, "k": K, "groups": [[extent, stride_a, stride_b, stride_c], ...]} (outermost
//       group first, strides in elements: the loop groups of a tensor-network step, as
//       tn.plan's steps give them), on random operands: seconds, bytes moved at least (the spans
//       of A, B and C: each read or written once) and that as a fraction of the device copy rate
//       measured in the same run (a copy reads and writes: the rate counts both)
//   qstage_bench sci-generate --fcidump FILE [--sources 100000] [--batch 2000] [--eps 0] [--device cuda|cpu]
//       selected CI's generation kernel (kernels/sci_generate) on random source determinants:
//       candidates, seconds, candidates per second (bench/sci_generate_bench.cpp)
//   qstage_bench dedup --rows N [--words W] [--distinct D] [--device cuda]
//       in-core de-duplication (kernels/sort_unique: one tile of N keys of W words, sorted stably and
//       reduced with counts and value sums) against CUB's plain radix sort of the same N keys' first
//       word (std::sort on cpu), on Zipf-like keys over about D distinct values: items/s of each,
//       data already on the device
//   mpirun -np P qstage_bench alltoall --bytes SIZE [--device cuda] [--repeats 10]
//       the all-to-all that tn.contract's redistributions and gathers use (comm::Communicator on
//       device buffers: NCCL's grouped sends and receives on cuda, MPI on cpu), each rank sending
//       SIZE / P bytes to every rank from one GPU a rank: seconds (median) and GB/s a rank sent to
//       the others (rank 0 prints)
//   qstage_bench pass-overhead [--passes 50] [--rows 4096] [--resident 16MiB] [--slots 3] [--device cuda]
//       what a pass costs beyond its kernel, as a stage of several passes pays it once per pass: a
//       tiny copy pass with resident data, its work directory, output file, commit and pass state,
//       repeated: the median pass and its parts (bench/pass_overhead_bench.cpp)
// Output: one JSON object on stdout. Timings are medians of repeats after a warm-up.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "comm/communicator.hpp"
#include "core/mpi.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/units.hpp"
#include "io/h5.hpp"
#include "kernels/mps/charge_blocks.hpp"
#include "kernels/codec/backend_codec.hpp"
#include "kernels/linalg/dense_linalg.hpp"
#include "kernels/linalg/gemm.hpp"
#include "kernels/linalg/looped_gemm.hpp"
#include "kernels/linalg/reduced_gemm.hpp"
#include "kernels/tensor/random.hpp"
#include "pass_overhead_bench.hpp"
#include "sci_generate_bench.hpp"
#include "kernels/keys/sort_unique.hpp"

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

// cgemm's rate in each compute mode (kernels::Compute; on cpu the reduced modes emulate the
// rounding, so their rates there mean nothing), and on cuda cuBLAS's own complex TF32 path
// (CUBLAS_COMPUTE_32F_FAST_TF32 on complex operands) beside qstage's real-form TF32. Each mode's
// relative 2-norm error against a complex128 product of the same operands comes with it.
// Where the tf32 mode's time goes, for a complex product `g` (C = A B, row-major, untransposed):
// staging A (rounded, as stored) and B (expanded to its 2k x 2n real form) once each, whole, and
// on cuda the real TF32 product of the staged shapes alone (m x 2k by 2k x 2n). Their sum against
// the mode's measured time says whether staging, tiling or the product holds it.
json reduced_split(Backend& be, Stream& s, const kernels::Gemm& g) {
  using kernels::StageOperand;
  const std::int64_t m = g.m, n = g.n, k = g.k;
  const std::size_t a_bytes = static_cast<std::size_t>(m * 2 * k) * 4, b_bytes = static_cast<std::size_t>(2 * k * 2 * n) * 4;
  Buffer staged = be.alloc_device(a_bytes + b_bytes, "bench staged operands");
  float* sa = static_cast<float*>(staged.data());
  float* sb = sa + m * 2 * k;
  const StageOperand a{g.a, true, m, k, g.lda, 1, 0, StageOperand::Layout::plain, StageOperand::Format::tf32, sa, nullptr};
  const StageOperand b{g.b, true, k, n, g.ldb, 1, 0, StageOperand::Layout::expand, StageOperand::Format::tf32, sb, nullptr};
  const double ta = median_seconds([&] {
    kernels::stage_operand(s, a);
    s.synchronize();
  });
  const double tb = median_seconds([&] {
    kernels::stage_operand(s, b);
    s.synchronize();
  });
  // (bytes read and written: A as stored, then staged; B's complex values, then its 4x real form)
  json out = {{"stage_a_seconds", ta}, {"stage_b_seconds", tb},
              {"stage_a_GBps", 2.0 * static_cast<double>(a_bytes) / ta / 1e9},
              {"stage_b_GBps", (static_cast<double>(b_bytes) / 2 + static_cast<double>(b_bytes)) / tb / 1e9}};
  if (be.kind() == BackendKind::cuda) {
    const kernels::Gemm real{h5::DType::float32, m, 2 * n, 2 * k, sa, 2 * k, sb, 2 * n, g.c, 2 * n};
    const double t = median_seconds([&] {
      kernels::detail::gemm_direct(s, real, kernels::detail::Operands::tf32_cores);
      s.synchronize();
    });
    out["real_product_seconds"] = t;
    out["real_product_TFLOPs"] = kernels::gemm_flops(real) / t / 1e12;
  }
  return out;
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
  // The complex128 reference product of the same values.
  std::vector<std::complex<double>> want(static_cast<std::size_t>(m * n));
  {
    std::vector<std::complex<float>> ha(static_cast<std::size_t>(m * k)), hb(static_cast<std::size_t>(k * n));
    be.copy_to_host(ha.data(), a.data(), a_bytes, *s);
    be.copy_to_host(hb.data(), b.data(), b_bytes, *s);
    s->synchronize();
    std::vector<std::complex<double>> da(ha.begin(), ha.end()), db(hb.begin(), hb.end());
    Buffer a2 = be.alloc_device(a_bytes * 2, "bench A complex128"), b2 = be.alloc_device(b_bytes * 2, "bench B complex128"),
           c2 = be.alloc_device(c_bytes * 2, "bench C complex128");
    be.copy_to_device(a2.data(), da.data(), a_bytes * 2, *s);
    be.copy_to_device(b2.data(), db.data(), b_bytes * 2, *s);
    kernels::gemm(*s, kernels::Gemm{h5::DType::complex128, m, n, k, a2.data(), k, b2.data(), n, c2.data(), n});
    be.copy_to_host(want.data(), c2.data(), c_bytes * 2, *s);
    s->synchronize();
  }
  auto error = [&] {
    std::vector<std::complex<float>> got(static_cast<std::size_t>(m * n));
    be.copy_to_host(got.data(), c.data(), c_bytes, *s);
    s->synchronize();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      diff += std::norm(std::complex<double>(got[i]) - want[i]);
      norm += std::norm(want[i]);
    }
    return std::sqrt(diff / norm);
  };
  json out = {{"m", m}, {"n", n}, {"k", k}};
  kernels::Gemm base{h5::DType::complex64, m, n, k, a.data(), k, b.data(), n, c.data(), n};
  std::int64_t staging_bytes = 0;
  for (kernels::Compute mode : {kernels::Compute::tf32x3, kernels::Compute::tf32, kernels::Compute::bf16}) {
    kernels::Gemm g = base;
    g.compute = mode;
    staging_bytes = std::max(staging_bytes, std::min<std::int64_t>(kernels::reduced_gemm_workspace(g), 256ll << 20));
  }
  Buffer staging = be.alloc_device(static_cast<std::size_t>(staging_bytes), "bench staging");
  out["staging_bytes"] = staging_bytes;
  // A mode's rate and error with a workspace, into `into` as <mode>_TFLOPs and <mode>_relative_error.
  auto measure = [&](kernels::Compute mode, void* workspace, std::int64_t workspace_bytes, json& into) {
    kernels::Gemm g = base;
    g.compute = mode;
    g.workspace = workspace;
    g.workspace_bytes = workspace_bytes;
    const double t = median_seconds([&] {
      kernels::gemm(*s, g);
      s->synchronize();
    });
    const std::string name = mode == kernels::Compute::full ? "fp32" : std::string(kernels::compute_name(mode));
    into[name + "_TFLOPs"] = kernels::gemm_flops(g) / t / 1e12;
    into[name + "_relative_error"] = error();
  };
  for (kernels::Compute mode : {kernels::Compute::full, kernels::Compute::tf32, kernels::Compute::tf32x3, kernels::Compute::bf16})
    measure(mode, staging.data(), staging_bytes, out);
  if (be.kind() == BackendKind::cuda) {
    const double t = median_seconds([&] {
      kernels::detail::gemm_direct(*s, base, kernels::detail::Operands::tf32_cores);
      s->synchronize();
    });
    out["cublas_complex_tf32_TFLOPs"] = kernels::gemm_flops(base) / t / 1e12;
    out["cublas_complex_tf32_relative_error"] = error();
  }
  // The reduced modes again with the workspace that stages each operand once, whole (one tile),
  // where the budget holds it: the 256 MiB cap above splits B by columns and stages A again for
  // each column tile, which a contraction's slot with more memory does not.
  json one_tile = json::object();
  std::int64_t whole = 0;
  for (kernels::Compute mode : {kernels::Compute::tf32, kernels::Compute::tf32x3}) {
    kernels::Gemm g = base;
    g.compute = mode;
    whole = std::max(whole, kernels::reduced_gemm_workspace(g));
  }
  staging = Buffer();
  if (static_cast<std::uint64_t>(whole) <= be.device_budget().left()) {
    Buffer all = be.alloc_device(static_cast<std::size_t>(whole), "bench staging, one tile");
    one_tile["staging_bytes"] = whole;
    for (kernels::Compute mode : {kernels::Compute::tf32, kernels::Compute::tf32x3}) measure(mode, all.data(), whole, one_tile);
  } else {
    one_tile["not_run"] = fmt::format("needs {} of device memory, the budget has {} left", whole, be.device_budget().left());
  }
  out["one_tile"] = one_tile;
  out["tf32_split"] = reduced_split(be, *s, base);
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
    h5::Dataset d = f.create_dataset("x", {{h5::DType::uint8, {rows, row}, {1, row}}, false});
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

// A dataset as float32 components (complex: interleaved real, imaginary).
std::vector<float> read_components(const std::string& ref, bool& complex, std::vector<std::uint64_t>& shape) {
  const auto colon = ref.rfind(':');
  h5::File f = h5::File::open(ref.substr(0, colon), h5::Mode::read_only);
  h5::Dataset d = f.open_dataset(ref.substr(colon + 1));
  const auto type = d.dtype();
  if (!type || !(*type == h5::DType::float32 || *type == h5::DType::float64 || h5::dtype_is_complex(*type)))
    throw InputError(fmt::format("{}: expected a float or complex dataset", ref));
  const auto dims = d.shape();
  shape.assign(dims.begin(), dims.end());
  std::uint64_t n = 1;
  for (auto e : shape) n *= e;
  complex = h5::dtype_is_complex(*type);
  std::vector<unsigned char> raw(n * h5::dtype_size(*type));
  d.read_all(raw.data());
  std::vector<float> out(complex ? 2 * n : n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto z = h5::element_as_complex(raw.data(), *type, i);
    if (complex) {
      out[2 * i] = static_cast<float>(z.real());
      out[2 * i + 1] = static_cast<float>(z.imag());
    } else {
      out[i] = static_cast<float>(z.real());
    }
  }
  return out;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  for (size_t at = 0; at <= s.size();) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string part = s.substr(at, comma - at);
    part.erase(0, part.find_first_not_of(' '));
    parts.push_back(part);
    at = comma + 1;
  }
  return parts;
}

int codec_bench(const std::map<std::string, std::string>& a) {
  const std::string device = a.count("device") ? a.at("device") : "auto";
  auto be = make_backend({device, 0, 0, 0});
  auto stream = be->make_stream(false);
  bool complex = false;
  std::vector<std::uint64_t> shape;
  const auto x = read_components(a.at("data"), complex, shape);
  const std::uint64_t bytes = 4 * x.size();
  const auto type = complex ? codec::ElementType::complex64 : codec::ElementType::float32;
  Buffer data = be->alloc_device(bytes, "codec bench: data");
  Buffer decoded = be->alloc_device(bytes, "codec bench: decoded");
  be->copy_to_device(data.data(), x.data(), bytes, *stream);
  stream->synchronize();
  const double range = kernels::codec_value_range(*be, *stream, static_cast<const float*>(data.data()), x.size());
  json out = {{"device", be->description()}, {"data", a.at("data")}, {"shape", shape}, {"complex", complex},
              {"input_bytes", bytes}, {"range", range}, {"results", json::array()}};
  const auto pipelines = split(a.count("pipelines") ? a.at("pipelines") : codec::pipeline_names());
  const auto bounds = split(a.count("bounds") ? a.at("bounds") : "1e-2,5e-3,1e-3");
  const std::uint32_t block = a.count("block") ? static_cast<std::uint32_t>(std::stoul(a.at("block"))) : 256;
  std::vector<float> y(x.size());
  for (const auto& name : pipelines) {
    const auto pipeline = codec::pipeline_from_name(name);
    if (!pipeline) throw InputError(fmt::format("unknown pipeline {}; expected one of {}", name, codec::pipeline_names()));
    for (const auto& bound_text : bounds) {
      const double bound = std::stod(bound_text);
      const codec::Settings s{*pipeline, block, *pipeline == codec::Pipeline::szx ? 0.0 : bound, bound, true};
      std::vector<std::uint8_t> packed;
      const double encode_seconds = median_seconds([&] {
        packed = kernels::codec_encode(*be, *stream, static_cast<const float*>(data.data()), type, shape, s, range);
      }, 5);
      Buffer device_stream = be->alloc_device(packed.size(), "codec bench: stream");
      be->copy_to_device(device_stream.data(), packed.data(), packed.size(), *stream);
      stream->synchronize();
      codec::BlockCounts counts;
      codec::decode(packed.data(), packed.size(), y.data(), y.size(), &counts);  // CPU: block states
      const double decode_seconds = median_seconds([&] {
        kernels::codec_decode(*be, *stream, packed.data(), packed.size(), static_cast<const std::uint8_t*>(device_stream.data()),
                              static_cast<float*>(decoded.data()), x.size());
      }, 5);
      json r_device;
#ifdef QSTAGE_HAVE_CUDA
      if (be->kind() == BackendKind::cuda) {  // the device work alone: data and parts stay on the GPU
        kernels::GpuCodec gpu(*be, *stream);
        const double scale = s.relative ? range : 1.0;
        const codec::detail::Coding coding{s.pipeline, s.block_size, s.threshold * scale, s.error * scale};
        const std::uint64_t n = x.size() / (complex ? 2 : 1);
        const int parts = complex ? 2 : 1;
        const double code_seconds = median_seconds([&] {
          const auto* values = static_cast<const float*>(data.data());
          if (parts == 2 && kernels::GpuCodec::can_code_pair(coding, values)) return gpu.code_pair(values, n, coding);
          for (int part = 0; part < parts; ++part) gpu.code(values + part, n, parts, coding);
        }, 5);
        double decode_device = 0;
        auto timed = [&](const std::vector<codec::detail::StoredComponent>& components, const std::uint8_t* d,
                         std::uint64_t count, const codec::detail::Coding& k, float* o) {
          const auto start = Clock::now();
          gpu.decode_all(components, d, count, k, o);
          decode_device += seconds_since(start);
        };
        std::vector<double> decode_times;
        for (int rep = 0; rep < 6; ++rep) {
          decode_device = 0;
          codec::detail::decode_with(timed, packed.data(), packed.size(), static_cast<const std::uint8_t*>(device_stream.data()),
                                     static_cast<float*>(decoded.data()), x.size());
          if (rep) decode_times.push_back(decode_device);
        }
        std::sort(decode_times.begin(), decode_times.end());
        r_device = {{"compress_GBps", bytes / code_seconds / 1e9},
                    {"decompress_GBps", bytes / decode_times[decode_times.size() / 2] / 1e9}};
      }
#endif
      be->copy_to_host(y.data(), decoded.data(), bytes, *stream);
      stream->synchronize();
      double max_error = 0, dot_re = 0, dot_im = 0, na = 0, nb = 0;
      for (std::uint64_t i = 0; i < x.size(); ++i) max_error = std::max(max_error, std::abs(double(y[i]) - double(x[i])));
      const std::uint64_t step = complex ? 2 : 1;
      for (std::uint64_t i = 0; i < x.size(); i += step) {
        const double ar = x[i], ai = complex ? x[i + 1] : 0, br = y[i], bi = complex ? y[i + 1] : 0;
        dot_re += ar * br + ai * bi;
        dot_im += ar * bi - ai * br;
        na += ar * ar + ai * ai;
        nb += br * br + bi * bi;
      }
      json r = {{"pipeline", name}, {"bound", bound}, {"block", block}, {"compressed_bytes", packed.size()},
                {"ratio", double(bytes) / double(packed.size())}, {"compress_GBps", bytes / encode_seconds / 1e9},
                {"decompress_GBps", bytes / decode_seconds / 1e9}, {"max_error_over_range", max_error / range},
                {"fidelity", std::hypot(dot_re, dot_im) / std::sqrt(na * nb)},
                {"device_only", r_device},
                {"blocks", {{"zero", counts.zero}, {"constant", counts.constant}, {"sparse", counts.sparse},
                            {"dense", counts.dense}, {"raw", counts.raw}, {"quantized", counts.quantized}}}};
      std::cerr << r.dump() << "\n";
      out["results"].push_back(r);
    }
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

// Elements an operand of a looped step spans: one past its largest offset.
std::uint64_t looped_span(const kernels::LoopedGemm& g, std::int64_t rows, const std::int64_t* strides) {
  std::uint64_t last = static_cast<std::uint64_t>(rows * g.k);
  for (int d = 0; d < g.groups; ++d) last += static_cast<std::uint64_t>((g.extent[d] - 1) * strides[d]);
  return last;
}

int looped_bench(const std::map<std::string, std::string>& a) {
  const std::string device = a.count("device") ? a.at("device") : "auto";
  auto be = make_backend({device, 0, 0, 0});
  const std::string dtype_name = a.count("dtype") ? a.at("dtype") : "complex64";
  if (dtype_name != "complex64" && dtype_name != "complex128")
    throw InputError("--dtype: expected complex64 or complex128, got " + dtype_name);
  const auto dtype = dtype_name == "complex64" ? h5::DType::complex64 : h5::DType::complex128;
  const std::size_t element = dtype == h5::DType::complex64 ? 8 : 16;
  const json steps = json::parse(fsutil::read_file(a.at("steps")));
  auto s = be->make_stream();
  // The device copy rate: 1 GiB copied on the device, read + write bytes per second.
  const std::size_t copy_bytes = 1ull << 30;
  double copy_rate = 0;
  {
    Buffer x = be->alloc_device(copy_bytes, "bench copy x"), y = be->alloc_device(copy_bytes, "bench copy y");
    const double t = median_seconds([&] {
      be->copy_on_device(y.data(), x.data(), copy_bytes, *s);
      s->synchronize();
    });
    copy_rate = 2.0 * copy_bytes / t;
  }
  json out = {{"device", be->description()}, {"dtype", dtype_name}, {"copy_GBps", copy_rate / 1e9}, {"steps", json::array()}};
  for (const auto& step : steps) {
    kernels::LoopedGemm g;
    g.dtype = dtype;
    g.m = step.at("m"), g.n = step.at("n"), g.k = step.at("k");
    const auto& groups = step.at("groups");
    if (groups.size() > static_cast<std::size_t>(kernels::kMaxLoopGroups))
      throw InputError(fmt::format("--steps: a step has {} loop groups, at most {}", groups.size(), kernels::kMaxLoopGroups));
    g.groups = static_cast<int>(groups.size());
    for (int d = 0; d < g.groups; ++d) {
      const auto& grp = groups[static_cast<std::size_t>(d)];
      g.extent[d] = grp.at(0), g.stride_a[d] = grp.at(1), g.stride_b[d] = grp.at(2), g.stride_c[d] = grp.at(3);
    }
    const std::uint64_t a_span = looped_span(g, g.m, g.stride_a), b_span = looped_span(g, g.n, g.stride_b);
    std::uint64_t c_span = static_cast<std::uint64_t>(g.m * g.n);
    for (int d = 0; d < g.groups; ++d) c_span += static_cast<std::uint64_t>((g.extent[d] - 1) * g.stride_c[d]);
    Buffer da = be->alloc_device(a_span * element, "bench A"), db = be->alloc_device(b_span * element, "bench B"),
           dc = be->alloc_device(c_span * element, "bench C");
    kernels::random_fill(*s, {dtype, 1, 0, 2 * a_span, da.data()});  // (two components per element)
    kernels::random_fill(*s, {dtype, 2, 0, 2 * b_span, db.data()});
    g.a = da.data(), g.b = db.data(), g.c = dc.data();
    const double t = median_seconds([&] {
      kernels::looped_gemm(*s, g);
      s->synchronize();
    });
    const double bytes = static_cast<double>(a_span + b_span + g.loops() * g.m * g.n) * element;
    out["steps"].push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"loops", g.loops()}, {"seconds", t},
                            {"bytes", bytes}, {"GBps", bytes / t / 1e9}, {"of_copy_rate", bytes / t / copy_rate},
                            {"bound_seconds", bytes / copy_rate}});
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

int alltoall_bench(const std::map<std::string, std::string>& a, const mpi::Comm& world) {
  const std::string device = a.count("device") ? a.at("device") : "auto";
  auto be = make_backend({device, 0, 0, world.local_rank(), false});
  comm::Communicator comm(world, be.get());
  const auto P = static_cast<std::uint64_t>(comm.size());
  const std::uint64_t share = parse_size(a.at("bytes"), "--bytes") / P;
  const int repeats = a.count("repeats") ? std::stoi(a.at("repeats")) : 10;
  Buffer send = be->alloc_device(share * P, "bench: all-to-all send"), recv = be->alloc_device(share * P, "bench: all-to-all receive");
  auto stream = be->make_stream(true);
  const comm::Counts counts(P, share);
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    comm.alltoallv(comm::DeviceSpan<const std::uint8_t>(send.as<const std::uint8_t>(), share * P), counts,
                   comm::DeviceSpan<std::uint8_t>(recv.as<std::uint8_t>(), share * P), counts, *stream);
    stream->synchronize();
    const double t = world.max(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (r > 0) seconds.push_back(t);  // (the first builds NCCL's communicator)
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  if (world.root())
    std::cout << json{{"device", be->description()}, {"ranks", P}, {"bytes_per_rank_to_each", share},
                      {"seconds", median}, {"GBps_sent_per_rank", static_cast<double>(share * (P - 1)) / median / 1e9}}.dump(2)
              << "\n";
  return 0;
}

int dedup_bench(const std::map<std::string, std::string>& a) {
  const std::string device = a.count("device") ? a.at("device") : "auto";
  auto be = make_backend({device, 0, 0, 0});
  const std::uint64_t n = std::stoull(a.at("rows"));
  const auto words = static_cast<std::uint32_t>(a.count("words") ? std::stoul(a.at("words")) : 2);
  const std::uint64_t distinct = a.count("distinct") ? std::stoull(a.at("distinct")) : n / 16 + 1;
  if (words < 1 || words > kernels::kMaxKeyWords) throw InputError("--words: expected 1 to 4");
  std::vector<std::uint64_t> keys(n * words), first(n);
  std::vector<double> values(n);
  for (std::uint64_t i = 0; i < n; ++i) {  // skewed: a power of a uniform draw picks the key
    const double u = static_cast<double>(kernels::splitmix64(i) >> 11) * 0x1.0p-53;
    const std::uint64_t k = static_cast<std::uint64_t>(std::pow(u, 3.0) * static_cast<double>(distinct));
    for (std::uint32_t w = 0; w < words; ++w) keys[i * words + w] = kernels::fmix64(k * 4 + w + 1);
    first[i] = keys[i * words];
    values[i] = u;
  }
  auto s = be->make_stream();
  const kernels::RecordLayout L{words, true, false};
  Buffer dk = be->alloc_device(keys.size() * 8, "bench keys"), dv = be->alloc_device(n * 8, "bench values"),
         df = be->alloc_device(n * 8, "bench first words"), dout = be->alloc_device(n * 8, "bench sorted"),
         rec = be->alloc_device(n * L.cols() * 8, "bench records"), tu = be->alloc_device(8, "bench count"),
         work = be->alloc_device(kernels::tile_unique_scratch_bytes(n, words) + n * 8, "bench scratch");
  be->copy_to_device(dk.data(), keys.data(), keys.size() * 8, *s);
  be->copy_to_device(dv.data(), values.data(), n * 8, *s);
  be->copy_to_device(df.data(), first.data(), n * 8, *s);
  const double sort = median_seconds([&] {
    kernels::sort_keys_plain(*s, df.as<std::uint64_t>(), dout.as<std::uint64_t>(), n, {work.data(), work.size()});
    s->synchronize();
  });
  const kernels::KeyRows in{dk.as<std::uint64_t>(), words, words, dv.as<double>(), false, n};
  const double dedup = median_seconds([&] {
    kernels::tile_unique(*s, {in, L, n, 0, rec.as<std::uint64_t>(), tu.as<std::uint64_t>(), nullptr,
                              {work.data(), work.size()}});
    s->synchronize();
  });
  std::uint64_t unique = 0;
  be->copy_to_host(&unique, tu.data(), 8, *s);
  s->synchronize();
  const json out = {{"device", be->description()}, {"rows", n}, {"words", words}, {"unique", unique},
                    {"plain_sort_first_word_items_per_second", n / sort},
                    {"dedup_items_per_second", n / dedup}, {"dedup_over_plain_sort", sort / dedup}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

// The SVD paths of the charge-block update on one random complex128 matrix a size (square or
// m = aspect n; of rank R with --rank): the host's LAPACK (one thread; and `batch` copies over all
// threads) against cuSOLVER's Jacobi and gesvdp, to place kernels::SvdRouting's defaults.
int svd_bench(const std::map<std::string, std::string>& a) {
  auto be = make_backend({a.count("device") ? a.at("device") : "cuda", 0, 0, 0});
  auto s = be->make_stream(true);
  const double aspect = a.count("aspect") ? std::stod(a.at("aspect")) : 1.0;
  const int batch = a.count("batch") ? std::stoi(a.at("batch")) : 16;
  const std::int64_t rank = a.count("rank") ? std::stoll(a.at("rank")) : 0;
  const std::int64_t host_max = a.count("host-max") ? std::stoll(a.at("host-max")) : 2048;
  json out = {{"device", be->description()}, {"omp_threads", omp_get_max_threads()}, {"aspect", aspect}, {"rank", rank}, {"sizes", json::array()}};
  std::stringstream list(a.count("sizes") ? a.at("sizes") : "16,32,48,64,96,128,256,512,1024");
  for (std::string item; std::getline(list, item, ',');) {
    const std::int64_t n = std::stoll(item), m = std::max<std::int64_t>(1, std::llround(aspect * n)), r = std::min(m, n);
    std::vector<kernels::SvdProblem> one{{m, n, 0, 0, 0}}, many;
    for (int i = 0; i < batch; ++i) many.push_back({m, n, i * m * n, i * r, i * r * n});
    Buffer da = be->alloc_device(m * n * 16, "bench A"), ds = be->alloc_device(r * 8, "bench S"),
           dv = be->alloc_device(r * n * 16, "bench Vh");
    kernels::random_fill(*s, {DType::complex128, 3, 0, 2 * m * n, da.data()});
    std::vector<kernels::cplx128> host(m * n * (n <= host_max ? batch : 1)), vh(r * n * (n <= host_max ? batch : 1));
    std::vector<double> hs(r * batch);
    be->copy_to_host(host.data(), da.data(), m * n * 16, *s);
    s->synchronize();
    if (rank > 0 && (m + n) * rank <= m * n) {
      // A = X Y of rank `rank` from the random values (Theta's blocks are often rank deficient)
      std::vector<kernels::cplx128> x(host.begin(), host.begin() + m * rank), y(host.begin() + m * rank, host.begin() + m * rank + rank * n);
      kernels::matmul(x.data(), y.data(), host.data(), m, rank, n);
      be->copy_to_device(da.data(), host.data(), m * n * 16, *s);
      s->synchronize();
    }
    if (n <= host_max)
      for (int i = 1; i < batch; ++i) std::copy_n(host.begin(), m * n, host.begin() + i * m * n);
    const int reps = n >= 1024 ? 1 : 3;
    // Above --host-max the host is not timed (one zgesdd of 4096^2 takes minutes on one core) and
    // the GPU paths' singular values are compared with Jacobi's.
    const bool on_host = n <= host_max;
    json row = {{"m", m}, {"n", n}};
    double host_one = 0;
    if (on_host) {
      host_one = median_seconds([&] { kernels::detail::svd_on_host(host.data(), one, hs.data(), vh.data()); }, reps);
      const double host_batch = median_seconds([&] { kernels::detail::svd_on_host(host.data(), many, hs.data(), vh.data()); }, reps);
      row["host_one_thread_seconds"] = host_one, row["host_batch_seconds_each"] = host_batch / batch;
    }
    if (be->kind() == BackendKind::cuda) {
      // Each GPU path on its own (gpu_from 0), timed, and its singular values against the host's.
      for (const auto& [name, routing] : {std::pair<std::string, kernels::SvdRouting>{"jacobi", {0, std::int64_t(1) << 40}},
                                          std::pair<std::string, kernels::SvdRouting>{"polar", {0, 1}}}) {
        const std::size_t bytes = kernels::svd_workspace_bytes(*s, one, routing);
        Buffer w = be->alloc_device(std::max<std::size_t>(bytes, 1), "bench SVD workspace");
        Buffer work_a = be->alloc_device(m * n * 16, "bench A copy");
        kernels::SvdReport rep;
        const double t = median_seconds([&] {
          be->copy_on_device(work_a.data(), da.data(), m * n * 16, *s);
          rep = kernels::batched_svd(*s, work_a.as<kernels::cplx128>(), one, ds.as<double>(), dv.as<kernels::cplx128>(), w.data(), bytes, routing);
          s->synchronize();
        }, reps);
        std::vector<double> gs(r);
        be->copy_to_host(gs.data(), ds.data(), r * 8, *s);
        s->synchronize();
        if (!on_host && name == "jacobi") hs.assign(gs.begin(), gs.end());  // the reference above host_max
        double err = 0;
        for (std::int64_t q = 0; q < r; ++q) err = std::max(err, std::abs(gs[q] - hs[q]));
        row[name + "_seconds"] = t;
        row[name + "_solved_on_gpu"] = (name == "jacobi" ? rep.jacobi : rep.polar) == 1;
        row[name + "_max_s_error_over_s0"] = err / hs[0];
        row[name + "_s_reference"] = on_host ? "host zgesdd" : "jacobi";
        if (on_host) row["host_one_over_" + name] = host_one / t;
        if (name == "polar") row["polar_shift"] = rep.polar_shift;
      }
    }
    out["sizes"].push_back(row);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: qstage_bench ceilings --m M --n N --k K [--device cuda|cpu] [--io-dir DIR --io-bytes SIZE]\n"
                 "       qstage_bench inmemory-matmul --a FILE:/dataset --b FILE:/dataset\n"
                 "       qstage_bench codec --data FILE:/dataset [--device cuda] [--pipelines szx,group] [--bounds 1e-3]\n"
                 "       qstage_bench looped --steps FILE.json [--device cuda] [--dtype complex64]\n"
                 "       qstage_bench sci-generate --fcidump FILE [--sources N] [--batch N] [--eps E] [--device cuda]\n"
                 "       qstage_bench dedup --rows N [--words W] [--distinct D] [--device cuda]\n"
                 "       qstage_bench svd [--sizes 16,32,...] [--aspect 1] [--rank R] [--host-max 2048] [--batch 16] [--device cuda]\n"
                 "       qstage_bench pass-overhead [--passes 50] [--rows 4096] [--resident 16MiB] [--device cuda]\n"
                 "       mpirun -np P qstage_bench alltoall --bytes SIZE [--device cuda] [--repeats 10]\n";
    return 2;
  }
  try {
    h5::quiet_errors();
    const std::string cmd = argv[1];
    auto args = parse_args(argc, argv, 2);
    if (cmd == "ceilings") return ceilings(args);
    if (cmd == "inmemory-matmul") return inmemory_matmul(args);
    if (cmd == "codec") return codec_bench(args);
    if (cmd == "looped") return looped_bench(args);
    if (cmd == "sci-generate") {
      std::cout << bench::sci_generate_bench(args).dump(2) << "\n";
      return 0;
    }
    if (cmd == "dedup") return dedup_bench(args);
    if (cmd == "svd") return svd_bench(args);
    if (cmd == "pass-overhead") {
      mpi::Session session(&argc, &argv);
      std::cout << bench::pass_overhead_bench(args, mpi::Comm()).dump(2) << "\n";
      return 0;
    }
    if (cmd == "alltoall") {
      mpi::Session session(&argc, &argv);
      return alltoall_bench(args, mpi::Comm());
    }
    std::cerr << "unknown command " << cmd << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "qstage_bench: " << e.what() << "\n";
    return 1;
  }
}
