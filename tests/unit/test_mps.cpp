// The U(1) MPS core (stages/mps) against dense references computed here: gate tables and their
// conservation check, the container's invariants for product and random states, one charge-
// blocked two-site update against the dense gate applied to the dense state (d = 2 and d = 3),
// and the global truncation's ranking, ties and TeNPy constraints.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <complex>
#include <map>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "kernels/mps/charge_tiles.hpp"
#include "kernels/mps/u1_math.hpp"
#include "stages/mps/gates.hpp"
#include "stages/mps/linalg.hpp"
#include "stages/mps/models.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"
#include "test_util.hpp"

using namespace qstage;
using namespace qstage::stages::mps;

namespace {

// The dense state of an MPS: amplitude of occupations (n_0, ..., n_{L-1}) at index sum n_j d^(L-1-j).
std::vector<cplx> dense(const U1Mps& psi) {
  // rows: configurations of the sites so far; columns: indices of the current bond.
  // (bond 0's lambda weight its totals N: 1 for a single one)
  std::vector<cplx> cur(psi.bonds[0].lambda.begin(), psi.bonds[0].lambda.end());
  std::int64_t configs = 1, chi = psi.bonds[0].size();
  for (int j = 0; j < psi.L; ++j) {
    const Bond& left = psi.bonds[j];
    const Bond& right = psi.bonds[j + 1];
    const std::int64_t chi_r = right.size();
    std::vector<cplx> next(static_cast<std::size_t>(configs * psi.d * chi_r));
    for (const Block& b : psi.sites[j].blocks) {
      const Sector l = left.sector(b.c_left), r = right.sector(b.c_right);
      const int n = b.c_left - b.c_right;
      for (std::int64_t c = 0; c < configs; ++c)
        for (std::int64_t a = 0; a < b.rows; ++a)
          for (std::int64_t q = 0; q < b.cols; ++q)
            next[(c * psi.d + n) * chi_r + r.offset + q] += cur[c * chi + l.offset + a] * b.values[a * b.cols + q];
    }
    cur = std::move(next);
    configs *= psi.d;
    chi = chi_r;
  }
  return cur;
}

// The dense gate g (d^2 x d^2) on sites j, j+1 of a dense state.
std::vector<cplx> apply_dense(const std::vector<cplx>& v, const std::vector<cplx>& g, int L, int d, int j) {
  std::int64_t inner = 1, outer = 1;
  for (int i = j + 2; i < L; ++i) inner *= d;
  for (int i = 0; i < j; ++i) outer *= d;
  std::vector<cplx> out(v.size());
  const int dd = d * d;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i)
      for (int r = 0; r < dd; ++r)
        for (int c = 0; c < dd; ++c) out[(o * dd + r) * inner + i] += g[r * dd + c] * v[(o * dd + c) * inner + i];
  return out;
}

// A random Hermitian two-site Hamiltonian that conserves n_left + n_right.
std::vector<cplx> random_conserving_hamiltonian(int d, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const int dd = d * d;
  std::vector<cplx> h(static_cast<std::size_t>(dd * dd));
  for (int r = 0; r < dd; ++r)
    for (int c = 0; c <= r; ++c)
      if (r / d + r % d == c / d + c % d) {
        const cplx v = r == c ? cplx{u(rng), 0} : cplx{u(rng), u(rng)};
        h[r * dd + c] = v;
        h[c * dd + r] = std::conj(v);
      }
  return h;
}

std::vector<double> schmidt_values(const std::vector<cplx>& v, std::int64_t rows) {
  const Svd f = svd(v.data(), rows, static_cast<std::int64_t>(v.size()) / rows);
  std::vector<double> s;
  for (double x : f.s)
    if (x > 1e-13) s.push_back(x);
  return s;
}

}  // namespace

TEST(U1Math, GateIndicesFollowTheChargeDifferences) {
  // d = 3: old (n, m) = (2, 1), new left occupation 0 -> right 3 is outside [0, 2].
  EXPECT_FALSE(kernels::gate_entry_allowed(2, 1, 0, 3));
  EXPECT_TRUE(kernels::gate_entry_allowed(2, 1, 1, 3));
  // c_L = 5, c_old = 3, c_new = 4, c_R = 2: old (2, 1), new (1, 2).
  EXPECT_EQ(kernels::gate_entry_for_charges(5, 3, 4, 2, 3), kernels::gate_index(2, 1, 1, 3));
  EXPECT_EQ(kernels::gate_entry_for_charges(5, 3, 5, 2, 3), -1);  // new right occupation 3
  EXPECT_TRUE(kernels::u1_block_allowed(3, 1, 3));
  EXPECT_FALSE(kernels::u1_block_allowed(3, 0, 3));
  EXPECT_FALSE(kernels::u1_block_allowed(1, 2, 3));
}

TEST(MpsGates, XxzGateMatchesTheClosedFormAndConserves) {
  const double J = 0.9, delta = 0.7, dt = 0.3;
  const auto g = exp_minus_i(xxz_bond_hamiltonian(J, delta, 0, 0), 4, dt);
  const cplx diag = std::exp(cplx{0, -J * delta * dt / 4});
  const cplx phase = std::exp(cplx{0, J * delta * dt / 4});
  EXPECT_LT(std::abs(g[0] - diag), 1e-14);
  EXPECT_LT(std::abs(g[15] - diag), 1e-14);
  EXPECT_LT(std::abs(g[1 * 4 + 1] - phase * std::cos(J * dt / 2)), 1e-14);
  EXPECT_LT(std::abs(g[1 * 4 + 2] - phase * cplx{0, -std::sin(J * dt / 2)}), 1e-14);
  const GateTable t = gate_table(g, 2, "test gate");
  // U[n, m, l] = <l, n+m-l|G|n, m>: hopping |1 0> -> |0 1> is U[1, 0, 0].
  EXPECT_EQ(t.at(1, 0, 0), g[(0 * 2 + 1) * 4 + (1 * 2 + 0)]);
  EXPECT_EQ(t.at(1, 1, 1), g[15]);
  // unitary
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      cplx s{};
      for (int k = 0; k < 4; ++k) s += g[k * 4 + r] * std::conj(g[k * 4 + c]);
      EXPECT_LT(std::abs(s - (r == c ? 1.0 : 0.0)), 1e-14);
    }
}

TEST(MpsGates, AGateThatChangesTheParticleNumberIsRefused) {
  auto h = xxz_bond_hamiltonian(1, 0.5, 0, 0);
  h[0 * 4 + 2] = h[2 * 4 + 0] = 0.1;  // S^x on the left site: |00> <-> |10>
  const auto g = exp_minus_i(h, 4, 0.1);
  try {
    gate_table(g, 2, "the bad gate");
    FAIL() << "a non-conserving gate was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the bad gate does not conserve the particle number"), std::string::npos);
  }
}

TEST(MpsContainer, ProductStateHasItsChargesAndStructure) {
  const U1Mps psi = product_state(3, {2, 0, 1, 1});
  EXPECT_NO_THROW(psi.check_structure());
  EXPECT_EQ(psi.total_charge, 4);
  const std::vector<int> expected{4, 2, 2, 1, 0};
  for (int k = 0; k <= 4; ++k) EXPECT_EQ(psi.bonds[k].charges, std::vector<int>{expected[k]});
  const auto n = densities(psi);
  EXPECT_EQ(n, (std::vector<double>{2, 0, 1, 1}));
  EXPECT_EQ(norm_squared(psi), 1.0);
}

TEST(MpsContainer, RandomStateIsNormalisedRightCanonicalWithSchmidtLambdas) {
  const U1Mps psi = random_state(6, 3, 5, 10, 42);
  EXPECT_NO_THROW(psi.check_structure());
  EXPECT_LT(std::abs(norm_squared(psi) - 1), 1e-12);
  EXPECT_LT(right_canonical_error(psi), 1e-12);
  const auto v = dense(psi);
  std::int64_t rows = 1;
  for (int k = 1; k < psi.L; ++k) {
    rows *= psi.d;
    auto lam = psi.bonds[k].lambda;
    std::sort(lam.rbegin(), lam.rend());
    const auto s = schmidt_values(v, rows);
    ASSERT_EQ(lam.size(), s.size()) << "bond " << k;
    for (std::size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(lam[i], s[i], 1e-12);
  }
  // every amplitude outside the charge-5 sector is exactly 0
  for (std::size_t i = 0; i < v.size(); ++i) {
    int total = 0;
    for (std::size_t x = i; x; x /= 3) total += static_cast<int>(x % 3);
    if (total != 5) {
      EXPECT_EQ(v[i], cplx{}) << i;
    }
  }
  // the same seed, the same bits
  const U1Mps again = random_state(6, 3, 5, 10, 42);
  for (int j = 0; j < psi.L; ++j) {
    ASSERT_EQ(psi.sites[j].blocks.size(), again.sites[j].blocks.size());
    for (std::size_t b = 0; b < psi.sites[j].blocks.size(); ++b)
      EXPECT_EQ(psi.sites[j].blocks[b].values, again.sites[j].blocks[b].values);
  }
}

TEST(MpsContainer, BrokenStructureIsReported) {
  U1Mps psi = random_state(4, 2, 2, 4, 1);
  psi.sites[1].blocks[0].c_right = psi.sites[1].blocks[0].c_left + 1;  // negative occupation
  EXPECT_THROW(psi.check_structure(), std::runtime_error);
  U1Mps psi2 = random_state(4, 2, 2, 4, 1);
  psi2.sites[2].blocks[0].rows += 1;
  EXPECT_THROW(psi2.check_structure(), std::runtime_error);
  // a mixed boundary holds each total once, ascending, the largest being total_charge
  const U1Mps mixed = product_superposition(3, {{0.6, 0.8, 0}, {1, 0, 0.5}});
  EXPECT_NO_THROW(mixed.check_structure());
  U1Mps twice = mixed;
  twice.bonds[0].charges[1] = twice.bonds[0].charges[0];
  EXPECT_THROW(twice.check_structure(), std::runtime_error);
  U1Mps wrong_n = mixed;
  wrong_n.total_charge -= 1;
  EXPECT_THROW(wrong_n.check_structure(), std::runtime_error);
}

class MpsUpdate : public ::testing::TestWithParam<int> {};

TEST_P(MpsUpdate, OneUpdateEqualsTheDenseGateOnTheDenseState) {
  const int d = GetParam(), L = 5, j = 1;
  U1Mps psi = random_state(L, d, d == 2 ? 2 : 4, 12, 7);
  const auto before = dense(psi);
  const auto g = exp_minus_i(random_conserving_hamiltonian(d, 3), d * d, 0.4);
  const auto expected = apply_dense(before, g, L, d, j);
  const double eps = update_bond(psi, j, gate_table(g, d, "test gate"), TruncParams{1000, 0, 0});
  EXPECT_LT(eps, 1e-28);
  EXPECT_NO_THROW(psi.check_structure());
  const auto after = dense(psi);
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_LT(std::abs(after[i] - expected[i]), 1e-12) << i;
  // the centre bond's lambda are the Schmidt values of the new state; the form stays right-canonical
  std::int64_t rows = 1;
  for (int k = 0; k < j + 1; ++k) rows *= d;
  auto lam = psi.bonds[j + 1].lambda;
  std::sort(lam.rbegin(), lam.rend());
  const auto s = schmidt_values(expected, rows);
  ASSERT_EQ(lam.size(), s.size());
  for (std::size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(lam[i], s[i], 1e-12);
  EXPECT_LT(right_canonical_error(psi), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(LocalDimensions, MpsUpdate, ::testing::Values(2, 3));

// The same update in complex64: single-precision arithmetic, so it agrees with the dense gate to
// float's rounding (not to 1e-12), and the state differs from the complex128 update's.
TEST_P(MpsUpdate, AComplex64UpdateAgreesWithTheDenseGateToSinglePrecision) {
  const int d = GetParam(), L = 5, j = 1;
  U1Mps psi = random_state(L, d, d == 2 ? 2 : 4, 12, 7), psi128 = psi;
  const auto dense_gate = exp_minus_i(random_conserving_hamiltonian(d, 3), d * d, 0.4);
  const auto g = gate_table(dense_gate, d, "test gate");
  const auto expected = apply_dense(dense(psi), dense_gate, L, d, j);
  update_bond(psi, j, g, TruncParams{1000, 0, 0}, Precision::complex64);
  update_bond(psi128, j, g, TruncParams{1000, 0, 0});
  EXPECT_NO_THROW(psi.check_structure());
  const auto after = dense(psi), after128 = dense(psi128);
  double worst = 0, from128 = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    worst = std::max(worst, std::abs(after[i] - expected[i]));
    from128 = std::max(from128, std::abs(after[i] - after128[i]));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(from128, 1e-10);  // single precision ran
}

// kernels::batched_svd in complex64 (cgesdd) against complex128 (zgesdd) on the same blocks: the
// singular values agree to float's precision and the float Vh rows are orthonormal to it.
TEST(ChargeBlocks, Complex64BatchedSvdAgreesWithComplex128) {
  const auto backend = qstage::detail::make_cpu_backend(std::uint64_t(1) << 40, std::uint64_t(1) << 40);
  const auto stream = backend->make_stream();
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  std::vector<kernels::SvdProblem> problems;
  std::int64_t a_size = 0, s_size = 0, vh_size = 0;
  for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{7, 5}, {4, 9}, {30, 30}, {1, 3}}) {
    problems.push_back({m, n, a_size, s_size, vh_size});
    a_size += m * n, s_size += std::min(m, n), vh_size += std::min(m, n) * n;
  }
  std::vector<kernels::cplx128> a(a_size), vh(vh_size);
  for (auto& x : a) x = {normal(rng), normal(rng)};
  std::vector<kernels::cplx64> af(a.begin(), a.end()), vhf(vh_size);
  std::vector<double> s(s_size);
  std::vector<float> sf(s_size);
  kernels::batched_svd(*stream, a.data(), problems, s.data(), vh.data(), nullptr, 0);
  kernels::batched_svd(*stream, af.data(), problems, sf.data(), vhf.data(), nullptr, 0);
  for (const auto& p : problems) {
    const std::int64_t r = std::min(p.m, p.n);
    for (std::int64_t i = 0; i < r; ++i) EXPECT_NEAR(sf[p.s_offset + i], s[p.s_offset + i], 1e-5 * s[p.s_offset]);
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t k = 0; k < r; ++k) {
        std::complex<double> dot = 0;
        for (std::int64_t c = 0; c < p.n; ++c)
          dot += std::complex<double>(vhf[p.vh_offset + i * p.n + c]) * std::conj(std::complex<double>(vhf[p.vh_offset + k * p.n + c]));
        EXPECT_LT(std::abs(dot - (i == k ? 1.0 : 0.0)), 1e-5);
      }
  }
  // and not the double result's bits: single precision ran
  double diff = 0;
  for (std::int64_t i = 0; i < s_size; ++i) diff = std::max(diff, std::abs(sf[i] - s[i]));
  EXPECT_GT(diff, 0);
}

// A block with a NaN entry fails LAPACK inside batched_svd's OpenMP loop over the blocks: the
// RuntimeFailure comes out of the loop (escaping it, it ended the program with SIGABRT).
TEST(ChargeBlocks, AnSvdThatFailsInsideTheThreadedLoopIsThrown) {
  const auto backend = qstage::detail::make_cpu_backend(std::uint64_t(1) << 40, std::uint64_t(1) << 40);
  const auto stream = backend->make_stream();
  std::vector<kernels::SvdProblem> problems;
  const std::int64_t n = 40;  // 8 blocks of 40 x 40: enough work for the threaded loop
  for (std::int64_t b = 0; b < 8; ++b) problems.push_back({n, n, b * n * n, b * n, b * n * n});
  std::vector<kernels::cplx128> a(8 * n * n, 1.0), vh(8 * n * n);
  std::vector<double> s(8 * n);
  a[problems[5].offset + 7] = std::nan("");
  EXPECT_THROW(kernels::batched_svd(*stream, a.data(), problems, s.data(), vh.data(), nullptr, 0), RuntimeFailure);
}

// The GPU's SVD paths (Jacobi, gesvdp) against the host's ?gesdd on the same blocks, full rank and
// rank deficient (an MPS's Theta blocks often are): singular values to `tol` of the largest, Vh's
// kept rows orthonormal and spanning the row space (A Vh^dagger Vh = A); complex128 to 1e-9 (the
// values to 1e-10), complex64 to 1e-4 (float's Jacobi).
template <typename T>
void check_gpu_svd_paths(double tol, double s_tol) {
  qstage::test::GpuRun gpu;
  const auto cpu = qstage::detail::make_cpu_backend(std::uint64_t(1) << 40, std::uint64_t(1) << 40);
  const auto cpu_stream = cpu->make_stream();
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  std::vector<kernels::SvdProblem> problems;
  std::vector<std::int64_t> ranks;  // 0: full
  std::int64_t a_size = 0, s_size = 0, vh_size = 0;
  for (auto [m, n, rank] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{90, 70, 0}, {70, 90, 0}, {120, 120, 17}, {3, 2, 0}}) {
    problems.push_back({m, n, a_size, s_size, vh_size});
    ranks.push_back(rank);
    a_size += m * n, s_size += std::min(m, n), vh_size += std::min(m, n) * n;
  }
  std::vector<T> a(a_size);
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const auto& p = problems[i];
    if (ranks[i] == 0) {
      for (std::int64_t e = 0; e < p.m * p.n; ++e) a[p.offset + e] = T(normal(rng), normal(rng));
      continue;
    }
    std::vector<T> x(p.m * ranks[i]), y(ranks[i] * p.n);
    for (auto& v : x) v = T(normal(rng), normal(rng));
    for (auto& v : y) v = T(normal(rng), normal(rng));
    kernels::matmul(x.data(), y.data(), a.data() + p.offset, p.m, ranks[i], p.n);
  }
  using R = kernels::Real<T>;
  std::vector<T> host_a = a, host_vh(vh_size);
  std::vector<R> host_s(s_size);
  kernels::batched_svd(*cpu_stream, host_a.data(), problems, host_s.data(), host_vh.data(), nullptr, 0);
  for (const kernels::SvdRouting routing : {kernels::SvdRouting{0, 1 << 30}, kernels::SvdRouting{0, 1}}) {
    const bool polar = routing.polar_from == 1;
    SCOPED_TRACE(polar ? "gesvdp" : "Jacobi");
    Buffer da = gpu.upload(a.data(), a.size() * sizeof(T));
    Buffer ds = gpu.backend->alloc_device(s_size * sizeof(R), "S"), dvh = gpu.backend->alloc_device(vh_size * sizeof(T), "Vh");
    const std::size_t bytes = kernels::svd_workspace_bytes<T>(*gpu.stream, problems, routing);
    Buffer w = gpu.backend->alloc_device(std::max<std::size_t>(bytes, 1), "SVD workspace");
    const kernels::SvdReport rep =
        kernels::batched_svd(*gpu.stream, da.as<T>(), problems, ds.as<R>(), dvh.as<T>(), w.data(), bytes, routing);
    EXPECT_EQ(rep.host, 0);
    // (complex64 keeps to Jacobi)
    const bool to_polar = polar && std::is_same_v<T, kernels::cplx128>;
    EXPECT_EQ(to_polar ? rep.polar : rep.jacobi, static_cast<std::int64_t>(problems.size()) - rep.host_fallbacks);
    const auto s = gpu.download<R>(ds, s_size);
    const auto vh = gpu.download<T>(dvh, vh_size);
    for (std::size_t i = 0; i < problems.size(); ++i) {
      const auto& p = problems[i];
      const std::int64_t r = std::min(p.m, p.n), kept = ranks[i] ? ranks[i] : r;
      const double top = host_s[p.s_offset];
      for (std::int64_t q = 0; q < r; ++q) EXPECT_NEAR(s[p.s_offset + q], host_s[p.s_offset + q], s_tol * top) << "problem " << i << " value " << q;
      // A Vh_k^dagger Vh_k = A with the kept rows, and those rows orthonormal
      double worst = 0;
      for (std::int64_t row = 0; row < p.m; ++row) {
        std::vector<std::complex<double>> proj(p.n);
        for (std::int64_t q = 0; q < kept; ++q) {
          std::complex<double> dot = 0;
          for (std::int64_t c = 0; c < p.n; ++c)
            dot += std::complex<double>(a[p.offset + row * p.n + c]) * std::conj(std::complex<double>(vh[p.vh_offset + q * p.n + c]));
          for (std::int64_t c = 0; c < p.n; ++c) proj[c] += dot * std::complex<double>(vh[p.vh_offset + q * p.n + c]);
        }
        for (std::int64_t c = 0; c < p.n; ++c) worst = std::max(worst, std::abs(proj[c] - std::complex<double>(a[p.offset + row * p.n + c])));
      }
      EXPECT_LT(worst, tol * top) << "problem " << i;
      for (std::int64_t q = 0; q < kept; ++q)
        for (std::int64_t k = 0; k < kept; ++k) {
          std::complex<double> dot = 0;
          for (std::int64_t c = 0; c < p.n; ++c)
            dot += std::complex<double>(vh[p.vh_offset + q * p.n + c]) * std::conj(std::complex<double>(vh[p.vh_offset + k * p.n + c]));
          EXPECT_LT(std::abs(dot - (q == k ? 1.0 : 0.0)), tol) << "problem " << i;
        }
    }
  }
}

TEST(ChargeBlocks, GpuSvdPathsAgreeWithTheHost) {
  REQUIRE_GPU();
  check_gpu_svd_paths<kernels::cplx128>(1e-9, 1e-10);
}
TEST(ChargeBlocks, GpuSvdPathsAgreeWithTheHostInComplex64) {
  REQUIRE_GPU();
  check_gpu_svd_paths<kernels::cplx64>(1e-4, 1e-4);
}

TEST(MpsTruncation, GlobalRankingTiesAndTenpyConstraints) {
  const std::vector<std::vector<double>> s{{0.6, 0.5}, {0.5, 0.3}, {0.2}};
  const double total = 0.36 + 0.25 + 0.25 + 0.09 + 0.04;
  // chi_max 3: 0.6, then the tied 0.5s by block: block 0's, then block 1's.
  Truncation t = truncate(s, {3, 0, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 1, 0}));
  EXPECT_NEAR(t.discarded, (0.09 + 0.04) / total, 1e-15);
  t = truncate(s, {2, 0, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 0, 0}));
  // trunc_cut: drop the smallest while their squares (normalised) sum to <= trunc_cut^2
  t = truncate(s, {100, 0, std::sqrt(0.05 / total)});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 2, 0}));
  t = truncate(s, {100, 0, std::sqrt(0.14 / total)});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 1, 0}));
  // svd_min on the normalised values: 0.3 / norm = 0.30 is kept, 0.2 / norm = 0.2 is not
  t = truncate(s, {100, 0.25, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 2, 0}));
  // a constraint that would keep nothing is not applied
  t = truncate(s, {100, 10.0, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 2, 1}));
  EXPECT_EQ(t.discarded, 0.0);
  // degeneracy_tol: chi_max 2 would split the tied 0.5s, so the cut keeps only 0.6; chi_max 3
  // cuts between 0.5 and 0.3 (log ratio 0.51), allowed at 0.5, not at 0.6
  t = truncate(s, {2, 0, 0, 0, 1e-12});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{1, 0, 0}));
  t = truncate(s, {4, 0, 0, 0, 0.5});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 1, 0}));
  EXPECT_NEAR(t.discarded, (0.09 + 0.04) / total, 1e-15);
  // at 0.6 only keeping all 5 avoids a group, which chi_max 4 excludes: degeneracy_tol is not applied
  t = truncate(s, {4, 0, 0, 0, 0.6});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 2, 0}));
  // chi_min 4 and svd_min 0.45 (which would keep 3) exclude each other: the later, svd_min, is not applied
  t = truncate(s, {100, 0.45, 0, 4, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 2, 1}));
  t = truncate(s, {100, 0.45, 0, 3, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 1, 0}));
  t = truncate(s, {2, 0, 0, 4, 0});
  EXPECT_EQ(t.kept, (std::vector<std::int64_t>{2, 0, 0}));
}

TEST(MpsTruncation, OneTruncatedUpdateKeepsTheLargestSchmidtValuesOverAllCharges) {
  // The dense reference: the gated state's Schmidt values at the centre cut, all charges pooled.
  const int d = 2, L = 6, j = 2;
  U1Mps psi = random_state(L, d, 3, 20, 9);
  const auto g = exp_minus_i(random_conserving_hamiltonian(d, 5), d * d, 0.7);
  const auto expected = apply_dense(dense(psi), g, L, d, j);
  std::int64_t rows = 1;
  for (int k = 0; k < j + 1; ++k) rows *= d;
  const auto s = schmidt_values(expected, rows);  // descending
  ASSERT_GT(s.size(), 4u);
  const std::int64_t chi_max = 3;
  double total = 0, dropped = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    total += s[i] * s[i];
    if (static_cast<std::int64_t>(i) >= chi_max) dropped += s[i] * s[i];
  }
  const double eps = update_bond(psi, j, gate_table(g, d, "test gate"), TruncParams{chi_max, 0, 0});
  EXPECT_NEAR(eps, dropped / total, 1e-12);
  EXPECT_GT(eps, 1e-6);
  // the kept values, renormalised, are the largest three whatever their charges
  auto lam = psi.bonds[j + 1].lambda;
  ASSERT_EQ(static_cast<std::int64_t>(lam.size()), chi_max);
  std::sort(lam.rbegin(), lam.rend());
  for (std::int64_t i = 0; i < chi_max; ++i) EXPECT_NEAR(lam[i], s[i] / std::sqrt(total - dropped), 1e-12);
  // the truncated state is the optimal one: norm 1 and overlap sqrt(1 - eps) with the exact state
  const auto after = dense(psi);
  cplx overlap{};
  double n2 = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    overlap += std::conj(after[i]) * expected[i];
    n2 += std::norm(after[i]);
  }
  EXPECT_NEAR(n2, 1.0, 1e-12);
  EXPECT_NEAR(std::abs(overlap), std::sqrt(1 - eps), 1e-12);
  EXPECT_NO_THROW(psi.check_structure());
}

// ---------------------------------------------------------------- bosons and linear optics

namespace {

double max_distance(const std::vector<cplx>& a, const std::vector<cplx>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

}  // namespace

TEST(MpsOptics, HaarUnitaryIsUnitaryAndItsBeamSplittersRebuildIt) {
  for (int M : {2, 3, 6, 9}) {
    const auto U = haar_unitary(M, 40 + M);
    std::vector<cplx> udu(static_cast<std::size_t>(M * M));
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < M; ++j)
        for (int k = 0; k < M; ++k) udu[i * M + j] += std::conj(U[k * M + i]) * U[k * M + j];
    for (int i = 0; i < M; ++i) udu[i * M + i] -= 1.0;
    EXPECT_LT(max_distance(udu, std::vector<cplx>(udu.size())), 1e-13) << M;
    const auto bs = decompose_unitary(U, M);
    EXPECT_EQ(static_cast<int>(bs.size()), M * (M - 1) / 2);
    for (const auto& b : bs) EXPECT_TRUE(b.mode >= 0 && b.mode + 1 < M);
    EXPECT_LT(max_distance(interferometer_unitary(bs, M), U), 1e-12) << M;
  }
  // another seed, another unitary; the same seed, the same bits
  EXPECT_GT(max_distance(haar_unitary(4, 1), haar_unitary(4, 2)), 0.1);
  EXPECT_EQ(haar_unitary(4, 1), haar_unitary(4, 1));
}

TEST(MpsOptics, BeamSplitterGateActsAsItsModeMatrixBelowTheCut) {
  const BeamSplitter b{0, 0.61, 1.3, 0.4, -0.9};
  const int d = 3, dd = d * d;
  const auto g = beam_splitter_gate(b, d);
  const auto u = interferometer_unitary({b}, 2);  // 2 x 2
  auto amp = [&](int la, int lb, int na, int nb) { return g[(la * d + lb) * dd + na * d + nb]; };
  // one photon: a+ -> u00 a+ + u10 b+
  EXPECT_LT(std::abs(amp(1, 0, 1, 0) - u[0]), 1e-14);
  EXPECT_LT(std::abs(amp(0, 1, 1, 0) - u[2]), 1e-14);
  EXPECT_LT(std::abs(amp(1, 0, 0, 1) - u[1]), 1e-14);
  // two photons |1,1> -> (u00 a+ + u10 b+)(u01 a+ + u11 b+)|0>
  EXPECT_LT(std::abs(amp(2, 0, 1, 1) - std::sqrt(2.0) * u[0] * u[1]), 1e-14);
  EXPECT_LT(std::abs(amp(1, 1, 1, 1) - (u[0] * u[3] + u[2] * u[1])), 1e-14);
  EXPECT_LT(std::abs(amp(0, 2, 1, 1) - std::sqrt(2.0) * u[2] * u[3]), 1e-14);
  // |2,0> -> (u00 a+ + u10 b+)^2 / sqrt 2
  EXPECT_LT(std::abs(amp(1, 1, 2, 0) - std::sqrt(2.0) * u[0] * u[2]), 1e-14);
  // unitary on the pair totals n <= d-1, and losing amplitude above (|2,2> leaks to |4,0>, |0,4>...)
  for (int c = 0; c < dd; ++c) {
    double col = 0;
    for (int r = 0; r < dd; ++r) col += std::norm(g[r * dd + c]);
    if (c / d + c % d <= d - 1) EXPECT_NEAR(col, 1.0, 1e-14) << c;
    else EXPECT_LT(col, 1.0 - 1e-3) << c;
  }
  EXPECT_NO_THROW(gate_table(g, d, "beam splitter"));
}

TEST(MpsOptics, SqueezedVacuumHasItsPhotonStatistics) {
  const double r = 0.8, t = std::tanh(r);
  const auto a = squeezed_vacuum(r, 0.3, 80);
  double total = 0, mean = 0, p = 1 / std::cosh(r);  // P(2n) = C(2n, n) 4^-n t^2n / cosh r
  for (int n = 0; 2 * n < 80; ++n) {
    EXPECT_NEAR(std::norm(a[2 * n]), p, 1e-15) << n;
    EXPECT_EQ(a[2 * n + 1], cplx{});
    p *= (2 * n + 1.0) * (2 * n + 2.0) / ((n + 1.0) * (n + 1.0)) / 4 * t * t;
    total += std::norm(a[2 * n]);
    mean += 2 * n * std::norm(a[2 * n]);
  }
  EXPECT_NEAR(total, 1.0, 1e-13);
  EXPECT_NEAR(mean, std::sinh(r) * std::sinh(r), 1e-12);
  // the phase: <2|psi> / <0|psi> = -e^{i phase} tanh r / sqrt 2
  EXPECT_LT(std::abs(a[2] / a[0] + std::polar(t, 0.3) / std::sqrt(2.0)), 1e-15);
}

TEST(MpsContainer, MixedBoundaryProductIsCanonicalWithPOfNOnBondZero) {
  // Three modes of superpositions (d = 3): the total N ranges over 0..6 with gaps filled in.
  const int d = 3;
  const std::vector<std::vector<cplx>> amps = {{0.6, cplx{0, 0.8}, 0}, {0.3, 0, cplx{0.4, -0.2}}, {1, 0.5, cplx{-0.3, 0.1}}};
  const U1Mps psi = product_superposition(d, amps);
  EXPECT_NO_THROW(psi.check_structure());
  EXPECT_GT(psi.bonds[0].size(), 1);
  EXPECT_EQ(psi.total_charge, 5);
  EXPECT_LT(right_canonical_error(psi), 1e-13);
  EXPECT_NEAR(norm_squared(psi), 1.0, 1e-13);
  // the dense state is the normalised product
  std::vector<cplx> expected(27);
  double n2 = 0;
  std::vector<double> pn(6), left(6), occ(3);
  for (int i = 0; i < 27; ++i) {
    expected[i] = amps[0][i / 9] * amps[1][i / 3 % 3] * amps[2][i % 3];
    n2 += std::norm(expected[i]);
  }
  for (auto& v : expected) v /= std::sqrt(n2);
  EXPECT_LT(max_distance(dense(psi), expected), 1e-14);
  for (int i = 0; i < 27; ++i) {
    const int a = i / 9, b = i / 3 % 3, c = i % 3;
    pn[a + b + c] += std::norm(expected[i]);
    left[a] += std::norm(expected[i]);  // bond 1: sites 0..0
    occ[0] += a * std::norm(expected[i]), occ[1] += b * std::norm(expected[i]), occ[2] += c * std::norm(expected[i]);
  }
  const auto p0 = total_charge_distribution(psi), p1 = charge_distribution(psi, 1), n = densities(psi);
  ASSERT_EQ(p0.size(), 6u);
  ASSERT_EQ(p1.size(), 6u);
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(p0[k], pn[k], 1e-14) << k;
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(p1[k], left[k], 1e-14) << k;
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(n[j], occ[j], 1e-14) << j;
}

TEST(MpsModels, BoseHubbardBondTermHasItsMatrixElements) {
  const int d = 4, dd = d * d;
  const double J = 0.7, U = 2.5, mu = 0.4;
  const auto h = bose_hubbard_bond_hamiltonian(d, J, U, mu, 1.0, 0.5);
  auto at = [&](int la, int lb, int na, int nb) { return h[(la * d + lb) * dd + na * d + nb]; };
  EXPECT_EQ(at(3, 1, 2, 2), cplx(-J * std::sqrt(3.0 * 2.0)));  // b+_l b_r |2,2> = sqrt(3) sqrt(2) |3,1>
  EXPECT_EQ(at(0, 1, 1, 0), cplx(-J));
  EXPECT_NEAR(at(2, 3, 2, 3).real(), (U / 2 * 2 - mu * 2) + 0.5 * (U / 2 * 6 - mu * 3), 1e-15);
  for (int r = 0; r < dd; ++r)
    for (int c = 0; c < dd; ++c) EXPECT_EQ(h[r * dd + c], std::conj(h[c * dd + r]));
  EXPECT_NO_THROW(gate_table(exp_minus_i(h, dd, 0.1), d, "Bose-Hubbard gate"));
}

TEST(U1Math, PairChargesEncodeSortAndLookUpTheGatePerComponent) {
  using kernels::pair_key;
  const kernels::ChargeRule rule{kernels::ChargeKind::n_pair, 3};
  // keys sort by N_ket, then N_bra, and add componentwise
  EXPECT_LT(pair_key(1, 7), pair_key(2, 0));
  EXPECT_EQ(pair_key(1, 2) + pair_key(3, 4), pair_key(4, 6));
  EXPECT_EQ(kernels::pair_ket(pair_key(5, 9)), 5);
  EXPECT_EQ(kernels::pair_bra(pair_key(5, 9)), 9);
  EXPECT_TRUE(rule.allowed(pair_key(3, 2), pair_key(1, 2)));
  EXPECT_FALSE(rule.allowed(pair_key(3, 2), pair_key(0, 2)));  // ket occupation 3 > d - 1
  EXPECT_FALSE(rule.allowed(pair_key(3, 1), pair_key(3, 2)));  // bra occupation -1
  EXPECT_EQ(rule.local(pair_key(3, 2), pair_key(1, 1)), 2 * 3 + 1);
  EXPECT_EQ(pair_key(1, 1) + rule.delta(2 * 3 + 1), pair_key(3, 2));
  // the entry is u(ket) conj(u(bra)), each the n kind's lookup of its component
  std::vector<cplx> u(27);
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = cplx(0.1 * i, 0.3 - 0.05 * i);
  const cplx got = rule.gate_value(u.data(), pair_key(5, 4), pair_key(3, 2), pair_key(4, 3), pair_key(2, 1));
  EXPECT_EQ(got, u[kernels::gate_entry_for_charges(5, 3, 4, 2, 3)] * std::conj(u[kernels::gate_entry_for_charges(4, 2, 3, 1, 3)]));
  EXPECT_EQ(rule.gate_value(u.data(), pair_key(5, 4), pair_key(3, 2), pair_key(5, 3), pair_key(2, 1)), cplx{});  // ket leaves the cut
  const kernels::ChargeRule n{kernels::ChargeKind::n, 3};
  EXPECT_EQ(n.gate_value(u.data(), 5, 3, 4, 2), u[kernels::gate_index(2, 1, 1, 3)]);
}

TEST(MpsUpdate, AnNPairUpdateIsTheGateOnBothSidesOfTheDensityMatrix) {
  // rho = product of random Hermitian single-mode matrices (d = 3), vectorised; one update with a
  // conserving unitary G must give G rho G^dagger, and the weight keeps rho's scale.
  const int d = 3, L = 3, j = 1;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<cplx>> modes, rhos;
  for (int s = 0; s < L; ++s) {
    std::vector<cplx> a(d);
    for (auto& x : a) x = {u(rng), u(rng)};
    std::vector<cplx> rho(d * d);
    for (int p = 0; p < d; ++p)
      for (int q = 0; q < d; ++q) rho[p * d + q] = a[p] * std::conj(a[q]) + (p == q ? 0.5 : 0.0);
    rhos.push_back(rho);
    modes.push_back(rho);
  }
  U1Mps psi = product_superposition(d, modes, kernels::ChargeKind::n_pair);
  EXPECT_NO_THROW(psi.check_structure());
  // the dense vectorised state, local index n_ket d + n_bra: an MPS of local dimension d^2
  auto vectorised = [&](const U1Mps& m) {
    // rows are configurations of the sites so far, columns the bond's indices
    std::vector<cplx> cur(m.bonds[0].lambda.begin(), m.bonds[0].lambda.end());
    std::int64_t configs = 1, chi = m.bonds[0].size();
    for (int s = 0; s < L; ++s) {
      const std::int64_t chi_r = m.bonds[s + 1].size();
      std::vector<cplx> next(static_cast<std::size_t>(configs * d * d * chi_r));
      for (const Block& b : m.sites[s].blocks) {
        const Sector l = m.bonds[s].sector(b.c_left), r = m.bonds[s + 1].sector(b.c_right);
        const int loc = m.rule().local(b.c_left, b.c_right);
        for (std::int64_t c = 0; c < configs; ++c)
          for (std::int64_t a = 0; a < b.rows; ++a)
            for (std::int64_t q = 0; q < b.cols; ++q)
              next[(c * d * d + loc) * chi_r + r.offset + q] += cur[c * chi + l.offset + a] * b.values[a * b.cols + q];
      }
      cur = std::move(next);
      configs *= d * d;
      chi = chi_r;
    }
    for (auto& x : cur) x *= m.weight;
    return cur;
  };
  const auto before = vectorised(psi);
  // the product itself: entry (k0 b0, k1 b1, k2 b2) = prod rho_s[k_s, b_s]
  for (int i = 0; i < 729; ++i) {
    const int s0 = i / 81, s1 = (i / 9) % 9, s2 = i % 9;
    EXPECT_LT(std::abs(before[i] - rhos[0][s0] * rhos[1][s1] * rhos[2][s2]), 1e-13) << i;
  }
  const auto g = exp_minus_i(random_conserving_hamiltonian(d, 11), d * d, 0.7);
  update_bond(psi, j, gate_table(g, d, "test gate"), TruncParams{1000, 0, 0});
  EXPECT_NO_THROW(psi.check_structure());
  const auto after = vectorised(psi);
  // G rho G^dagger on modes 1, 2: new (k1 k2, b1 b2) = sum G[k1 k2, k1' k2'] rho[..] conj(G[b1 b2, b1' b2'])
  for (int k0 = 0; k0 < d; ++k0)
    for (int b0 = 0; b0 < d; ++b0)
      for (int kk = 0; kk < d * d; ++kk)
        for (int bb = 0; bb < d * d; ++bb) {
          cplx want{};
          for (int kp = 0; kp < d * d; ++kp)
            for (int bp = 0; bp < d * d; ++bp) {
              const cplx r = rhos[0][k0 * d + b0] * rhos[1][(kp / d) * d + bp / d] * rhos[2][(kp % d) * d + bp % d];
              want += g[kk * d * d + kp] * r * std::conj(g[bb * d * d + bp]);
            }
          const int idx = ((k0 * d + b0) * d * d + (kk / d) * d + bb / d) * d * d + (kk % d) * d + bb % d;
          EXPECT_LT(std::abs(after[idx] - want), 1e-12) << idx;
        }
}

namespace {

bool same_state(const U1Mps& a, const U1Mps& b) {
  if (a.sites.size() != b.sites.size() || a.weight != b.weight) return false;
  for (std::size_t j = 0; j < a.bonds.size(); ++j)
    if (a.bonds[j].charges != b.bonds[j].charges || a.bonds[j].lambda != b.bonds[j].lambda) return false;
  for (std::size_t j = 0; j < a.sites.size(); ++j) {
    if (a.sites[j].blocks.size() != b.sites[j].blocks.size()) return false;
    for (std::size_t i = 0; i < a.sites[j].blocks.size(); ++i) {
      const Block &x = a.sites[j].blocks[i], &y = b.sites[j].blocks[i];
      if (x.c_left != y.c_left || x.c_right != y.c_right || x.rows != y.rows || x.cols != y.cols || x.values != y.values) return false;
    }
  }
  return true;
}

// Every bond of a chain updated twice on `backend`: with the whole device (one piece) and with the
// smallest share (from 64 MiB down by tenths) at which every update still runs, so that most go in groups
// of centre charges; the states must be equal bit for bit. Below that share, BudgetExceeded.
// (with every block on cuSOLVER (gpu_svd_from 0) its workspace, alike for every block, dominates:
// the updates are parked but may keep one group: `split` false)
void check_grouped_updates(Backend& backend, const U1Mps& start, const GateTable& gate, const TruncParams& trunc,
                           std::int64_t gpu_svd_from = kernels::kGpuSvdFrom, bool split = true) {
  U1Mps psi = start;
  BondUpdater whole(backend, gpu_svd_from);
  std::vector<double> eps, norms;
  for (int j = 0; j + 1 < psi.L; ++j) {
    eps.push_back(whole.update(psi, j, gate, trunc));
    norms.push_back(whole.last_norm());
  }
  EXPECT_EQ(whole.timings().grouped, 0);
  std::uint64_t share = 1u << 26;
  for (;; share = share * 9 / 10) {
    U1Mps grouped = start;
    BondUpdater parts(backend, gpu_svd_from);
    parts.set_device_share(share * 9 / 10);
    try {
      for (int j = 0; j + 1 < grouped.L; ++j) parts.update(grouped, j, gate, trunc);
    } catch (const BudgetExceeded&) {
      break;
    }
    ASSERT_GT(share, 64u);
  }
  U1Mps grouped = start;
  BondUpdater parts(backend, gpu_svd_from);
  parts.set_device_share(share);
  for (int j = 0; j + 1 < grouped.L; ++j) {
    EXPECT_EQ(parts.update(grouped, j, gate, trunc), eps[j]) << "bond " << j;
    EXPECT_EQ(parts.last_norm(), norms[j]) << "bond " << j;
  }
  EXPECT_TRUE(same_state(psi, grouped));
  EXPECT_GE(parts.timings().grouped, 1) << "share " << share;
  if (split) EXPECT_GT(parts.timings().groups, parts.timings().updates) << "share " << share;
}

}  // namespace

// An update larger than its device share goes in groups of centre charges, with C and Vh parked
// on the host between the passes: the same bits as in one piece (spin chain, untruncated and
// truncated across the groups; bosons at d = 3; the density matrix's pair charges).
TEST(MpsUpdate, UpdatesInGroupsOfCentreChargesEqualThemInOnePiece) {
  auto cpu = detail::make_cpu_backend(1ull << 32, 1ull << 32);
  const auto xx = gate_table(exp_minus_i(random_conserving_hamiltonian(2, 5), 4, 0.3), 2, "test gate");
  check_grouped_updates(*cpu, random_state(10, 2, 5, 32, 3), xx, TruncParams{1000, 0, 0});
  check_grouped_updates(*cpu, random_state(10, 2, 5, 32, 3), xx, TruncParams{20, 1e-10, 0});
  const auto boson = gate_table(exp_minus_i(random_conserving_hamiltonian(3, 9), 9, 0.5), 3, "test gate");
  check_grouped_updates(*cpu, random_state(8, 3, 8, 30, 4), boson, TruncParams{1000, 0, 0});
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::vector<cplx>> rhos;
  for (int s = 0; s < 6; ++s) {
    std::vector<cplx> rho(9);
    for (auto& x : rho) x = {u(rng), u(rng)};
    rhos.push_back(rho);
  }
  U1Mps rho = product_superposition(3, rhos, kernels::ChargeKind::n_pair);
  // (two layers first, so that the bonds have several sectors)
  BondUpdater grow(*cpu);
  for (int j = 0; j + 1 < rho.L; ++j) grow.update(rho, j, boson, TruncParams{1000, 0, 0});
  for (int j = rho.L - 2; j >= 0; --j) grow.update(rho, j, boson, TruncParams{1000, 0, 0});
  check_grouped_updates(*cpu, rho, boson, TruncParams{1000, 0, 0});
}

// A layer's updates share the device budget, each lent what its estimate asks (LayerUpdater's
// UpdaterSlots): at every budget from ample down to the smallest at which the layers still run,
// the bits are those of the updates one after the other on one updater with the whole device. At
// the smallest, the largest update cannot run beside another (its estimate and margin exceed the
// budget) and runs alone after the others; below it, the budget is too small (InputError).
TEST(MpsLayer, UpdatesSharingTheDeviceBudgetGiveTheBitsOfUpdatesAlone) {
  const auto xx = gate_table(exp_minus_i(random_conserving_hamiltonian(2, 5), 4, 0.3), 2, "test gate");
  const U1Mps start = random_state(12, 2, 6, 48, 5);
  const TruncParams trunc{40, 1e-12, 0};
  std::vector<LayerUpdater::BondGate> even, odd;
  for (int j = 0; j + 1 < start.L; ++j) (j % 2 ? odd : even).push_back({j, &xx});
  U1Mps alone = start;
  double alone_eps = 0;
  {
    auto cpu = detail::make_cpu_backend(1ull << 34, 1ull << 34);
    BondUpdater one(*cpu);
    for (const auto* layer : {&even, &odd})
      for (const auto& u : *layer) alone_eps += one.update(alone, u.bond, xx, trunc);
  }
  const int saved = omp_get_max_threads();
  omp_set_num_threads(4);
  std::int64_t alone_at_smallest = -1;
  bool too_small = false;
  for (std::uint64_t budget = 1ull << 24; budget > 1024 && !too_small; budget = budget * 19 / 20) {
    auto cpu = detail::make_cpu_backend(budget, 1ull << 34);
    LayerUpdater layer(*cpu);
    U1Mps psi = start;
    double eps = 0;
    try {
      layer.apply(psi, even, trunc, eps);
      layer.apply(psi, odd, trunc, eps);
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("too small for one two-site update"), std::string::npos) << e.what();
      too_small = true;
      break;
    }
    EXPECT_TRUE(same_state(psi, alone)) << "budget " << budget;
    EXPECT_EQ(eps, alone_eps) << "budget " << budget;
    EXPECT_LE(layer.sharing().most_at_once, 4);
    EXPECT_EQ(layer.sharing().alone_by_pool, 0) << "budget " << budget;
    alone_at_smallest = layer.sharing().alone;
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(too_small);
  EXPECT_GE(alone_at_smallest, 1);
}

// A host budget too small for one update's staging and parked blocks is named as such (the
// device share halved eight times used to take the blame, with the device budget's message).
TEST(MpsUpdate, AHostBudgetTooSmallForOneUpdateIsReportedAsTheHostBudget) {
  auto cpu = detail::make_cpu_backend(1ull << 20, 1ull << 12);
  const auto xx = gate_table(exp_minus_i(random_conserving_hamiltonian(2, 5), 4, 0.3), 2, "test gate");
  U1Mps psi = random_state(10, 2, 5, 32, 3);
  LayerUpdater layer(*cpu);
  double eps = 0;
  try {
    layer.apply(psi, {{4, &xx}}, TruncParams{1000, 0, 0}, eps);
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("host budget is too small for one two-site update (sites 4 and 5)"), std::string::npos) << what;
    EXPECT_NE(what.find("--host-memory"), std::string::npos) << what;
  }
}

TEST(MpsUpdate, UpdatesInGroupsOfCentreChargesEqualThemInOnePieceOnTheGpu) {
  REQUIRE_GPU();
  auto gpu = make_backend({"cuda", 1ull << 32, 1ull << 32, 0});
  const auto xx = gate_table(exp_minus_i(random_conserving_hamiltonian(2, 5), 4, 0.3), 2, "test gate");
  check_grouped_updates(*gpu, random_state(10, 2, 5, 32, 3), xx, TruncParams{20, 1e-10, 0});
  const auto boson = gate_table(exp_minus_i(random_conserving_hamiltonian(3, 9), 9, 0.5), 3, "test gate");
  check_grouped_updates(*gpu, random_state(8, 3, 8, 30, 4), boson, TruncParams{1000, 0, 0});
  // every block by cuSOLVER's Jacobi (gpu_svd_from 0), its workspace within the groups' shares
  check_grouped_updates(*gpu, random_state(10, 2, 5, 32, 3), xx, TruncParams{20, 1e-10, 0}, 0, false);
  // One at a time with a share just below what the blocks need with their Jacobi workspaces: they
  // are decomposed on the host instead (LAPACK's bits: agreement to rounding), where without that
  // the update is BudgetExceeded.
  const U1Mps start = random_state(10, 2, 5, 32, 3);
  auto runs_at = [&](std::uint64_t share, bool host_when_short, U1Mps& psi, BondUpdater* keep = nullptr) {
    BondUpdater local(*gpu, 0);
    BondUpdater& u = keep ? *keep : local;
    u.set_device_share(share), u.set_host_svd_when_short(host_when_short);
    psi = start;
    try {
      for (int j = 0; j + 1 < psi.L; ++j) u.update(psi, j, xx, TruncParams{1000, 0, 0});
    } catch (const BudgetExceeded&) {
      return false;
    }
    return true;
  };
  U1Mps on_gpu = start, on_host = start;
  std::uint64_t share = 1u << 24;
  while (runs_at(share * 9 / 10, false, on_gpu)) share = share * 9 / 10;
  ASSERT_TRUE(runs_at(share, false, on_gpu));
  BondUpdater short_of_memory(*gpu, 0);
  ASSERT_TRUE(runs_at(share * 9 / 10, true, on_host, &short_of_memory)) << "share " << share;
  EXPECT_GT(short_of_memory.timings().svd_for_memory, 0);
  const auto a = dense(on_gpu), b = dense(on_host);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_LT(std::abs(a[i] - b[i]), 1e-12) << i;
}

namespace {

// A hand-made gather-form problem (particle numbers, d = 2): left sectors 2 and 3, old centre
// sectors 1 to 3, right sectors 1 and 2, the new centre blocks 1 to 3, every pair of outer
// sectors with its old centres as terms, random site blocks and gate table.
struct TileProblem {
  kernels::ChargeRule rule{kernels::ChargeKind::n, 2};
  std::vector<std::pair<int, std::int64_t>> left{{2, 9}, {3, 14}}, mid{{1, 5}, {2, 11}, {3, 7}}, right{{1, 12}, {2, 6}};
  std::vector<kernels::TilePair> pairs;
  std::vector<kernels::TileTerm> terms;
  std::vector<std::int64_t> block_offset, block_cols;
  std::vector<std::int32_t> rows_of, cols_of, block_at;
  std::vector<std::int64_t> block_rows;
  std::vector<cplx> sites, gate;
  std::int64_t c_size = 0;
  std::map<std::pair<int, int>, std::int64_t> x_at, y_at;  // packed site blocks (l, mid) and (mid, r)

  TileProblem() {
    std::mt19937_64 rng(17);
    std::normal_distribution<double> g;
    const int D = rule.local_dim();
    for (int c = 1; c <= 3; ++c) {
      std::int64_t m = 0, n = 0;
      std::vector<std::int32_t> r0(D, -1), c0(D, -1);
      for (auto [l, size] : left)
        if (rule.allowed(l, c)) r0[rule.local(l, c)] = static_cast<std::int32_t>(m), m += size;
      for (auto [r, size] : right)
        if (rule.allowed(c, r)) c0[rule.local(c, r)] = static_cast<std::int32_t>(n), n += size;
      block_at.push_back(static_cast<std::int32_t>(block_offset.size()));
      block_offset.push_back(c_size), block_cols.push_back(n), block_rows.push_back(m);
      rows_of.insert(rows_of.end(), r0.begin(), r0.end()), cols_of.insert(cols_of.end(), c0.begin(), c0.end());
      c_size += m * n;
    }
    auto pack = [&](std::int64_t count) {
      const auto at = static_cast<std::int64_t>(sites.size());
      for (std::int64_t e = 0; e < count; ++e) sites.emplace_back(g(rng), g(rng));
      return at;
    };
    for (auto [l, m] : left)
      for (auto [q, k] : mid)
        if (rule.allowed(l, q)) x_at[{l, q}] = pack(m * k);
    for (auto [q, k] : mid)
      for (auto [r, n] : right)
        if (rule.allowed(q, r)) y_at[{q, r}] = pack(k * n);
    for (auto [l, m] : left)
      for (auto [r, n] : right) {
        kernels::TilePair p{l, r, m, n, static_cast<std::int64_t>(terms.size()), 0};
        for (auto [q, k] : mid)
          if (rule.allowed(l, q) && rule.allowed(q, r)) terms.push_back({x_at[{l, q}], y_at[{q, r}], k, q}), ++p.terms;
        if (p.terms > 0) pairs.push_back(p);
      }
    for (int e = 0; e < D * D * D; ++e) gate.emplace_back(g(rng), g(rng));
  }
  kernels::TileTables tables() const {
    kernels::TileTables t;
    t.rule = rule, t.ket0 = 1, t.kets = 3;
    t.block_offset = block_offset.data(), t.block_cols = block_cols.data();
    t.rows_of = rows_of.data(), t.cols_of = cols_of.data(), t.block_at = block_at.data();
    return t;
  }
  // Theta's blocks by plain loops: C(c)[l, r] = sum over old centres of the gate entry times X Y.
  std::vector<cplx> reference() const {
    std::vector<cplx> c(static_cast<std::size_t>(c_size));
    for (int b = 0; b < 3; ++b) {
      const int centre = b + 1;
      for (auto [l, m] : left)
        for (auto [r, n] : right) {
          if (!rule.allowed(l, centre) || !rule.allowed(centre, r)) continue;
          const std::int64_t r0 = rows_of[b * 2 + rule.local(l, centre)], c0 = cols_of[b * 2 + rule.local(centre, r)];
          for (auto [q, k] : mid) {
            if (!rule.allowed(l, q) || !rule.allowed(q, r)) continue;
            const cplx u = rule.gate_value(gate.data(), l, q, centre, r);
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                cplx sum{};
                for (std::int64_t z = 0; z < k; ++z) sum += sites[x_at.at({l, q}) + i * k + z] * sites[y_at.at({q, r}) + z * n + j];
                c[block_offset[b] + (r0 + i) * block_cols[b] + c0 + j] += u * sum;
              }
          }
        }
    }
    return c;
  }
};

}  // namespace

// Rounds take consecutive wide pairs up to the limit (a pair larger than it alone), and each
// pair's products and mixing items start where the previous pair's end.
TEST(ChargeTiles, RoundsTakeConsecutivePairsUpToTheLimit) {
  std::vector<kernels::TilePair> wide{{0, 0, 4, 5, 0, 3}, {0, 0, 2, 2, 0, 1}, {0, 0, 10, 10, 0, 2}, {0, 0, 1, 3, 0, 2}};
  const auto rounds = kernels::plan_tile_rounds(wide, 4, 70);
  ASSERT_EQ(rounds.size(), 3u);  // 60 + 4 | 200 alone | 6
  EXPECT_EQ(rounds[0].first, 0);
  EXPECT_EQ(rounds[0].count, 2);
  EXPECT_EQ(rounds[0].products, 64);
  EXPECT_EQ(rounds[0].mixes, 96);
  EXPECT_EQ(rounds[1].first, 2);
  EXPECT_EQ(rounds[1].count, 1);
  EXPECT_EQ(rounds[1].products, 200);
  EXPECT_EQ(rounds[2].first, 3);
  EXPECT_EQ(rounds[2].count, 1);
  EXPECT_EQ(rounds[2].products, 6);
  EXPECT_EQ(wide[1].work, 60);
  EXPECT_EQ(wide[1].mix, 80);
  EXPECT_EQ(wide[2].work, 0);
  EXPECT_EQ(wide[3].mix, 0);
}

// The CPU twin against plain loops, every pair alike (shared-memory or wide).
TEST(ChargeTiles, TheCpuTwinSumsTheGateWeightedProducts) {
  TileProblem pr;
  const auto want = pr.reference();
  const auto cpu = qstage::detail::make_cpu_backend(std::uint64_t(1) << 30, std::uint64_t(1) << 30);
  const auto stream = cpu->make_stream();
  for (const bool wide : {false, true}) {
    kernels::TileTables t = pr.tables();
    std::vector<kernels::TilePair> pairs = pr.pairs;
    const auto rounds = wide ? kernels::plan_tile_rounds(pairs, 2, 1) : std::vector<kernels::TileRound>{};
    (wide ? t.wide : t.pairs) = pairs.data();
    (wide ? t.wide_count : t.pair_count) = static_cast<std::int64_t>(pairs.size());
    t.terms = pr.terms.data();
    std::vector<cplx> c(static_cast<std::size_t>(pr.c_size));
    kernels::charge_tiles(*stream, pr.sites.data(), pr.gate.data(), t, rounds, c.data(), static_cast<cplx*>(nullptr));
    for (std::size_t e = 0; e < c.size(); ++e) EXPECT_LT(std::abs(c[e] - want[e]), 1e-12) << (wide ? "wide " : "") << e;
  }
}

// On the GPU a pair gives the same bits in shared memory as wide, in one round or in a round
// each, and the CPU's values to rounding.
TEST(ChargeTiles, AWidePairGivesTheBitsOfASharedMemoryPairInAnyRounds) {
  REQUIRE_GPU();
  TileProblem pr;
  const auto want = pr.reference();
  test::GpuRun gpu;
  Buffer sites = gpu.upload(pr.sites.data(), pr.sites.size() * sizeof(cplx)), gate = gpu.upload(pr.gate.data(), pr.gate.size() * sizeof(cplx));
  Buffer terms = gpu.upload(pr.terms.data(), pr.terms.size() * sizeof(kernels::TileTerm));
  Buffer offsets = gpu.upload(pr.block_offset.data(), pr.block_offset.size() * 8), cols = gpu.upload(pr.block_cols.data(), pr.block_cols.size() * 8);
  Buffer rows_of = gpu.upload(pr.rows_of.data(), pr.rows_of.size() * 4), cols_of = gpu.upload(pr.cols_of.data(), pr.cols_of.size() * 4);
  Buffer block_at = gpu.upload(pr.block_at.data(), pr.block_at.size() * 4);
  std::vector<std::vector<cplx>> results;
  for (const std::int64_t limit : {std::int64_t{0}, std::int64_t{1} << 30, std::int64_t{1}}) {  // 0: in shared memory
    std::vector<kernels::TilePair> pairs = pr.pairs;
    kernels::TileTables t = pr.tables();
    std::vector<kernels::TileRound> rounds;
    if (limit > 0) rounds = kernels::plan_tile_rounds(pairs, 2, limit);
    std::int64_t largest = 0, products = 0;
    for (const auto& p : pairs) largest = std::max(largest, p.terms * p.m * p.n);
    for (const auto& r : rounds) products = std::max(products, r.products);
    Buffer dpairs = gpu.upload(pairs.data(), pairs.size() * sizeof(kernels::TilePair));
    t.terms = terms.as<kernels::TileTerm>(), t.block_offset = offsets.as<std::int64_t>(), t.block_cols = cols.as<std::int64_t>();
    t.rows_of = rows_of.as<std::int32_t>(), t.cols_of = cols_of.as<std::int32_t>(), t.block_at = block_at.as<std::int32_t>();
    (limit > 0 ? t.wide : t.pairs) = dpairs.as<kernels::TilePair>();
    (limit > 0 ? t.wide_count : t.pair_count) = static_cast<std::int64_t>(pairs.size());
    t.max_terms_mn = limit > 0 ? 0 : largest;
    const std::vector<cplx> zeros(static_cast<std::size_t>(pr.c_size));
    Buffer c = gpu.upload(zeros.data(), zeros.size() * sizeof(cplx));
    Buffer work = gpu.backend->alloc_device(std::max<std::int64_t>(products, 1) * sizeof(cplx), "test workspace");
    kernels::charge_tiles(*gpu.stream, sites.as<cplx>(), gate.as<cplx>(), t, rounds, c.as<cplx>(), work.as<cplx>());
    if (limit == 1) EXPECT_EQ(rounds.size(), pairs.size());
    results.push_back(gpu.download<cplx>(c, zeros.size()));
  }
  for (std::size_t e = 0; e < want.size(); ++e) {
    EXPECT_LT(std::abs(results[0][e] - want[e]), 1e-12) << e;
    EXPECT_EQ(results[1][e], results[0][e]) << e;
    EXPECT_EQ(results[2][e], results[0][e]) << e;
  }
}
