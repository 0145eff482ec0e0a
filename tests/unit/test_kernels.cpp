// Every kernel's CPU twin against a plain reference, and (on a machine with a GPU) the CUDA
// kernel against the CPU twin on the same inputs. Tolerances:
//   random, checksum, stats' counts/min/max/qsum: bitwise equal on both backends
//   stats' sum_sq: 1e-12 relative between backends (summation order differs)
//   gemm: 1e-5 relative (complex64/float32) and 1e-12 (complex128/float64) against a float64
//   reference; TF32: 5e-3
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include <omp.h>

#include "backend/backend.hpp"
#include "kernels/checksum.hpp"
#include "kernels/linalg/gemm.hpp"
#include "kernels/linalg/looped_gemm.hpp"
#include "kernels/linalg/permute.hpp"
#include "kernels/linalg/reduced_gemm.hpp"
#include "kernels/tensor/random.hpp"
#include "kernels/tensor/stats.hpp"
#include "test_util.hpp"

using namespace qstage;
using kernels::StatsPartial;
using test::GpuRun;

namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------ random
TEST(RandomKernel, CpuMatchesTheDocumentedFormula) {
  const std::uint64_t seed = 42, first = 1000, n = 4097;
  std::vector<float> f(n);
  kernels::random_fill_cpu({DType::complex64, seed, first, n, f.data()});
  std::vector<double> d(n);
  kernels::random_fill_cpu({DType::float64, seed, first, n, d.data()});
  const std::uint64_t key = kernels::splitmix64(seed);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t bits = kernels::splitmix64(key + (first + i + 1) * kernels::kGolden);
    ASSERT_EQ(f[i], static_cast<float>(bits >> 40) / 8388608.0f - 1.0f);
    ASSERT_EQ(d[i], static_cast<double>(bits >> 11) / 4503599627370496.0 - 1.0);
    ASSERT_GE(f[i], -1.0f);
    ASSERT_LT(f[i], 1.0f);
  }
}

TEST(RandomKernel, SplitsDoNotChangeValues) {
  std::vector<float> whole(1000), parts(1000);
  kernels::random_fill_cpu({DType::float32, 9, 0, 1000, whole.data()});
  kernels::random_fill_cpu({DType::float32, 9, 0, 333, parts.data()});
  kernels::random_fill_cpu({DType::float32, 9, 333, 667, parts.data() + 333});
  EXPECT_EQ(whole, parts);
}

TEST(RandomKernel, GpuMatchesCpuBitwise) {
  REQUIRE_GPU();
  GpuRun gpu;
  for (auto dtype : {DType::complex64, DType::float64}) {
    const std::uint64_t n = 1 << 20, size = dtype_size(dtype) / (dtype_is_complex(dtype) ? 2 : 1);
    std::vector<char> cpu(n * size);
    kernels::random_fill_cpu({dtype, 123, 77, n, cpu.data()});
    Buffer out = gpu.backend->alloc_device(n * size, "test");
    kernels::random_fill(*gpu.stream, {dtype, 123, 77, n, out.data()});
    auto got = gpu.download<char>(out, n * size);
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size()), 0) << dtype_name(dtype);
  }
}

// ------------------------------------------------------------------------------ checksum
TEST(ChecksumKernel, CpuMatchesDefinitionAndIsSplitInvariant) {
  auto v = random_floats(10001, 1);
  std::uint64_t reference = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t w;
    std::memcpy(&w, &v[i], 4);
    reference += kernels::fmix64(w ^ ((i + 1) * kernels::kGolden));
  }
  std::uint64_t whole = 0, a = 0, b = 0;
  kernels::checksum_cpu({v.data(), v.size() * 4, 4, 0, &whole});
  kernels::checksum_cpu({v.data(), 4000 * 4, 4, 0, &a});
  kernels::checksum_cpu({v.data() + 4000, (v.size() - 4000) * 4, 4, 4000, &b});
  EXPECT_EQ(whole, reference);
  EXPECT_EQ(a + b, whole);
  // One flipped bit changes it; swapping two words changes it.
  auto w = v;
  std::uint32_t bits;
  std::memcpy(&bits, &w[5], 4);
  bits ^= 1;
  std::memcpy(&w[5], &bits, 4);
  std::uint64_t flipped = 0;
  kernels::checksum_cpu({w.data(), w.size() * 4, 4, 0, &flipped});
  EXPECT_NE(flipped, whole);
  auto s = v;
  std::swap(s[1], s[2]);
  std::uint64_t swapped = 0;
  kernels::checksum_cpu({s.data(), s.size() * 4, 4, 0, &swapped});
  EXPECT_NE(swapped, whole);
}

TEST(ChecksumKernel, GpuMatchesCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  auto v = random_floats((1 << 22) + 3, 2);
  std::uint64_t cpu = 0;
  kernels::checksum_cpu({v.data(), v.size() * 4, 4, 12345, &cpu});
  Buffer in = gpu.upload(v.data(), v.size() * 4);
  Buffer out = gpu.backend->alloc_device(8, "test");
  kernels::checksum(*gpu.stream, {in.data(), v.size() * 4, 4, 12345, out.as<std::uint64_t>()});
  EXPECT_EQ(gpu.download<std::uint64_t>(out, 1)[0], cpu);
}

// ------------------------------------------------------------------------------ stats
namespace {

StatsPartial naive_stats(const std::vector<float>& v, bool complex, std::uint64_t first_word) {
  StatsPartial p;
  const std::size_t step = complex ? 2 : 1;
  bool any = false;
  for (std::size_t i = 0; i < v.size(); i += step) {
    const double re = v[i], im = complex ? v[i + 1] : 0.0;
    p.count++;
    if (!std::isfinite(re) || !std::isfinite(im)) {
      p.nonfinite++;
    } else {
      p.sum_sq += re * re + im * im;
      for (double c : complex ? std::vector<double>{re, im} : std::vector<double>{re}) {
        p.min = any ? std::min(p.min, c) : c;
        p.max = any ? std::max(p.max, c) : c;
        any = true;
      }
      p.max_abs = std::max(p.max_abs, std::sqrt(re * re + im * im));
    }
  }
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t w;
    std::memcpy(&w, &v[i], 4);
    p.qsum += kernels::qsum_term(w, first_word + i);
  }
  return p;
}

StatsPartial fold_all(const std::vector<StatsPartial>& tiles) {
  StatsPartial acc;
  for (const auto& t : tiles) kernels::fold(acc, t);
  return acc;
}

}  // namespace

TEST(StatsKernel, CpuMatchesNaiveIncludingNonFinite) {
  auto v = random_floats(2 * 5000, 3);
  v[10] = std::numeric_limits<float>::quiet_NaN();
  v[21] = std::numeric_limits<float>::infinity();
  v[777] = 7.5f;
  const std::uint64_t tile = 512, elements = v.size() / 2;
  std::vector<StatsPartial> tiles((elements + tile - 1) / tile);
  kernels::Stats s{DType::complex64, v.data(), elements, tile, 100, tiles.data()};
  kernels::stats_cpu(s);
  const StatsPartial got = fold_all(tiles), want = naive_stats(v, true, 100);
  EXPECT_NEAR(got.sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
  EXPECT_EQ(got.min, want.min);
  EXPECT_EQ(got.max, 7.5);
  EXPECT_EQ(got.max_abs, want.max_abs);
  EXPECT_EQ(got.nonfinite, 2u);
  EXPECT_EQ(got.count, elements);
  EXPECT_EQ(got.qsum, want.qsum);
}

TEST(StatsKernel, AllNonFiniteLeavesMinMaxUndefined) {
  std::vector<float> v(8, std::numeric_limits<float>::quiet_NaN());
  StatsPartial tile;
  kernels::stats_cpu({DType::float32, v.data(), 8, 8, 0, &tile});
  EXPECT_EQ(tile.finite_components, 0u);
  EXPECT_EQ(tile.nonfinite, 8u);
}

TEST(StatsKernel, GpuMatchesCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  auto v = random_floats(2 * 300000, 4);
  v[5] = std::numeric_limits<float>::quiet_NaN();
  const std::uint64_t tile = 4096, elements = v.size() / 2, tiles = (elements + tile - 1) / tile;
  std::vector<StatsPartial> cpu(tiles);
  kernels::stats_cpu({DType::complex64, v.data(), elements, tile, 9, cpu.data()});
  Buffer in = gpu.upload(v.data(), v.size() * 4);
  Buffer out = gpu.backend->alloc_device(tiles * sizeof(StatsPartial), "test");
  kernels::stats(*gpu.stream, {DType::complex64, in.data(), elements, tile, 9, out.as<StatsPartial>()});
  auto got = gpu.download<StatsPartial>(out, tiles);
  for (std::uint64_t t = 0; t < tiles; ++t) {
    EXPECT_NEAR(got[t].sum_sq, cpu[t].sum_sq, 1e-12 * cpu[t].sum_sq) << "tile " << t;
    EXPECT_EQ(got[t].min, cpu[t].min);
    EXPECT_EQ(got[t].max, cpu[t].max);
    EXPECT_EQ(got[t].max_abs, cpu[t].max_abs);
    EXPECT_EQ(got[t].nonfinite, cpu[t].nonfinite);
    EXPECT_EQ(got[t].count, cpu[t].count);
    EXPECT_EQ(got[t].qsum, cpu[t].qsum);
  }
}

// ------------------------------------------------------------------------------ gemm
namespace {

using cd = std::complex<double>;

// Row-major reference in float64 / complex128.
std::vector<cd> reference_gemm(const std::vector<std::complex<float>>& a, const std::vector<std::complex<float>>& b,
                               std::int64_t m, std::int64_t n, std::int64_t k) {
  std::vector<cd> c(static_cast<size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] += cd(a[i * k + p]) * cd(b[p * n + j]);
  return c;
}

template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<cd>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += std::norm(cd(got[i]) - want[i]);
    den += std::norm(want[i]);
  }
  return std::sqrt(num / den);
}

std::vector<std::complex<float>> random_complex(std::size_t n, unsigned seed) {
  auto f = random_floats(2 * n, seed);
  std::vector<std::complex<float>> v(n);
  std::memcpy(v.data(), f.data(), f.size() * 4);
  return v;
}

}  // namespace

TEST(GemmKernel, CpuComplexMatchesReference) {
  const std::int64_t m = 37, n = 19, k = 23;
  auto a = random_complex(m * k, 5), b = random_complex(k * n, 6);
  std::vector<std::complex<float>> c(m * n);
  kernels::Gemm g{DType::complex64, m, n, k, a.data(), k, b.data(), n, c.data(), n};
  kernels::gemm_cpu(g);
  EXPECT_LT(relative_error(c, reference_gemm(a, b, m, n, k)), 1e-5);
  EXPECT_EQ(kernels::gemm_flops(g), 8.0 * m * n * k);
}

TEST(GemmKernel, CpuDoubleComplexMatchesReference) {
  const std::int64_t m = 16, n = 9, k = 31;
  auto a32 = random_complex(m * k, 7), b32 = random_complex(k * n, 8);
  std::vector<cd> a(a32.begin(), a32.end()), b(b32.begin(), b32.end()), c(m * n);
  kernels::gemm_cpu({DType::complex128, m, n, k, a.data(), k, b.data(), n, c.data(), n});
  EXPECT_LT(relative_error(c, reference_gemm(a32, b32, m, n, k)), 1e-12);
}

TEST(GemmKernel, CpuRealMatchesReference) {
  const std::int64_t m = 13, n = 11, k = 17;
  auto a = random_floats(m * k, 9), b = random_floats(k * n, 10);
  std::vector<float> c(m * n);
  kernels::gemm_cpu({DType::float32, m, n, k, a.data(), k, b.data(), n, c.data(), n});
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::int64_t p = 0; p < k; ++p) want += double(a[i * k + p]) * b[p * n + j];
      EXPECT_NEAR(c[i * n + j], want, 1e-5);
    }
}

// gemm_cpu spreads its row and column blocks over the threads where it can and runs the same
// blocks in turn where it cannot (one thread, or inside a parallel region): the same bits.
TEST(GemmKernel, CpuBitsDoNotDependOnWhetherTheBlocksAreSpread) {
  const std::int64_t m = 600, n = 1100, k = 40;  // 3 x 2 blocks, above the parallel threshold
  auto a32 = random_complex(m * k, 11), b32 = random_complex(k * n, 12);
  std::vector<cd> a(a32.begin(), a32.end()), b(b32.begin(), b32.end());
  auto run = [&] {
    std::vector<cd> c(static_cast<std::size_t>(m * n));
    kernels::gemm_cpu({DType::complex128, m, n, k, a.data(), k, b.data(), n, c.data(), n});
    return c;
  };
  const std::vector<cd> spread = run();
  EXPECT_LT(relative_error(spread, reference_gemm(a32, b32, m, n, k)), 1e-12);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<cd> one_thread = run();
  omp_set_num_threads(threads);
  std::vector<cd> nested;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    nested = run();
  }
  EXPECT_EQ(std::memcmp(spread.data(), one_thread.data(), spread.size() * sizeof(cd)), 0);
  EXPECT_EQ(std::memcmp(spread.data(), nested.data(), spread.size() * sizeof(cd)), 0);
}

// Below the parallel threshold the blocks run in turn on the calling thread, outside any parallel
// region, where OpenMP builds of OpenBLAS would thread each call by omp_get_max_threads() and
// round differently with it (found as a streamed matmul's last batch changing with
// OMP_NUM_THREADS): every thread count gives the same bits.
TEST(GemmKernel, CpuBitsDoNotDependOnTheThreadCountBelowTheParallelThreshold) {
  const std::int64_t m = 4 * 257, n = 12, k = 24;  // 4 blocks of 257 rows, about 2^18 multiply-adds
  auto a = random_complex(m * k, 13), b = random_complex(k * n, 14);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<std::complex<float>> c(static_cast<std::size_t>(m * n));
    kernels::Gemm g{DType::complex64, m, n, k, a.data(), k, b.data(), n, c.data(), n};
    g.row_block = 257;
    kernels::gemm_cpu(g);
    omp_set_num_threads(saved);
    return c;
  };
  const auto one = run(1);
  EXPECT_LT(relative_error(one, reference_gemm(a, b, m, n, k)), 1e-5);
  for (const int threads : {2, 3, 16}) {
    const auto c = run(threads);
    EXPECT_EQ(std::memcmp(one.data(), c.data(), c.size() * sizeof(c[0])), 0) << threads << " threads";
  }
}

TEST(GemmKernel, GpuMatchesReferenceAndCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  const std::int64_t m = 300, n = 64, k = 128;
  auto a = random_complex(m * k, 11), b = random_complex(k * n, 12);
  const auto want = reference_gemm(a, b, m, n, k);
  Buffer da = gpu.upload(a.data(), a.size() * 8), db = gpu.upload(b.data(), b.size() * 8);
  Buffer dc = gpu.backend->alloc_device(m * n * 8, "test");
  Buffer staging = gpu.backend->alloc_device(8 << 20, "test staging");
  auto cpu = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto cpu_stream = cpu->make_stream(true);
  std::vector<char> cpu_staging(8 << 20);
  // (Bounds: complex sums of k = 128 random products, relative 2-norm error.)
  const std::map<kernels::Compute, double> bound = {{kernels::Compute::full, 1e-5}, {kernels::Compute::tf32, 5e-3},
                                                    {kernels::Compute::tf32x3, 1e-5}, {kernels::Compute::bf16, 3e-2}};
  for (auto [mode, tolerance] : bound) {
    kernels::Gemm g{DType::complex64, m, n, k, da.data(), k, db.data(), n, dc.data(), n, mode};
    g.workspace = staging.data();
    g.workspace_bytes = 8 << 20;
    kernels::gemm(*gpu.stream, g);
    auto c = gpu.download<std::complex<float>>(dc, m * n);
    EXPECT_LT(relative_error(c, want), tolerance) << kernels::compute_name(mode);
    // The CPU twin stages the same rounded values: the two differ by accumulation order only.
    std::vector<std::complex<float>> c_cpu(static_cast<std::size_t>(m * n));
    kernels::Gemm h{DType::complex64, m, n, k, a.data(), k, b.data(), n, c_cpu.data(), n, mode};
    h.workspace = cpu_staging.data();
    h.workspace_bytes = static_cast<std::int64_t>(cpu_staging.size());
    kernels::gemm(*cpu_stream, h);
    std::vector<cd> cpu_values(c_cpu.begin(), c_cpu.end());
    EXPECT_LT(relative_error(c, cpu_values), 1e-5) << kernels::compute_name(mode) << ": cuda against cpu";
  }
}

// The reduced modes' staged values: round to nearest even at TF32's and BF16's mantissa, a split
// whose two parts are TF32 numbers summing to x within 2^-22, and the 4M expansion's blocks.
TEST(ReducedGemm, RoundingAndSplitting) {
  EXPECT_EQ(kernels::round_tf32(1.0f), 1.0f);
  EXPECT_EQ(kernels::round_tf32(1.0f + 0x1p-11f), 1.0f);                 // a tie: to even (down)
  EXPECT_EQ(kernels::round_tf32(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);   // a tie: to even (up)
  EXPECT_EQ(kernels::round_tf32(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(kernels::round_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(kernels::round_bf16(-(1.0f + 0x1p-8f + 0x1p-16f)), -(1.0f + 0x1p-7f));
  EXPECT_TRUE(std::isinf(kernels::round_tf32(std::numeric_limits<float>::infinity())));
  std::mt19937 gen(3);
  std::normal_distribution<float> dist;
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 60) - 30);
    const float big = kernels::round_tf32(x), small = kernels::round_tf32(x - big);
    EXPECT_EQ(kernels::float_bits(big) & 0x1fffu, 0u);
    EXPECT_EQ(kernels::float_bits(small) & 0x1fffu, 0u);
    EXPECT_LE(std::abs(x - big), std::abs(x) * 0x1p-11f);
    EXPECT_LE(std::abs(static_cast<double>(x) - big - small), std::abs(x) * 0x1p-22);
    EXPECT_LE(std::abs(x - kernels::round_bf16(x)), std::abs(x) * 0x1p-8f);
  }
  // B = [[1+2i]] expanded: [[1, 2], [-2, 1]]; transposed: [[1, -2], [2, 1]].
  const std::complex<float> b{1, 2};
  for (auto layout : {kernels::StageOperand::Layout::expand, kernels::StageOperand::Layout::expand_t}) {
    kernels::StageOperand st;
    st.src = &b;
    st.rows = st.cols = st.ld = 1;
    st.layout = layout;
    float out[4];
    st.big = out;
    kernels::stage_operand_cpu(st);
    const float sign = layout == kernels::StageOperand::Layout::expand ? 1 : -1;
    EXPECT_EQ(out[0], 1);
    EXPECT_EQ(out[1], sign * 2);
    EXPECT_EQ(out[2], -sign * 2);
    EXPECT_EQ(out[3], 1);
  }
  // The planes layout (the 3M form): re, im and re + im, each split into big and small.
  const std::complex<float> c{1.0f + 0x1p-15f, 2};
  kernels::StageOperand planes;
  planes.src = &c;
  planes.rows = planes.cols = planes.ld = 1;
  planes.layout = kernels::StageOperand::Layout::planes;
  planes.format = kernels::StageOperand::Format::split;
  planes.plane_stride = 2;
  float big[6] = {}, small[6] = {};
  planes.big = big;
  planes.small = small;
  kernels::stage_operand_cpu(planes);
  EXPECT_EQ(big[0], 1.0f);
  EXPECT_EQ(small[0], 0x1p-15f);
  EXPECT_EQ(big[2], 2.0f);
  EXPECT_EQ(small[2], 0.0f);
  EXPECT_EQ(big[4], 3.0f);
  EXPECT_EQ(small[4], 0x1p-15f);
  EXPECT_EQ(big[1], 0.0f);  // (between the planes: untouched)
  planes.format = kernels::StageOperand::Format::tf32;
  auto cpu = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto stream = cpu->make_stream(true);
  EXPECT_THROW(kernels::stage_operand(*stream, planes), std::logic_error);
}

// The 3M form's combination: C = (P0 - P1, P2 - (P0 + P1)), set or added, over a strided batch
// with a leading dimension past the columns; the GPU gives the CPU twin's bits.
TEST(ReducedGemm, ThreeProductsCombineOnBothBackends) {
  const std::int64_t batch = 2, rows = 3, cols = 5, ldc = 7, stride_c = rows * ldc + 2;
  const std::int64_t plane = batch * rows * cols;
  std::mt19937 gen(17);
  std::normal_distribution<float> dist;
  std::vector<float> planes(static_cast<std::size_t>(3 * plane));
  for (float& x : planes) x = dist(gen);
  const auto c0 = random_complex(batch * stride_c, 18);
  for (const bool accumulate : {false, true}) {
    std::vector<std::complex<float>> c = c0;
    kernels::ThreeProducts t;
    t.planes = planes.data();
    t.plane_stride = plane;
    t.batch = batch, t.rows = rows, t.cols = cols;
    t.c = c.data();
    t.ldc = ldc, t.stride_c = stride_c;
    t.accumulate = accumulate;
    kernels::combine_three_products_cpu(t);
    for (std::int64_t e = 0; e < batch; ++e)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < ldc; ++j) {
          const auto at = static_cast<std::size_t>(e * stride_c + r * ldc + j);
          if (j >= cols) {
            EXPECT_EQ(c[at], c0[at]);
            continue;
          }
          const auto i = static_cast<std::size_t>((e * rows + r) * cols + j);
          const float p0 = planes[i], p1 = planes[i + plane], p2 = planes[i + 2 * plane];
          const std::complex<float> want{p0 - p1, p2 - (p0 + p1)};
          EXPECT_EQ(c[at], accumulate ? c0[at] + want : want);
        }
    if (!test::gpu_available()) continue;
    GpuRun gpu;
    Buffer device_planes = gpu.upload(planes.data(), planes.size() * 4),
           device_c = gpu.upload(c0.data(), c0.size() * 8);
    t.planes = static_cast<const float*>(device_planes.data());
    t.c = device_c.data();
    kernels::combine_three_products(*gpu.stream, t);
    const auto got = gpu.download<std::complex<float>>(device_c, c0.size());
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], c[i]) << "value " << i;
  }
}

// The GPU stages the CPU twin's bits: every layout and format, a strided batch of complex
// operands with a leading dimension past their columns, and a real one (BF16: the CPU holds each
// value as a float, the GPU its upper 16 bits).
TEST(ReducedGemm, GpuStagesTheCpusBits) {
  REQUIRE_GPU();
  GpuRun gpu;
  using Layout = kernels::StageOperand::Layout;
  using Format = kernels::StageOperand::Format;
  const std::int64_t rows = 5, cols = 7, ld = 9, batch = 3, stride = rows * ld + 4;
  std::mt19937 gen(9);
  std::normal_distribution<float> dist;
  for (const bool complex : {true, false}) {
    const std::int64_t e = complex ? 2 : 1;
    std::vector<float> src(static_cast<std::size_t>(e * ((batch - 1) * stride + rows * ld)));
    for (float& x : src) x = dist(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 20) - 10);
    Buffer device_src = gpu.upload(src.data(), src.size() * 4);
    for (const Layout layout : {Layout::plain, Layout::expand, Layout::expand_t, Layout::planes}) {
      if (!complex && layout != Layout::plain) continue;
      for (const Format format : {Format::tf32, Format::split, Format::bf16}) {
        if (layout == Layout::planes && format != Format::split) continue;  // (3xTF32's only)
        for (const bool padded : {false, true}) {  // (padded: rows and entries apart, as 3xTF32 stacks them)
          kernels::StageOperand st;
          st.complex = complex;
          st.rows = rows, st.cols = cols, st.ld = ld, st.batch = batch, st.stride = stride;
          st.layout = layout, st.format = format;
          if (padded) st.out_ld = st.out_cols() + 4, st.out_stride = st.out_rows() * st.out_ld + 6;
          if (layout == Layout::planes) st.plane_stride = batch * st.out_entry() + 3;
          const std::size_t values =
              static_cast<std::size_t>(layout == Layout::planes ? 3 * st.plane_stride : batch * st.out_entry());
          std::vector<float> big(values), small(values);
          st.src = src.data(), st.big = big.data(), st.small = small.data();
          kernels::stage_operand_cpu(st);
          const std::size_t value_bytes = format == Format::bf16 ? 2 : 4;
          const std::vector<float> zeros(values);
          Buffer device_big = gpu.upload(zeros.data(), values * value_bytes),
                 device_small = gpu.upload(zeros.data(), values * 4);
          st.src = device_src.data(), st.big = device_big.data(), st.small = device_small.data();
          kernels::stage_operand(*gpu.stream, st);
          const std::string what = std::string(complex ? "complex" : "real") + " layout " +
                                   std::to_string(static_cast<int>(layout)) + " format " +
                                   std::to_string(static_cast<int>(format)) + (padded ? " padded" : "");
          if (format == Format::bf16) {
            const auto got = gpu.download<std::uint16_t>(device_big, values);
            for (std::size_t i = 0; i < values; ++i)
              ASSERT_EQ(got[i], kernels::bf16_bits(big[i])) << what << " value " << i;
            continue;
          }
          const auto got = gpu.download<float>(device_big, values);
          for (std::size_t i = 0; i < values; ++i)
            ASSERT_EQ(kernels::float_bits(got[i]), kernels::float_bits(big[i])) << what << " value " << i;
          if (format == Format::split) {
            const auto got_small = gpu.download<float>(device_small, values);
            for (std::size_t i = 0; i < values; ++i)
              ASSERT_EQ(kernels::float_bits(got_small[i]), kernels::float_bits(small[i]))
                  << what << " small value " << i;
          }
        }
      }
    }
  }
}

// Every mode on the CPU twin against complex128: a strided batch with a transposed B and
// accumulation (a tensor-network step's shape), and a plain product; a workspace too small for
// one tile gives the one-tile values (columns, rows and the inner dimension tiled).
TEST(ReducedGemm, CpuModesMatchTheirErrorAndTilesAgree) {
  auto be = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto stream = be->make_stream(true);
  const std::int64_t batch = 3, m = 45, n = 37, k = 150;
  auto a = random_complex(batch * m * k, 21), b = random_complex(batch * n * k, 22), c0 = random_complex(batch * m * n, 23);
  // want = c0 + A_i · B_iᵀ per entry
  std::vector<cd> want(c0.begin(), c0.end());
  for (std::int64_t e = 0; e < batch; ++e)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        cd sum = 0;
        for (std::int64_t p = 0; p < k; ++p)
          sum += cd(a[static_cast<std::size_t>(e * m * k + i * k + p)]) * cd(b[static_cast<std::size_t>(e * n * k + j * k + p)]);
        want[static_cast<std::size_t>(e * m * n + i * n + j)] += sum;
      }
  std::map<kernels::Compute, double> error;
  for (kernels::Compute mode : {kernels::Compute::full, kernels::Compute::tf32, kernels::Compute::tf32x3, kernels::Compute::bf16}) {
    auto run = [&](std::int64_t workspace_bytes) {
      std::vector<std::complex<float>> c = c0;
      std::vector<char> workspace(static_cast<std::size_t>(workspace_bytes));
      kernels::Gemm g{DType::complex64, m, n, k, a.data(), k, b.data(), k, c.data(), n, mode};
      g.b_transposed = true;
      g.batch = batch, g.stride_a = m * k, g.stride_b = n * k, g.stride_c = m * n;
      g.accumulate = true;
      g.workspace = workspace.data();
      g.workspace_bytes = workspace_bytes;
      kernels::gemm(*stream, g);
      return c;
    };
    kernels::Gemm shape{DType::complex64, m, n, k};
    shape.batch = batch;
    shape.compute = mode;
    const auto one_tile = run(kernels::reduced_gemm_workspace(shape));
    error[mode] = relative_error(one_tile, want);
    if (mode == kernels::Compute::full) continue;
    for (std::int64_t small : {std::int64_t{64} << 10, kernels::kReducedGemmMinWorkspace}) {
      const auto tiled = run(small);
      std::vector<cd> reference(one_tile.begin(), one_tile.end());
      EXPECT_LT(relative_error(tiled, reference), 1e-6) << kernels::compute_name(mode) << " in " << small << " bytes";
    }
  }
  EXPECT_LT(error[kernels::Compute::full], 1e-6);
  EXPECT_LT(error[kernels::Compute::tf32x3], 4 * error[kernels::Compute::full] + 1e-7);
  EXPECT_GT(error[kernels::Compute::tf32], 20 * error[kernels::Compute::tf32x3]);
  EXPECT_LT(error[kernels::Compute::tf32], 2e-3);
  EXPECT_GT(error[kernels::Compute::bf16], 4 * error[kernels::Compute::tf32]);
  EXPECT_LT(error[kernels::Compute::bf16], 2e-2);
  // A real product, B not transposed.
  std::vector<float> ra(40 * 70), rb(70 * 30), rc(40 * 30);
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  for (float& x : ra) x = dist(gen);
  for (float& x : rb) x = dist(gen);
  std::vector<char> workspace(kernels::kReducedGemmMinWorkspace * 4);
  kernels::Gemm g{DType::float32, 40, 30, 70, ra.data(), 70, rb.data(), 30, rc.data(), 30, kernels::Compute::tf32x3};
  g.workspace = workspace.data();
  g.workspace_bytes = static_cast<std::int64_t>(workspace.size());
  kernels::gemm(*stream, g);
  double diff = 0, norm = 0;
  for (int i = 0; i < 40; ++i)
    for (int j = 0; j < 30; ++j) {
      double sum = 0;
      for (int p = 0; p < 70; ++p) sum += static_cast<double>(ra[i * 70 + p]) * rb[p * 30 + j];
      diff += (rc[i * 30 + j] - sum) * (rc[i * 30 + j] - sum);
      norm += sum * sum;
    }
  EXPECT_LT(std::sqrt(diff / norm), 1e-6);
}

// 3xTF32 over sums longer than one staged piece (2048 real terms) and one big · big piece (1024),
// added to C: both layouts of B, against complex128 and FP32, in one tile and tiled (the 3M form's
// products held for every row over the pieces, columns tiled; and, in the least workspace, where
// 12 m bytes of them a column do not fit, combined into C after each piece).
TEST(ReducedGemm, SplitProductsOverLongSumsStayAtFp32sError) {
  auto be = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto stream = be->make_stream(true);
  const std::int64_t m = 200, n = 10, k = 1300;
  auto a = random_complex(m * k, 31), b = random_complex(n * k, 32), c0 = random_complex(m * n, 33);
  for (const bool transposed : {false, true}) {
    std::vector<cd> want(c0.begin(), c0.end());
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t p = 0; p < k; ++p)
          want[static_cast<std::size_t>(i * n + j)] +=
              cd(a[static_cast<std::size_t>(i * k + p)]) *
              cd(b[static_cast<std::size_t>(transposed ? j * k + p : p * n + j)]);
    auto run = [&](kernels::Compute mode, std::int64_t workspace_bytes) {
      std::vector<std::complex<float>> c = c0;
      std::vector<char> workspace(static_cast<std::size_t>(workspace_bytes));
      kernels::Gemm g{DType::complex64, m, n, k, a.data(), k, b.data(), transposed ? k : n, c.data(), n, mode};
      g.b_transposed = transposed;
      g.accumulate = true;
      g.workspace = workspace.data();
      g.workspace_bytes = workspace_bytes;
      kernels::gemm(*stream, g);
      return c;
    };
    kernels::Gemm shape{DType::complex64, m, n, k};
    shape.compute = kernels::Compute::tf32x3;
    const auto full = run(kernels::Compute::full, kernels::kReducedGemmMinWorkspace);
    const auto split = run(kernels::Compute::tf32x3, kernels::reduced_gemm_workspace(shape));
    const double fp32_error = relative_error(full, want);
    EXPECT_LT(relative_error(split, want), 4 * fp32_error + 1e-7) << (transposed ? "Bt" : "B");
    EXPECT_LT(relative_error(split, want), 1e-6) << (transposed ? "Bt" : "B");
    std::vector<cd> one_tile(split.begin(), split.end());
    for (std::int64_t bytes : {std::int64_t{96} << 10, kernels::kReducedGemmMinWorkspace})
      EXPECT_LT(relative_error(run(kernels::Compute::tf32x3, bytes), one_tile), 1e-6)
          << (transposed ? "Bt" : "B") << " in " << bytes << " bytes";
  }
}

// Loop groups with scattered strides (as a tensor-network step has them): A is 3 x (2 x 4 x 3)
// with the loop modes interleaved, B broadcasts over the first group (stride 0).
kernels::LoopedGemm scattered_looped_gemm(const void* a, const void* b, void* c) {
  kernels::LoopedGemm g;
  g.m = 2;
  g.n = 3;
  g.k = 3;
  g.a = a;
  g.b = b;
  g.c = c;
  g.groups = 2;
  g.extent[0] = 3, g.stride_a[0] = 2 * 3 * 4, g.stride_b[0] = 0, g.stride_c[0] = 5 * 2 * 3;
  g.extent[1] = 5, g.stride_a[1] = 2 * 3, g.stride_b[1] = 3 * 3, g.stride_c[1] = 2 * 3;
  return g;
}

std::vector<cd> reference_looped(const kernels::LoopedGemm& g, const std::vector<std::complex<float>>& a,
                                 const std::vector<std::complex<float>>& b, std::size_t c_size) {
  std::vector<cd> c(c_size);
  for (std::uint64_t loop = 0; loop < g.loops(); ++loop) {
    std::int64_t oa = 0, ob = 0, oc = 0;
    std::uint64_t rest = loop;
    for (int d = g.groups - 1; d >= 0; --d) {  // (the last group innermost)
      const auto digit = static_cast<std::int64_t>(rest % static_cast<std::uint64_t>(g.extent[d]));
      rest /= static_cast<std::uint64_t>(g.extent[d]);
      oa += digit * g.stride_a[d], ob += digit * g.stride_b[d], oc += digit * g.stride_c[d];
    }
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        cd sum = 0;
        for (std::int64_t p = 0; p < g.k; ++p) sum += cd(a[oa + i * g.k + p]) * cd(b[ob + j * g.k + p]);
        c[oc + i * g.n + j] = sum;
      }
  }
  return c;
}

TEST(LoopedGemmKernel, CpuMatchesReference) {
  auto a = random_complex(3 * 24 + 32, 21), b = random_complex(5 * 9, 22);
  std::vector<std::complex<float>> c(3 * 5 * 6, {-7, -7});
  const auto g = scattered_looped_gemm(a.data(), b.data(), c.data());
  kernels::looped_gemm_cpu(g);
  EXPECT_LT(relative_error(c, reference_looped(g, a, b, c.size())), 1e-6);
}

TEST(LoopedGemmKernel, GpuMatchesCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  auto a = random_complex(3 * 24 + 32, 21), b = random_complex(5 * 9, 22);
  std::vector<std::complex<float>> c(3 * 5 * 6);
  Buffer da = gpu.upload(a.data(), a.size() * 8), db = gpu.upload(b.data(), b.size() * 8);
  Buffer dc = gpu.backend->alloc_device(c.size() * 8, "test");
  const auto g = scattered_looped_gemm(da.data(), db.data(), dc.data());
  kernels::looped_gemm(*gpu.stream, g);
  const auto got = gpu.download<std::complex<float>>(dc, c.size());
  kernels::looped_gemm_cpu(scattered_looped_gemm(a.data(), b.data(), c.data()));
  EXPECT_LT(relative_error(got, reference_looped(g, a, b, c.size())), 1e-6);
  std::vector<cd> cpu(c.begin(), c.end());
  EXPECT_LT(relative_error(got, cpu), 1e-6);
}

// Tropical pairs (exponent, count) with small integer exponents and some zeros (count 0), so that
// ties (counts adding) and absorbing zeros both occur.
std::vector<kernels::Tropical> random_tropical(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<kernels::Tropical> v(n);
  for (auto& t : v) t = rng() % 5 == 0 ? kernels::Tropical{0, 0} : kernels::Tropical{double(rng() % 4) - 1, double(1 + rng() % 3)};
  return v;
}

// The definition, on the scattered loops: max over k of x_a + x_b, counts of the maxima's products summed.
std::vector<kernels::Tropical> reference_tropical(const kernels::LoopedGemm& g, const std::vector<kernels::Tropical>& a,
                                                  const std::vector<kernels::Tropical>& b, std::size_t c_size) {
  std::vector<kernels::Tropical> c(c_size, {0, 0});
  for (std::uint64_t loop = 0; loop < g.loops(); ++loop) {
    std::int64_t oa = 0, ob = 0, oc = 0;
    std::uint64_t rest = loop;
    for (int d = g.groups - 1; d >= 0; --d) {
      const auto digit = static_cast<std::int64_t>(rest % static_cast<std::uint64_t>(g.extent[d]));
      rest /= static_cast<std::uint64_t>(g.extent[d]);
      oa += digit * g.stride_a[d], ob += digit * g.stride_b[d], oc += digit * g.stride_c[d];
    }
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double best = -INFINITY, count = 0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const auto x = a[static_cast<std::size_t>(oa + i * g.k + p)], y = b[static_cast<std::size_t>(ob + j * g.k + p)];
          if (x.n == 0 || y.n == 0) continue;
          if (x.x + y.x > best) best = x.x + y.x, count = 0;
          if (x.x + y.x == best) count += x.n * y.n;
        }
        c[static_cast<std::size_t>(oc + i * g.n + j)] = count == 0 ? kernels::Tropical{-INFINITY, 0} : kernels::Tropical{best, count};
      }
  }
  return c;
}

TEST(LoopedGemmKernel, TropicalCpuMatchesTheDefinition) {
  const auto a = random_tropical(3 * 24 + 32, 31), b = random_tropical(5 * 9, 32);
  std::vector<kernels::Tropical> c(3 * 5 * 6, {-7, -7});
  auto g = scattered_looped_gemm(a.data(), b.data(), c.data());
  g.dtype = DType::complex128, g.semiring = kernels::Semiring::tropical;
  kernels::looped_gemm_cpu(g);
  const auto want = reference_tropical(g, a, b, c.size());
  int ties = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].x, want[i].x) << i;
    EXPECT_EQ(c[i].n, want[i].n) << i;
    ties += c[i].n > 3;  // (a count above 3 = 3 x 1 needs two maxima added)
  }
  EXPECT_GT(ties, 0);
}

TEST(LoopedGemmKernel, TropicalGpuMatchesCpuBitwise) {
  REQUIRE_GPU();
  GpuRun gpu;
  const auto a = random_tropical(3 * 24 + 32, 31), b = random_tropical(5 * 9, 32);
  std::vector<kernels::Tropical> c(3 * 5 * 6);
  Buffer da = gpu.upload(a.data(), a.size() * 16), db = gpu.upload(b.data(), b.size() * 16);
  Buffer dc = gpu.backend->alloc_device(c.size() * 16, "test");
  auto g = scattered_looped_gemm(da.data(), db.data(), dc.data());
  g.dtype = DType::complex128, g.semiring = kernels::Semiring::tropical;
  kernels::looped_gemm(*gpu.stream, g);
  const auto got = gpu.download<kernels::Tropical>(dc, c.size());
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  kernels::looped_gemm_cpu(g);
  EXPECT_EQ(0, std::memcmp(got.data(), c.data(), c.size() * 16));
}

TEST(LoopedGemmKernel, GpuMatchesCpuWithLongSums) {
  REQUIRE_GPU();
  GpuRun gpu;
  kernels::LoopedGemm g;  // k = 100 takes the warp-per-element kernel
  g.m = 3, g.n = 2, g.k = 100, g.groups = 2;
  g.extent[0] = 4, g.stride_a[0] = 0, g.stride_b[0] = 2 * 100 * 3, g.stride_c[0] = 3 * 3 * 2;
  g.extent[1] = 3, g.stride_a[1] = 3 * 100, g.stride_b[1] = 2 * 100, g.stride_c[1] = 3 * 2;
  auto a = random_complex(3 * 300, 31), b = random_complex(4 * 600, 32);
  std::vector<std::complex<float>> c(4 * 18);
  Buffer da = gpu.upload(a.data(), a.size() * 8), db = gpu.upload(b.data(), b.size() * 8);
  Buffer dc = gpu.backend->alloc_device(c.size() * 8, "test");
  kernels::LoopedGemm dg = g;
  dg.a = da.data(), dg.b = db.data(), dg.c = dc.data();
  kernels::looped_gemm(*gpu.stream, dg);
  const auto got = gpu.download<std::complex<float>>(dc, c.size());
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  kernels::looped_gemm_cpu(g);
  EXPECT_LT(relative_error(got, reference_looped(g, a, b, c.size())), 1e-5);
  EXPECT_LT(relative_error(got, std::vector<cd>(c.begin(), c.end())), 1e-5);
}

// Power-of-two extents (digits by shifts) and one non-power-of-two group in the same walk.
TEST(LoopedGemmKernel, PowerOfTwoExtentsMatchReference) {
  kernels::LoopedGemm g;
  g.m = 2, g.n = 4, g.k = 2, g.groups = 2;
  g.extent[0] = 4, g.stride_a[0] = 3 * 2 * 2, g.stride_b[0] = 0, g.stride_c[0] = 3 * 8;
  g.extent[1] = 3, g.stride_a[1] = 2 * 2, g.stride_b[1] = 4 * 2, g.stride_c[1] = 8;
  auto a = random_complex(4 * 12, 41), b = random_complex(3 * 8, 42);
  std::vector<std::complex<float>> c(4 * 24);
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  kernels::looped_gemm_cpu(g);
  EXPECT_LT(relative_error(c, reference_looped(g, a, b, c.size())), 1e-6);
}

TEST(LoopedGemmKernel, GpuMatchesCpuWithVeryLongSums) {
  REQUIRE_GPU();
  GpuRun gpu;
  kernels::LoopedGemm g;  // k >= kLoopedBlockSum takes the block-per-element kernel
  g.m = 2, g.n = 2, g.k = 3 * kernels::kLoopedBlockSum + 5, g.groups = 2;
  g.extent[0] = 3, g.stride_a[0] = 2 * g.k, g.stride_b[0] = 2 * g.k, g.stride_c[0] = 4;
  g.extent[1] = 1, g.stride_a[1] = 0, g.stride_b[1] = 0, g.stride_c[1] = 0;
  auto a = random_complex(static_cast<std::size_t>(6 * g.k), 51), b = random_complex(static_cast<std::size_t>(6 * g.k), 52);
  std::vector<std::complex<float>> c(12);
  Buffer da = gpu.upload(a.data(), a.size() * 8), db = gpu.upload(b.data(), b.size() * 8);
  Buffer dc = gpu.backend->alloc_device(c.size() * 8, "test");
  kernels::LoopedGemm dg = g;
  dg.a = da.data(), dg.b = db.data(), dg.c = dc.data();
  kernels::looped_gemm(*gpu.stream, dg);
  const auto got = gpu.download<std::complex<float>>(dc, c.size());
  kernels::looped_gemm(*gpu.stream, dg);  // the same bits again
  EXPECT_EQ(got, gpu.download<std::complex<float>>(dc, c.size()));
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  EXPECT_LT(relative_error(got, reference_looped(g, a, b, c.size())), 1e-5);
}

// A gate step: the small operand (A, or B when a_is_small is false) with its own loop groups,
// applied to every row of the large one; C interleaves both operands' loop groups (as a tensor
// network's step does). Each group is (extent, whether it moves the small operand), outermost
// first; the operands are dense in their groups' order, then rows, then k.
struct GateStep {
  kernels::LoopedGemm g;
  std::size_t a_size = 0, b_size = 0, c_size = 0;
};
GateStep gate_step(std::int64_t m, std::int64_t n, std::int64_t k, bool a_is_small,
                   const std::vector<std::pair<std::int64_t, bool>>& groups) {
  GateStep s;
  kernels::LoopedGemm& g = s.g;
  g.m = m, g.n = n, g.k = k;
  g.groups = static_cast<int>(groups.size());
  std::int64_t a_stride = m * k, b_stride = n * k, c_stride = m * n;
  for (int d = g.groups - 1; d >= 0; --d) {
    const auto [extent, moves_small] = groups[static_cast<std::size_t>(d)];
    const bool moves_a = moves_small == a_is_small;
    g.extent[d] = extent;
    g.stride_a[d] = moves_a ? a_stride : 0;
    g.stride_b[d] = moves_a ? 0 : b_stride;
    g.stride_c[d] = c_stride;
    (moves_a ? a_stride : b_stride) *= extent;
    c_stride *= extent;
  }
  s.a_size = static_cast<std::size_t>(a_stride), s.b_size = static_cast<std::size_t>(b_stride);
  s.c_size = static_cast<std::size_t>(c_stride);
  return s;
}

// Gate steps with sums of 8 to 64 and at least 8 results a large row take the tiles kernel (the
// small operand in shared memory, 16 sums a thread): both orientations, extents that are not
// powers of two, tiles left partly empty, results not a multiple of 8, sums staged in several
// chunks (64 with 16 result rows), operands one value past a 16-byte boundary; against the CPU
// twin and the definition, and the same bits twice.
TEST(LoopedGemmKernel, GpuGateTilesMatchCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  struct Case {
    std::int64_t m, n, k;
    bool a_is_small;
    std::vector<std::pair<std::int64_t, bool>> groups;
  };
  const std::vector<Case> cases = {
      {2, 2, 32, true, {{3, false}, {2, true}, {5, false}, {4, true}, {7, false}}},  // 16 results, as big's k = 32
      {2, 2, 16, true, {{6, false}, {2, true}, {2, true}, {2, true}, {33, false}}},  // 16 results
      {4, 2, 16, false, {{2, true}, {17, false}, {3, true}}},                        // B small: 12 results
      {2, 64, 8, true, {{3, true}, {4, true}, {11, false}}},                         // 24 results, long B rows
      {16, 2, 64, true, {{5, false}, {9, false}}},                                   // 16 results, 4 chunks
      {2, 3, 8, true, {{2, true}, {2, true}, {2, true}, {2, true}, {2, true}, {25, false}}},  // 64 results
      {8, 1, 32, true, {{3000, false}}},  // 8 results, 6 tiles, the last partly empty
  };
  for (const Case& cs : cases) {
    GateStep st = gate_step(cs.m, cs.n, cs.k, cs.a_is_small, cs.groups);
    const auto a = random_complex(st.a_size, 71), b = random_complex(st.b_size, 72);
    for (const std::size_t shift : {0, 1}) {
      std::vector<std::complex<float>> a1(shift + st.a_size), b1(shift + st.b_size), c(st.c_size);
      std::copy(a.begin(), a.end(), a1.begin() + static_cast<std::ptrdiff_t>(shift));
      std::copy(b.begin(), b.end(), b1.begin() + static_cast<std::ptrdiff_t>(shift));
      Buffer da = gpu.upload(a1.data(), a1.size() * 8), db = gpu.upload(b1.data(), b1.size() * 8);
      Buffer dc = gpu.backend->alloc_device(st.c_size * 8, "test");
      kernels::LoopedGemm dg = st.g;
      dg.a = static_cast<char*>(da.data()) + shift * 8, dg.b = static_cast<char*>(db.data()) + shift * 8;
      dg.c = dc.data();
      kernels::looped_gemm(*gpu.stream, dg);
      const auto got = gpu.download<std::complex<float>>(dc, st.c_size);
      kernels::looped_gemm(*gpu.stream, dg);
      const auto again = gpu.download<std::complex<float>>(dc, st.c_size);
      kernels::LoopedGemm hg = st.g;
      hg.a = a1.data() + shift, hg.b = b1.data() + shift, hg.c = c.data();
      kernels::looped_gemm_cpu(hg);
      const std::string what = std::to_string(cs.m) + "x" + std::to_string(cs.n) + "x" + std::to_string(cs.k) +
                               " shift " + std::to_string(shift);
      EXPECT_LT(relative_error(got, std::vector<cd>(c.begin(), c.end())), 1e-6) << what;
      EXPECT_LT(relative_error(got, reference_looped(hg, a, b, st.c_size)), 1e-6) << what;
      EXPECT_EQ(std::memcmp(got.data(), again.data(), st.c_size * 8), 0) << what;
    }
  }
}

// A chain of 100 dependent small products (state i+1 = state i times gate i, over a loop group
// of 2: more than one launch's worth), with a product too large for a chain pushed after the
// 50th (it reads state 50, so what waits must run first), run through LoopedChain on `backend`;
// returns the last state and the large product's result.
std::pair<std::vector<std::complex<float>>, std::vector<std::complex<float>>> run_chain(
    Backend& backend, Stream& stream, const std::vector<std::complex<float>>& first,
    const std::vector<std::complex<float>>& gates, const std::vector<std::complex<float>>& wide) {
  constexpr int kSteps = 100;
  Buffer states = backend.alloc_device((kSteps + 1) * 32 * 8, "test states");
  Buffer g = backend.alloc_device(gates.size() * 8, "test gates"),
         w = backend.alloc_device(wide.size() * 8, "test wide");
  Buffer y = backend.alloc_device(1024 * 16 * 8, "test y");
  backend.copy_to_device(states.data(), first.data(), 32 * 8, stream);
  backend.copy_to_device(g.data(), gates.data(), gates.size() * 8, stream);
  backend.copy_to_device(w.data(), wide.data(), wide.size() * 8, stream);
  auto* state = static_cast<std::complex<float>*>(states.data());
  kernels::LoopedChain chain(stream);
  for (int i = 0; i < kSteps; ++i) {
    kernels::LoopedGemm p;
    p.m = 4, p.n = 4, p.k = 4, p.groups = 1;
    p.extent[0] = 2, p.stride_a[0] = 16, p.stride_b[0] = 0, p.stride_c[0] = 16;
    p.a = state + 32 * i, p.b = static_cast<std::complex<float>*>(g.data()) + 16 * i, p.c = state + 32 * (i + 1);
    EXPECT_TRUE(kernels::LoopedChain::fits(p));
    chain.push(p);
    if (i == 50) {
      kernels::LoopedGemm big;  // 16384 results: runs alone, after the 51 queued
      big.m = 4, big.n = 4, big.k = 4, big.groups = 1;
      big.extent[0] = 1024, big.stride_a[0] = 0, big.stride_b[0] = 16, big.stride_c[0] = 16;
      big.a = state + 32 * 51, big.b = w.data(), big.c = y.data();
      EXPECT_FALSE(kernels::LoopedChain::fits(big));
      chain.push(big);
      EXPECT_EQ(chain.queued(), 0u);
    }
  }
  chain.flush();
  std::vector<std::complex<float>> last(32), out(1024 * 16);
  backend.copy_to_host(last.data(), state + 32 * kSteps, 32 * 8, stream);
  backend.copy_to_host(out.data(), y.data(), out.size() * 8, stream);
  stream.synchronize();
  return {last, out};
}

// The chain's inputs, and its products run one by one by the CPU twin.
struct ChainCase {
  std::vector<std::complex<float>> first = random_complex(32, 81), gates = random_complex(100 * 16, 82),
                                   wide = random_complex(1024 * 16, 83), want_last, want_y;
  ChainCase() {
    for (auto& x : gates) x *= 0.5f;  // (the states stay of order one)
    std::vector<std::complex<float>> states((100 + 1) * 32);
    want_y.resize(1024 * 16);
    std::copy(first.begin(), first.end(), states.begin());
    for (int i = 0; i < 100; ++i) {
      kernels::LoopedGemm p;
      p.m = 4, p.n = 4, p.k = 4, p.groups = 1;
      p.extent[0] = 2, p.stride_a[0] = 16, p.stride_b[0] = 0, p.stride_c[0] = 16;
      p.a = states.data() + 32 * i, p.b = gates.data() + 16 * i, p.c = states.data() + 32 * (i + 1);
      kernels::looped_gemm_cpu(p);
      if (i == 50) {
        kernels::LoopedGemm big;
        big.m = 4, big.n = 4, big.k = 4, big.groups = 1;
        big.extent[0] = 1024, big.stride_a[0] = 0, big.stride_b[0] = 16, big.stride_c[0] = 16;
        big.a = states.data() + 32 * 51, big.b = wide.data(), big.c = want_y.data();
        kernels::looped_gemm_cpu(big);
      }
    }
    want_last.assign(states.end() - 32, states.end());
  }
};

// On the CPU a chain runs each product by the CPU twin, in order: the same bits. A long sum over
// few results is not chained (one thread would sum it alone).
TEST(LoopedGemmKernel, ChainRunsSmallProductsInOrder) {
  kernels::LoopedGemm dot;
  dot.k = 1024;
  EXPECT_FALSE(kernels::LoopedChain::fits(dot));
  dot.k = kernels::kChainMaxSum;
  EXPECT_TRUE(kernels::LoopedChain::fits(dot));
  const ChainCase cs;
  auto cpu = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto stream = cpu->make_stream();
  const auto [last, y] = run_chain(*cpu, *stream, cs.first, cs.gates, cs.wide);
  EXPECT_EQ(std::memcmp(last.data(), cs.want_last.data(), 32 * 8), 0);
  EXPECT_EQ(std::memcmp(y.data(), cs.want_y.data(), y.size() * 8), 0);
}

// On the GPU (100 stages of one product: two cooperative launches) within FP32's rounding of the
// CPU twin's.
TEST(LoopedGemmKernel, GpuChainMatchesCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  const ChainCase cs;
  const auto [last, y] = run_chain(*gpu.backend, *gpu.stream, cs.first, cs.gates, cs.wide);
  EXPECT_LT(relative_error(last, std::vector<cd>(cs.want_last.begin(), cs.want_last.end())), 1e-5);
  EXPECT_LT(relative_error(y, std::vector<cd>(cs.want_y.begin(), cs.want_y.end())), 1e-5);
}

// Three independent chains of 40 products pushed in turn (state x, i+1 = state x, i times gate
// x, i) form 40 stages of three, and one more where the 65th product starts a second launch
// (kChainBatch); a product that writes where a queued one of its stage reads, or
// where one writes, starts a stage; reading what another reads does not. Returns the three last
// states and the stage counts seen.
struct StagedRun {
  std::vector<std::complex<float>> last;
  std::vector<std::size_t> stages;
};
StagedRun run_staged_chains(Backend& backend, Stream& stream, const std::vector<std::complex<float>>& first,
                            const std::vector<std::complex<float>>& gates) {
  constexpr int kChains = 3, kSteps = 40, kState = 32;
  Buffer states = backend.alloc_device(kChains * (kSteps + 1) * kState * 8, "test states");
  Buffer g = backend.alloc_device(gates.size() * 8, "test gates");
  auto* state = static_cast<std::complex<float>*>(states.data());
  auto* gate = static_cast<std::complex<float>*>(g.data());
  for (int x = 0; x < kChains; ++x)
    backend.copy_to_device(state + x * (kSteps + 1) * kState, first.data() + x * kState, kState * 8, stream);
  backend.copy_to_device(gate, gates.data(), gates.size() * 8, stream);
  auto product = [&](int x, int i) {
    kernels::LoopedGemm p;
    p.m = 4, p.n = 4, p.k = 4, p.groups = 1;
    p.extent[0] = 2, p.stride_a[0] = 16, p.stride_b[0] = 0, p.stride_c[0] = 16;
    std::complex<float>* chain = state + x * (kSteps + 1) * kState;
    p.a = chain + kState * i, p.b = gate + 16 * (x * kSteps + i), p.c = chain + kState * (i + 1);
    return p;
  };
  StagedRun r;
  kernels::LoopedChain chain(stream);
  for (int i = 0; i < kSteps; ++i)
    for (int x = 0; x < kChains; ++x) chain.push(product(x, i));
  r.stages.push_back(chain.stages());
  chain.flush();
  // Then: `reread` (chain 1's product 0 into chain 2's last state) and `rewrite` (chain 0's
  // product 0 again) touch nothing of each other: one stage. `clobber` (chain 2's product 0 into
  // chain 1's state 0) writes what `reread` reads: a second stage.
  kernels::LoopedGemm reread = product(1, 0), rewrite = product(0, 0), clobber = product(2, 0);
  reread.c = state + (kSteps + 1) * kState * 3 - kState;
  clobber.c = state + (kSteps + 1) * kState;
  chain.push(reread);
  chain.push(rewrite);
  r.stages.push_back(chain.stages());
  chain.push(clobber);
  r.stages.push_back(chain.stages());
  chain.flush();
  r.last.resize(kChains * kState);
  for (int x = 0; x < kChains; ++x)
    backend.copy_to_host(r.last.data() + x * kState, state + x * (kSteps + 1) * kState + kSteps * kState, kState * 8,
                         stream);
  std::vector<std::complex<float>> state0(kState);
  backend.copy_to_host(state0.data(), state + (kSteps + 1) * kState, kState * 8, stream);  // chain 1's state 0
  stream.synchronize();
  r.last.insert(r.last.end(), state0.begin(), state0.end());
  return r;
}

// On the CPU twin, one product at a time.
std::vector<std::complex<float>> staged_chains_want(const std::vector<std::complex<float>>& first,
                                                    const std::vector<std::complex<float>>& gates) {
  constexpr int kChains = 3, kSteps = 40, kState = 32;
  std::vector<std::complex<float>> states(kChains * (kSteps + 1) * kState), last;
  auto run = [&](int x, int i, std::complex<float>* c) {
    kernels::LoopedGemm p;
    p.m = 4, p.n = 4, p.k = 4, p.groups = 1;
    p.extent[0] = 2, p.stride_a[0] = 16, p.stride_b[0] = 0, p.stride_c[0] = 16;
    std::complex<float>* chain = states.data() + x * (kSteps + 1) * kState;
    p.a = chain + kState * i, p.b = gates.data() + 16 * (x * kSteps + i), p.c = c ? c : chain + kState * (i + 1);
    kernels::looped_gemm_cpu(p);
  };
  for (int x = 0; x < kChains; ++x)
    std::copy(first.begin() + x * kState, first.begin() + (x + 1) * kState, states.begin() + x * (kSteps + 1) * kState);
  for (int i = 0; i < kSteps; ++i)
    for (int x = 0; x < kChains; ++x) run(x, i, nullptr);
  run(1, 0, states.data() + (kSteps + 1) * kState * 3 - kState);
  run(0, 0, nullptr);
  run(2, 0, states.data() + (kSteps + 1) * kState);
  for (int x = 0; x < kChains; ++x)
    last.insert(last.end(), states.begin() + x * (kSteps + 1) * kState + kSteps * kState,
                states.begin() + (x + 1) * (kSteps + 1) * kState);
  last.insert(last.end(), states.begin() + (kSteps + 1) * kState, states.begin() + (kSteps + 1) * kState + kState);
  return last;
}

// A product's footprint spans its operands' and result's bytes from the lowest element to the
// highest, loop groups included; a negative stride makes it span everything (so it conflicts).
TEST(LoopedGemmKernel, ChainFootprintsSpanEveryElement) {
  kernels::LoopedGemm g;
  g.dtype = DType::complex64;
  g.m = 2, g.n = 3, g.k = 4, g.groups = 2;
  g.extent[0] = 5, g.stride_a[0] = 100, g.stride_b[0] = 0, g.stride_c[0] = 60;
  g.extent[1] = 2, g.stride_a[1] = 8, g.stride_b[1] = 12, g.stride_c[1] = 6;
  g.a = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
  g.b = reinterpret_cast<const void*>(std::uintptr_t{2} << 20);
  g.c = reinterpret_cast<void*>(std::uintptr_t{3} << 20);
  const auto f = kernels::LoopedChain::footprint(g);
  EXPECT_EQ(f.a.end - f.a.begin, (4 * 100 + 8 + 2 * 4) * 8u);  // highest A element: 4*100 + 8 + 7
  EXPECT_EQ(f.b.end - f.b.begin, (12 + 3 * 4) * 8u);
  EXPECT_EQ(f.c.end - f.c.begin, (4 * 60 + 6 + 2 * 3) * 8u);
  kernels::LoopedGemm elsewhere = g;
  elsewhere.a = reinterpret_cast<const void*>(std::uintptr_t{5} << 20);
  elsewhere.b = reinterpret_cast<const void*>(std::uintptr_t{6} << 20);
  elsewhere.c = reinterpret_cast<void*>(std::uintptr_t{7} << 20);
  EXPECT_FALSE(f.conflicts(kernels::LoopedChain::footprint(elsewhere)));
  elsewhere.stride_b[1] = -12;
  EXPECT_TRUE(f.conflicts(kernels::LoopedChain::footprint(elsewhere)));
  EXPECT_TRUE(kernels::LoopedChain::footprint(elsewhere).conflicts(f));
}

TEST(LoopedGemmKernel, ChainStagesIndependentProducts) {
  const auto first = random_complex(3 * 32, 84);
  auto gates = random_complex(3 * 40 * 16, 85);
  for (auto& x : gates) x *= 0.5f;
  auto cpu = make_backend({"cpu", 1ull << 30, 1ull << 30, 0});
  auto stream = cpu->make_stream();
  const StagedRun r = run_staged_chains(*cpu, *stream, first, gates);
  EXPECT_EQ(r.stages, (std::vector<std::size_t>{41, 1, 2}));
  const auto want = staged_chains_want(first, gates);
  EXPECT_EQ(std::memcmp(r.last.data(), want.data(), want.size() * 8), 0);
}

// On the GPU: stages over the whole device, a grid-wide barrier between them (cooperative
// launches of up to 64 products), within FP32's rounding of the CPU twin's.
TEST(LoopedGemmKernel, GpuChainStagesMatchCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  const auto first = random_complex(3 * 32, 84);
  auto gates = random_complex(3 * 40 * 16, 85);
  for (auto& x : gates) x *= 0.5f;
  const StagedRun r = run_staged_chains(*gpu.backend, *gpu.stream, first, gates);
  EXPECT_EQ(r.stages, (std::vector<std::size_t>{41, 1, 2}));
  const auto want = staged_chains_want(first, gates);
  EXPECT_LT(relative_error(r.last, std::vector<cd>(want.begin(), want.end())), 1e-5);
}

// Merging: extent-1 dimensions and runs contiguous in the input collapse; the gather's result is
// the element-by-element definition's.
TEST(GatherPermuteKernel, MergedGatherMatchesTheDefinition) {
  // in: a 2 x 3 x 4 x 2 x 1 tensor; out walks it as (d3, d0, d1, d2, d4).
  const std::int64_t in_dims[5] = {2, 3, 4, 2, 1};
  std::int64_t in_strides[5];
  in_strides[4] = 1;
  for (int j = 3; j >= 0; --j) in_strides[j] = in_strides[j + 1] * in_dims[j + 1];
  const int order[5] = {3, 0, 1, 2, 4};
  kernels::GatherPermute g;
  g.dtype = DType::complex64;
  g.rank = 5;
  for (int j = 0; j < 5; ++j) g.dims[j] = in_dims[order[j]], g.strides[j] = in_strides[order[j]];
  const kernels::GatherPermute m = kernels::merged(g);
  EXPECT_EQ(m.rank, 2);  // (d3), (d0 d1 d2): d0, d1 and d2 keep their order and are contiguous in the input
  auto in = random_complex(48, 61);
  std::vector<std::complex<float>> out(48);
  g.in = in.data(), g.out = out.data();
  kernels::gather_permute_cpu(g);
  std::size_t i = 0;
  for (std::int64_t x3 = 0; x3 < 2; ++x3)
    for (std::int64_t x0 = 0; x0 < 2; ++x0)
      for (std::int64_t x1 = 0; x1 < 3; ++x1)
        for (std::int64_t x2 = 0; x2 < 4; ++x2, ++i)
          EXPECT_EQ(out[i], in[static_cast<std::size_t>(x0 * in_strides[0] + x1 * in_strides[1] + x2 * in_strides[2] +
                                                        x3 * in_strides[3])]);
}

// Short power-of-two sums with one small side take the rows kernel (a thread per row of the
// larger operand): both orientations; loop groups where both operands move, where B is broadcast
// and where A is (walked inside the thread when it is the large one, unless that would make more
// than 64 results per thread: 100 x 40, or 32 for sums over 16 long: 16 x 40 x 32); sums up to 16
// long (rows in registers) and 32 and 64 (rows in columns of 16); complex64 and complex128;
// against the CPU twin.
TEST(LoopedGemmKernel, GpuRowsKernelMatchesCpu) {
  REQUIRE_GPU();
  GpuRun gpu;
  struct Shape {
    std::int64_t m, n, k;
  };
  for (const Shape sh : {Shape{128, 2, 16}, Shape{2, 64, 8}, Shape{8, 8, 4}, Shape{33, 1, 2}, Shape{1, 40, 1},
                         Shape{100, 40, 1}, Shape{3, 48, 2}, Shape{4, 33, 32}, Shape{2, 70, 64},
                         Shape{8, 40, 32}, Shape{16, 40, 32}}) {
    kernels::LoopedGemm g;
    g.m = sh.m, g.n = sh.n, g.k = sh.k, g.groups = 3;
    // group 0: both operands move; group 1: B is broadcast (a gate applied at every index);
    // group 2: A is broadcast (a free mode of B that C has outside B's rows).
    g.extent[0] = 3, g.stride_a[0] = 4 * sh.m * sh.k, g.stride_b[0] = 2 * sh.n * sh.k, g.stride_c[0] = 8 * sh.m * sh.n;
    g.extent[1] = 4, g.stride_a[1] = sh.m * sh.k, g.stride_b[1] = 0, g.stride_c[1] = 2 * sh.m * sh.n;
    g.extent[2] = 2, g.stride_a[2] = 0, g.stride_b[2] = sh.n * sh.k, g.stride_c[2] = sh.m * sh.n;
    const auto a_size = static_cast<std::size_t>(12 * sh.m * sh.k), b_size = static_cast<std::size_t>(6 * sh.n * sh.k),
               c_size = static_cast<std::size_t>(24 * sh.m * sh.n);
    const auto a = random_complex(a_size, 61), b = random_complex(b_size, 62);
    for (auto dtype : {DType::complex64, DType::complex128}) {
      g.dtype = dtype;
      if (dtype == DType::complex64) {
        // (shift 1: the operands one value past a 16-byte boundary, read one value a load)
        for (const std::size_t shift : {0, 1}) {
          std::vector<std::complex<float>> c(c_size), a1(shift + a_size), b1(shift + b_size);
          std::copy(a.begin(), a.end(), a1.begin() + static_cast<std::ptrdiff_t>(shift));
          std::copy(b.begin(), b.end(), b1.begin() + static_cast<std::ptrdiff_t>(shift));
          Buffer da = gpu.upload(a1.data(), a1.size() * 8), db = gpu.upload(b1.data(), b1.size() * 8);
          Buffer dc = gpu.backend->alloc_device(c_size * 8, "test");
          kernels::LoopedGemm dg = g;
          dg.a = static_cast<char*>(da.data()) + shift * 8, dg.b = static_cast<char*>(db.data()) + shift * 8;
          dg.c = dc.data();
          kernels::looped_gemm(*gpu.stream, dg);
          const auto got = gpu.download<std::complex<float>>(dc, c_size);
          kernels::LoopedGemm hg = g;
          hg.a = a1.data() + shift, hg.b = b1.data() + shift, hg.c = c.data();
          kernels::looped_gemm_cpu(hg);
          const std::string what = std::to_string(sh.m) + "x" + std::to_string(sh.n) + "x" + std::to_string(sh.k) +
                                   " shift " + std::to_string(shift);
          EXPECT_LT(relative_error(got, std::vector<cd>(c.begin(), c.end())), 1e-6) << what;
          EXPECT_LT(relative_error(got, reference_looped(hg, a, b, c_size)), 1e-6) << what;
        }
      } else {
        const std::vector<cd> a2(a.begin(), a.end()), b2(b.begin(), b.end());
        std::vector<cd> c(c_size);
        Buffer da = gpu.upload(a2.data(), a_size * 16), db = gpu.upload(b2.data(), b_size * 16);
        Buffer dc = gpu.backend->alloc_device(c_size * 16, "test");
        kernels::LoopedGemm dg = g;
        dg.a = da.data(), dg.b = db.data(), dg.c = dc.data();
        kernels::looped_gemm(*gpu.stream, dg);
        const auto got = gpu.download<cd>(dc, c_size);
        kernels::LoopedGemm hg = g;
        hg.a = a2.data(), hg.b = b2.data(), hg.c = c.data();
        kernels::looped_gemm_cpu(hg);
        double worst = 0;
        for (std::size_t i = 0; i < c_size; ++i) worst = std::max(worst, std::abs(got[i] - c[i]));
        EXPECT_LT(worst, 1e-12) << sh.m << "x" << sh.n << "x" << sh.k;
      }
    }
  }
}
