// Selected CI's numerical core against independent oracles: Slater–Condon elements and phases
// against a brute-force second-quantized Hamiltonian (Jordan–Wigner signs on 2n spin-orbitals),
// generation against the brute-force couplings (complete, exact values, screening exact), and
// full-space Davidson against the FCI energies of the test FCIDUMPs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "kernels/sci/sci_generate.hpp"
#include "kernels/sci/sci_score.hpp"
#include "kernels/sci/sci_space_pairs.hpp"
#include "stages/sci/davidson.hpp"
#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"
#include "stages/sci/resident_space.hpp"
#include "test_util.hpp"
#include "test_data.hpp"

using namespace qstage;
using kernels::sci::Candidate;
using kernels::sci::Det;

namespace {

sci::Integrals random_integrals(int norb, int nelec, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  sci::Integrals ints;
  ints.norb = norb;
  ints.nelec = nelec;
  ints.core = 0.37;
  ints.h1.assign(norb * norb, 0);
  for (int p = 0; p < norb; ++p)
    for (int q = 0; q <= p; ++q) ints.h1[p * norb + q] = ints.h1[q * norb + p] = u(rng);
  ints.eri.resize(sci::packed_eri_size(norb));
  for (double& v : ints.eri) v = 0.5 * u(rng);
  ints.orbsym.assign(norb, 1);
  return ints;
}

// Spin-orbital occupation: bits 0..n-1 alpha, n..2n-1 beta.
std::uint64_t spin_bits(const Det& d, int n) { return d.alpha | (d.beta << n); }

// a_q then a+_p on |bits>, with Jordan–Wigner signs; false if it vanishes.
bool hop(std::uint64_t& bits, double& sign, int p, int q) {
  auto below = [](std::uint64_t b, int i) { return __builtin_popcountll(b & ((std::uint64_t{1} << i) - 1)); };
  if (!((bits >> q) & 1)) return false;
  if (below(bits, q) & 1) sign = -sign;
  bits &= ~(std::uint64_t{1} << q);
  if ((bits >> p) & 1) return false;
  if (below(bits, p) & 1) sign = -sign;
  bits |= std::uint64_t{1} << p;
  return true;
}

// H|b> as a map from spin-orbital occupations to amplitudes.
std::map<std::uint64_t, double> apply_h(const sci::Integrals& ints, std::uint64_t b) {
  const int n = ints.norb;
  std::map<std::uint64_t, double> out;
  out[b] += ints.core;
  for (int s = 0; s < 2; ++s)
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q) {
        std::uint64_t bits = b;
        double sign = 1;
        if (hop(bits, sign, p + s * n, q + s * n)) out[bits] += sign * ints.h1_at(p, q);
      }
  // 1/2 sum (pq|rs) a+_{p s} a+_{r t} a_{s' t} a_{q s}  =  1/2 sum (pq|rs) a+_p a_q a+_r a_s - delta terms;
  // applied literally in normal order: a+_p a+_r a_s a_q.
  for (int s1 = 0; s1 < 2; ++s1)
    for (int s2 = 0; s2 < 2; ++s2)
      for (int p = 0; p < n; ++p)
        for (int q = 0; q < n; ++q)
          for (int r = 0; r < n; ++r)
            for (int s = 0; s < n; ++s) {
              const double v = ints.eri_at(p, q, r, s);
              const int P = p + s1 * n, Q = q + s1 * n, R = r + s2 * n, S = s + s2 * n;
              std::uint64_t bits = b;
              double sign = 1;
              auto below = [](std::uint64_t x, int i) { return __builtin_popcountll(x & ((std::uint64_t{1} << i) - 1)); };
              auto annihilate = [&](int i) {
                if (!((bits >> i) & 1)) return false;
                if (below(bits, i) & 1) sign = -sign;
                bits &= ~(std::uint64_t{1} << i);
                return true;
              };
              auto create = [&](int i) {
                if ((bits >> i) & 1) return false;
                if (below(bits, i) & 1) sign = -sign;
                bits |= std::uint64_t{1} << i;
                return true;
              };
              if (annihilate(Q) && annihilate(S) && create(R) && create(P)) out[bits] += 0.5 * sign * v;
            }
  return out;
}

std::vector<std::uint64_t> strings(int norb, int k) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t s = 0; s < (std::uint64_t{1} << norb); ++s)
    if (__builtin_popcountll(s) == k) v.push_back(s);
  return v;
}

std::vector<Det> all_dets(int norb, int na, int nb) {
  std::vector<Det> d;
  for (auto a : strings(norb, na))
    for (auto b : strings(norb, nb)) d.push_back({a, b});
  std::sort(d.begin(), d.end());
  return d;
}

struct Hamiltonian {
  sci::Integrals ints;
  sci::ExcitationTables tables;
  kernels::sci::HamiltonianView view;
  explicit Hamiltonian(sci::Integrals i) : ints(std::move(i)), tables(sci::build_excitation_tables(ints)) {
    view = sci::host_view(ints, tables);
  }
};

std::vector<Candidate> generate(const Hamiltonian& h, int na, int nb, const std::vector<Det>& src,
                                const std::vector<double>& c, double eps) {
  const std::uint64_t cap = sci::max_candidates_per_source(h.tables, na, nb) * src.size();
  std::vector<Candidate> out(cap);
  std::uint64_t count = 0;
  kernels::SciGenerate g{h.view, na, nb, src.data(), c.data(), src.size(), eps, out.data(), &count, nullptr, nullptr, {}};
  kernels::sci_generate_cpu(g);
  out.resize(count);
  return out;
}

// The semistochastic PT2's generation of src (kernels::SciSampled) on the host: its candidates'
// records and its diagonal terms.
using Tagged = std::vector<kernels::sci::TaggedCandidate>;
std::pair<Tagged, Tagged> generate_sampled(const Hamiltonian& h, int na, int nb, const std::vector<Det>& src,
                                           const std::vector<double>& c, double eps, const std::vector<std::uint64_t>& batch,
                                           const std::vector<double>& scale, const std::vector<double>& fold,
                                           double eps_large) {
  const std::uint64_t cap = sci::max_candidates_per_source(h.tables, na, nb) * src.size();
  Tagged out(2 * cap), diagonal(cap);
  std::uint64_t count = 0, diagonal_count = 0;
  kernels::SciGenerate g{h.view, na, nb, src.data(), c.data(), src.size(), eps, nullptr, &count, nullptr, nullptr, {}};
  g.sampled = {batch.data(), scale.data(), fold.data(), eps_large, out.data(), diagonal.data(), &diagonal_count};
  kernels::sci_generate_cpu(g);
  out.resize(count);
  diagonal.resize(diagonal_count);
  return {out, diagonal};
}

double fci_energy(const Hamiltonian& h, int na, int nb, int* products = nullptr) {
  const auto dets = all_dets(h.ints.norb, na, nb);
  const std::size_t n = dets.size();
  std::vector<double> x(n, 0.0), sigma(n), diag(n);
  kernels::SciSigma s{h.view, na, nb, dets.data(), n, x.data(), 0, n, sigma.data(), diag.data()};
  kernels::sci_sigma_cpu(s);  // the diagonal
  std::size_t lowest = std::min_element(diag.begin(), diag.end()) - diag.begin();
  std::vector<double> guess(n, 0.0);
  guess[lowest] = 1;
  sci::Davidson dav(guess, {1e-7, 24, 400});
  dav.set_diagonal(diag);
  while (!dav.done()) {
    s.x = dav.next().data();
    kernels::sci_sigma_cpu(s);
    dav.take(sigma);
  }
  EXPECT_TRUE(dav.converged());
  if (products) *products = dav.products();
  return dav.eigenvalue();
}

std::string data_file(const std::string& name) { return qstage::testing::test_data("fcidump/" + name); }
// Determinants as the score kernel reads its rows (two words a row).
const std::uint64_t* rows_of(const std::vector<Det>& dets) { return reinterpret_cast<const std::uint64_t*>(dets.data()); }

}  // namespace

TEST(SciHamiltonian, ElementsAndPhasesMatchSecondQuantization) {
  for (unsigned seed : {1u, 2u}) {
    const int n = 5, na = 3, nb = 2;
    Hamiltonian h(random_integrals(n, na + nb, seed));
    const auto dets = all_dets(n, na, nb);
    double worst = 0;
    for (const Det& b : dets) {
      const auto hb = apply_h(h.ints, spin_bits(b, n));
      for (const Det& a : dets) {
        const auto it = hb.find(spin_bits(a, n));
        const double want = it == hb.end() ? 0.0 : it->second;
        const double got = kernels::sci::element(h.view, a, b);
        worst = std::max(worst, std::fabs(want - got));
        ASSERT_NEAR(got, want, 1e-11) << "seed " << seed << " a=(" << a.alpha << "," << a.beta << ") b=(" << b.alpha
                                      << "," << b.beta << ")";
      }
    }
    EXPECT_LT(worst, 1e-11);
  }
}

TEST(SciGenerate, EveryCouplingOnceWithItsElement) {
  const int n = 6, na = 3, nb = 2;
  Hamiltonian h(random_integrals(n, na + nb, 7));
  const auto dets = all_dets(n, na, nb);
  for (const Det& b : dets) {
    const auto got = generate(h, na, nb, {b}, {1.0}, 0.0);
    std::map<std::pair<std::uint64_t, std::uint64_t>, double> by_key;
    for (const Candidate& c : got) {
      ASSERT_TRUE(by_key.emplace(std::make_pair(c.alpha, c.beta), c.value).second) << "a candidate twice";
      ASSERT_FALSE(c.alpha == b.alpha && c.beta == b.beta) << "the source itself";
    }
    for (const Det& a : dets) {
      if (a == b) continue;
      const double want = kernels::sci::element(h.view, a, b);
      const auto it = by_key.find({a.alpha, a.beta});
      if (want == 0) {
        EXPECT_TRUE(it == by_key.end());
      } else {
        ASSERT_TRUE(it != by_key.end()) << "missing a coupled determinant";
        EXPECT_EQ(it->second, want);
      }
    }
  }
}

// Given a workspace, the CPU's generation leaves where each source's records begin (as the GPU's
// scan does): each source's run of records is what that source generates alone.
TEST(SciGenerate, WorkspaceOffsetsMarkEachSourcesRecords) {
  const int n = 6, na = 3, nb = 2;
  Hamiltonian h(random_integrals(n, na + nb, 11));
  const auto dets = all_dets(n, na, nb);
  const std::vector<Det> src(dets.begin(), dets.begin() + 40);
  std::vector<double> c(src.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = 0.3 + 0.01 * static_cast<double>(i);
  std::vector<Candidate> out(sci::max_candidates_per_source(h.tables, na, nb) * src.size());
  std::vector<std::uint64_t> workspace(2 * src.size(), ~std::uint64_t{0});
  std::uint64_t count = 0;
  kernels::SciGenerate g{h.view, na, nb, src.data(), c.data(), src.size(), 1e-3, out.data(), &count, workspace.data(),
                         nullptr, {}};
  kernels::sci_generate_cpu(g);
  for (std::size_t s = 0; s < src.size(); ++s) {
    const std::uint64_t begin = workspace[src.size() + s], end = s + 1 < src.size() ? workspace[src.size() + s + 1] : count;
    const auto alone = generate(h, na, nb, {src[s]}, {c[s]}, 1e-3);
    ASSERT_EQ(end - begin, alone.size()) << s;
    for (std::size_t k = 0; k < alone.size(); ++k) {
      EXPECT_EQ(out[begin + k].alpha, alone[k].alpha) << s;
      EXPECT_EQ(out[begin + k].beta, alone[k].beta) << s;
      EXPECT_EQ(out[begin + k].value, alone[k].value) << s;
    }
  }
}

TEST(SciGenerate, HeatBathScreeningKeepsExactlyTheLargeOnes) {
  const int n = 6, na = 3, nb = 3;
  Hamiltonian h(random_integrals(n, na + nb, 11));
  const auto dets = all_dets(n, na, nb);
  std::vector<Det> src(dets.begin(), dets.begin() + 40);
  std::vector<double> c(src.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = std::sin(1.0 + i) * 0.7;
  const double eps = 0.05;
  const auto got = generate(h, na, nb, src, c, eps);
  std::size_t k = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    std::set<std::pair<std::uint64_t, std::uint64_t>> want;
    for (const Det& a : dets)
      if (!(a == src[i]) && std::fabs(kernels::sci::element(h.view, a, src[i])) * std::fabs(c[i]) > eps) want.insert({a.alpha, a.beta});
    std::set<std::pair<std::uint64_t, std::uint64_t>> have;
    for (std::size_t j = 0; j < want.size() && k < got.size(); ++j, ++k) {
      have.insert({got[k].alpha, got[k].beta});
      EXPECT_NEAR(got[k].value, kernels::sci::element(h.view, Det{got[k].alpha, got[k].beta}, src[i]) * c[i], 1e-15);
    }
    EXPECT_EQ(have, want) << "source " << i;
  }
  EXPECT_EQ(k, got.size());
}

// Sampled sources give tagged records in the plain generation's order: a candidate's scaled
// value under tag 3b, then the scaled value again under 3b + 1 when it passes eps_large; else its
// diagonal term fold * v^2 under 3b + 2, in the diagonal terms.
TEST(SciGenerate, SampledSourcesGiveTaggedRecordsAndDiagonalTerms) {
  Hamiltonian h(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  const int na = h.ints.nalpha(), nb = h.ints.nbeta();
  const auto dets = all_dets(h.ints.norb, na, nb);
  const std::vector<Det> src(dets.begin() + 100, dets.begin() + 160);
  std::vector<double> c(src.size()), scale(src.size()), fold(src.size());
  std::vector<std::uint64_t> batch(src.size());
  for (std::size_t i = 0; i < src.size(); ++i)
    c[i] = std::sin(0.7 * i + 0.1), scale[i] = 1.5 + i, fold[i] = -0.25 * i, batch[i] = i / 20;
  const double eps = 1e-4, eps_large = 3e-3;
  const auto plain = generate(h, na, nb, src, c, eps);
  const auto [got, diagonal] = generate_sampled(h, na, nb, src, c, eps, batch, scale, fold, eps_large);
  // (each source's candidates are consecutive in the plain output; its source from the element)
  std::size_t k = 0, at = 0, d = 0, large = 0;
  for (std::size_t i = 0; i < src.size(); ++i)
    for (; k < plain.size(); ++k) {
      const Det t{plain[k].alpha, plain[k].beta};
      const double element = kernels::sci::element(h.view, t, src[i]);
      if (element * c[i] != plain[k].value) break;  // (the next source's)
      ASSERT_LT(at, got.size());
      const auto& a = got[at++];
      EXPECT_EQ((Det{a.alpha, a.beta}), t);
      EXPECT_EQ(a.tag, 3 * batch[i]);
      EXPECT_EQ(a.value, plain[k].value * scale[i]);
      if (std::fabs(element) * std::fabs(c[i]) > eps_large) {
        ++large;
        ASSERT_LT(at, got.size());
        const auto& b = got[at++];
        EXPECT_EQ((Det{b.alpha, b.beta}), t);
        EXPECT_EQ(b.tag, 3 * batch[i] + 1);
        EXPECT_EQ(b.value, a.value);
      } else {
        ASSERT_LT(d, diagonal.size());
        const auto& b = diagonal[d++];
        EXPECT_EQ((Det{b.alpha, b.beta}), t);
        EXPECT_EQ(b.tag, 3 * batch[i] + 2);
        EXPECT_EQ(b.value, fold[i] * (plain[k].value * plain[k].value));
      }
    }
  EXPECT_EQ(k, plain.size());
  EXPECT_EQ(at, got.size());
  EXPECT_EQ(d, diagonal.size());
  EXPECT_EQ(got.size(), plain.size() + large);
  EXPECT_GT(large, 0u);
  EXPECT_LT(large, plain.size());
}

TEST(SciDavidson, FullSpaceReproducesFciEnergies) {
  struct Case {
    const char* file;
    double energy;
  };
  for (const Case& c : {Case{"h2o_FCIDUMP_symm", -75.785724228114}, Case{"H2H2_FCIDUMP_nosym", -4.021386898742},
                        Case{"N2_sto6g_FCIDUMP", -108.670707597692}}) {
    Hamiltonian h(sci::read_fcidump(data_file(c.file)));
    int products = 0;
    const double e = fci_energy(h, h.ints.nalpha(), h.ints.nbeta(), &products);
    EXPECT_NEAR(e, c.energy, 1e-8) << c.file << " after " << products << " products";
  }
}

TEST(SciDavidson, DenseJacobiEigenvaluesOfAKnownMatrix) {
  // tridiagonal 2, -1: eigenvalues 2 - 2 cos(k pi / (n + 1))
  const int n = 9;
  std::vector<double> a(n * n, 0.0), values, vectors;
  for (int i = 0; i < n; ++i) {
    a[i * n + i] = 2;
    if (i + 1 < n) a[i * n + i + 1] = a[(i + 1) * n + i] = -1;
  }
  sci::symmetric_eigen(n, a, values, vectors);
  for (int k = 1; k <= n; ++k) EXPECT_NEAR(values[k - 1], 2 - 2 * std::cos(k * M_PI / (n + 1)), 1e-12);
}

// Davidson saved mid-way and loaded into a fresh one goes on with the same bits (a resumed
// sci.solve's products), at any thread count; a state cut short is refused, not half-read.
TEST(SciDavidson, SavedAndLoadedMidWayGoesOnWithTheSameBits) {
  const int n = 60;
  std::vector<double> a(n * n);  // symmetric, diagonally dominant
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) a[i * n + j] = a[j * n + i] = i == j ? 1.0 + i : 0.1 * std::sin(1.0 + i * j);
  auto product = [&](std::span<const double> x) {
    std::vector<double> y(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) y[i] += a[i * n + j] * x[j];
    return y;
  };
  std::vector<double> diagonal(n), guess(n, 0.0);
  for (int i = 0; i < n; ++i) diagonal[i] = a[i * n + i];
  guess[0] = 1;
  const sci::DavidsonOptions options{1e-10, 8, 200};  // (a small basis: restarts happen)
  sci::Davidson whole(guess, options), first(guess, options);
  whole.set_diagonal(diagonal), first.set_diagonal(diagonal);
  for (int k = 0; k < 5; ++k) whole.take(product(whole.next())), first.take(product(first.next()));
  ASSERT_FALSE(first.done());
  Packer out;
  first.save(out);
  const std::string bytes = out.take();
  sci::Davidson second(std::vector<double>{1.0}, options);  // (another state: load replaces all of it)
  Unpacker in(bytes);
  second.load(in);
  EXPECT_TRUE(in.done());
  while (!whole.done()) whole.take(product(whole.next())), second.take(product(second.next()));
  EXPECT_TRUE(second.done());
  EXPECT_EQ(whole.products(), second.products());
  EXPECT_EQ(whole.eigenvalue(), second.eigenvalue());
  EXPECT_EQ(whole.eigenvector(), second.eigenvector());
  sci::Davidson cut(std::vector<double>{1.0}, options);
  Unpacker short_in(std::string_view(bytes).substr(0, bytes.size() / 2));
  EXPECT_THROW(cut.load(short_in), std::runtime_error);
}

// Vectors of many dot-product blocks, summed on 1 and on 4 threads: the same bits (Davidson's sums
// have one fixed shape), and a converged lowest pair of a banded operator.
TEST(SciDavidson, BitsDoNotDependOnTheThreadCount) {
  const std::size_t n = 100003;  // (not a whole number of blocks)
  auto product = [&](std::span<const double> x) {  // diagonal 1 + i / n, couplings to i +- 1 and i +- 7
    std::vector<double> y(n);
    for (std::size_t i = 0; i < n; ++i) {
      double v = (1.0 + static_cast<double>(i) / static_cast<double>(n)) * x[i];
      for (const std::size_t d : {std::size_t{1}, std::size_t{7}}) {
        if (i >= d) v += 0.01 * x[i - d];
        if (i + d < n) v += 0.01 * x[i + d];
      }
      y[i] = v;
    }
    return y;
  };
  std::vector<double> diagonal(n), guess(n);
  for (std::size_t i = 0; i < n; ++i) diagonal[i] = 1.0 + static_cast<double>(i) / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) guess[i] = 1.0 + std::cos(static_cast<double>(i));  // (every entry: every block's sums)
  auto solve = [&](int threads) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    sci::Davidson d(guess, {1e-8, 12, 40});  // (40 products, converged or not: the bits are compared)
    d.set_diagonal(diagonal);
    while (!d.done()) d.take(product(d.next()));
    omp_set_num_threads(before);
    return std::make_pair(d.eigenvalue(), d.eigenvector());
  };
  const auto one = solve(1), four = solve(4);
  EXPECT_EQ(std::memcmp(&one.first, &four.first, sizeof(double)), 0);
  EXPECT_TRUE(one.second == four.second);
  const std::vector<double> ag = product(guess);
  double gag = 0, gg = 0;
  for (std::size_t i = 0; i < n; ++i) gag += guess[i] * ag[i], gg += guess[i] * guess[i];
  EXPECT_LT(one.first, gag / gg);  // (below the guess's Rayleigh quotient)
  EXPECT_GT(one.first, 1.0 - 4 * 0.01 - 1e-9);  // (Gershgorin)
}

// Several roots (Davidson-Liu: a correction a root not yet converged, restarts from the Ritz
// vectors) give the lowest eigenpairs of the dense solver, through restarts and a save and load.
TEST(SciDavidson, SeveralRootsAreTheLowestEigenpairs) {
  const int n = 80, roots = 3;
  std::vector<double> a(n * n);  // symmetric, diagonally dominant, two nearly degenerate low diagonals
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j)
      a[i * n + j] = a[j * n + i] = i == j ? 1.0 + 0.5 * i - (i == 1 ? 0.49 : 0.0) : 0.05 * std::sin(1.0 + i * j);
  auto product = [&](std::span<const double> x) {
    std::vector<double> y(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) y[i] += a[i * n + j] * x[j];
    return y;
  };
  std::vector<double> diagonal(n), values, vectors;
  for (int i = 0; i < n; ++i) diagonal[i] = a[i * n + i];
  sci::symmetric_eigen(n, a, values, vectors);
  std::vector<std::vector<double>> guesses(roots, std::vector<double>(n, 0.0));
  for (int r = 0; r < roots; ++r) guesses[r][r] = 1;  // (the lowest diagonals)
  const sci::DavidsonOptions options{1e-9, 9, 400};  // (a small basis: restarts happen)
  sci::Davidson whole(guesses, options), first(guesses, options);
  whole.set_diagonal(diagonal), first.set_diagonal(diagonal);
  for (int k = 0; k < 7; ++k) whole.take(product(whole.next())), first.take(product(first.next()));
  Packer out;
  first.save(out);
  const std::string bytes = out.take();
  sci::Davidson second(std::vector<double>{1.0}, options);
  Unpacker in(bytes);
  second.load(in);
  while (!whole.done()) whole.take(product(whole.next())), second.take(product(second.next()));
  ASSERT_TRUE(whole.converged());
  EXPECT_GT(whole.products(), options.max_basis);
  EXPECT_EQ(whole.roots(), roots);
  for (int r = 0; r < roots; ++r) {
    EXPECT_NEAR(whole.eigenvalue(r), values[r], 1e-12) << "root " << r;
    EXPECT_LT(whole.residual_norm(r), 1e-9);
    double overlap = 0;  // with the dense eigenvector (its sign is arbitrary)
    for (int i = 0; i < n; ++i) overlap += whole.eigenvector(r)[i] * vectors[i * n + r];
    EXPECT_NEAR(std::fabs(overlap), 1.0, 1e-9) << "root " << r;
    EXPECT_EQ(whole.eigenvalue(r), second.eigenvalue(r));
    EXPECT_EQ(whole.eigenvector(r), second.eigenvector(r));
  }
  EXPECT_THROW(sci::Davidson(std::vector<std::vector<double>>{guesses[0], guesses[0]}, options), std::invalid_argument);
}

namespace {

// A banded operator of n rows (diagonal 1 + i / n, couplings 0.01 to i +- 1 and i +- 7) and a start
// vector with every entry set (every block of the fixed shape's sums is used).
struct BandedOperator {
  std::size_t n;
  std::vector<double> operator()(std::span<const double> x) const {
    std::vector<double> y(n);
    for (std::size_t i = 0; i < n; ++i) {
      double v = diagonal(i) * x[i];
      for (const std::size_t d : {std::size_t{1}, std::size_t{7}}) {
        if (i >= d) v += 0.01 * x[i - d];
        if (i + d < n) v += 0.01 * x[i + d];
      }
      y[i] = v;
    }
    return y;
  }
  double diagonal(std::size_t i) const { return 1.0 + static_cast<double>(i) / static_cast<double>(n); }
  std::vector<double> diagonals() const {
    std::vector<double> d(n);
    for (std::size_t i = 0; i < n; ++i) d[i] = diagonal(i);
    return d;
  }
  std::vector<double> guess(double phase) const {
    std::vector<double> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = 1.0 + std::cos(phase + static_cast<double>(i));
    return g;
  }
};

// Davidson's results, to compare bit for bit.
struct DavidsonResult {
  int products;
  bool converged;
  std::vector<double> values, residuals;
  std::vector<std::vector<double>> vectors;
  bool operator==(const DavidsonResult&) const = default;
};

DavidsonResult result_of(const sci::Davidson& d) {
  DavidsonResult r{d.products(), d.converged(), {}, {}, {}};
  for (int k = 0; k < d.roots(); ++k) {
    r.values.push_back(d.eigenvalue(k));
    r.residuals.push_back(d.residual_norm(k));
    r.vectors.push_back(d.eigenvector(k));
  }
  return r;
}

}  // namespace

// Placed on the cpu backend, Davidson's vectors stay where they are and the products are written
// in place (product_slot, take_in_place), those of every pending vector at once: the bits of
// products handed over one at a time by take().
TEST(SciDavidson, ProductsWrittenInPlaceOnTheCpuBackendAreTheSameBits) {
  const BandedOperator a{20011};
  auto cpu = make_backend({"cpu", 0, 0, 0});
  auto stream = cpu->make_stream(false);
  sci::Davidson handed({a.guess(0.0), a.guess(1.0)}, {1e-8, 12, 60}), in_place({a.guess(0.0), a.guess(1.0)}, {1e-8, 12, 60});
  ASSERT_TRUE(in_place.place(*cpu, *stream));
  handed.set_diagonal(a.diagonals()), in_place.set_diagonal(a.diagonals());
  while (!handed.done()) handed.take(a(handed.next()));
  int together = 0;  // (products taken two or more at once)
  while (!in_place.done()) {
    const int count = in_place.pending();
    for (int k = 0; k < count; ++k) {
      const std::vector<double> y = a(std::span<const double>(in_place.next().data() + k * a.n, a.n));
      std::copy(y.begin(), y.end(), in_place.product_slot() + k * a.n);
    }
    together += count > 1 ? count : 0;
    in_place.take_in_place(count);
  }
  EXPECT_GT(together, 2);
  EXPECT_TRUE(result_of(handed) == result_of(in_place));
  EXPECT_THROW(in_place.next(), std::logic_error);
}

// The CUDA kernels write the CPU twins' bytes (generation: same keys, same order, same values)
// and agree to rounding (sigma: a tree sum per row against the CPU's list-order sum).
TEST(SciGpu, GenerateAndSigmaMatchTheCpuTwins) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  Hamiltonian h(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  const int na = h.ints.nalpha(), nb = h.ints.nbeta();
  const auto dets = all_dets(h.ints.norb, na, nb);
  std::vector<double> c(dets.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = std::sin(0.37 * i) / (1.0 + i % 97);
  sci::ResidentHamiltonian resident(*gpu.backend, *gpu.stream, h.ints, h.tables);
  for (double eps : {0.0, 1e-4}) {
    const std::vector<Det> src(dets.begin(), dets.begin() + 3000);
    const auto want = generate(h, na, nb, src, std::vector<double>(c.begin(), c.begin() + 3000), eps);
    Buffer d_src = gpu.upload(src.data(), src.size() * sizeof(Det));
    Buffer d_c = gpu.upload(c.data(), src.size() * sizeof(double));
    const std::uint64_t cap = sci::max_candidates_per_source(h.tables, na, nb) * src.size();
    Buffer d_out = gpu.backend->alloc_device(cap * sizeof(Candidate), "test");
    Buffer d_count = gpu.backend->alloc_device(8, "test");
    Buffer d_work = gpu.backend->alloc_device(2 * src.size() * 8, "test");
    Buffer d_scan = gpu.backend->alloc_device(kernels::kSciScanWorkspaceBytes, "test");
    kernels::SciGenerate g{resident.view(), na, nb, d_src.as<Det>(), d_c.as<double>(), src.size(), eps,
                           d_out.as<Candidate>(), d_count.as<std::uint64_t>(), d_work.as<std::uint64_t>(), d_scan.data(), {}};
    kernels::sci_generate(*gpu.stream, g);
    const auto count = gpu.download<std::uint64_t>(d_count, 1)[0];
    ASSERT_EQ(count, want.size()) << "eps " << eps;
    {  // where each source's records begin: the CPU's, given a workspace, are the GPU's scan
      std::vector<Candidate> cpu_out(cap);
      std::vector<std::uint64_t> cpu_work(2 * src.size());
      std::uint64_t cpu_count = 0;
      const std::vector<double> cs(c.begin(), c.begin() + 3000);
      kernels::SciGenerate cg{h.view, na, nb, src.data(), cs.data(), src.size(), eps, cpu_out.data(), &cpu_count,
                              cpu_work.data(), nullptr, {}};
      kernels::sci_generate_cpu(cg);
      const auto gpu_work = gpu.download<std::uint64_t>(d_work, 2 * src.size());
      ASSERT_TRUE(std::equal(cpu_work.begin() + 3000, cpu_work.end(), gpu_work.begin() + 3000)) << "eps " << eps;
    }
    const auto got = gpu.download<Candidate>(d_out, count);
    for (std::size_t k = 0; k < count; ++k) {
      ASSERT_EQ(got[k].alpha, want[k].alpha) << k;
      ASSERT_EQ(got[k].beta, want[k].beta) << k;
      ASSERT_EQ(got[k].value, want[k].value) << k;
    }
    // The semistochastic PT2's sampled sources: the CPU's tagged records, byte for byte.
    std::vector<std::uint64_t> batch(src.size());
    std::vector<double> scale(src.size()), fold(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) batch[i] = i / 300, scale[i] = 1.0 + 0.5 * (i % 5), fold[i] = 0.1 * (i % 9) - 0.3;
    const auto [want_tagged, want_diagonal] = generate_sampled(
        h, na, nb, src, std::vector<double>(c.begin(), c.begin() + 3000), eps, batch, scale, fold, 2e-3);
    Buffer d_batch = gpu.upload(batch.data(), src.size() * 8), d_scale = gpu.upload(scale.data(), src.size() * 8);
    Buffer d_fold = gpu.upload(fold.data(), src.size() * 8);
    using kernels::sci::TaggedCandidate;
    Buffer d_tagged = gpu.backend->alloc_device(2 * cap * sizeof(TaggedCandidate), "test");
    Buffer d_diagonal = gpu.backend->alloc_device(cap * sizeof(TaggedCandidate), "test");
    Buffer d_diagonal_count = gpu.backend->alloc_device(8, "test");
    Buffer d_work4 = gpu.backend->alloc_device(4 * src.size() * 8, "test");
    g.out = nullptr;
    g.workspace = d_work4.as<std::uint64_t>();
    g.sampled = {d_batch.as<std::uint64_t>(),     d_scale.as<double>(),         d_fold.as<double>(),
                 2e-3,                            d_tagged.as<TaggedCandidate>(), d_diagonal.as<TaggedCandidate>(),
                 d_diagonal_count.as<std::uint64_t>()};
    kernels::sci_generate(*gpu.stream, g);
    const auto tagged_count = gpu.download<std::uint64_t>(d_count, 1)[0];
    const auto diagonal_count = gpu.download<std::uint64_t>(d_diagonal_count, 1)[0];
    ASSERT_EQ(tagged_count, want_tagged.size()) << "eps " << eps;
    ASSERT_EQ(diagonal_count, want_diagonal.size()) << "eps " << eps;
    const auto got_tagged = gpu.download<TaggedCandidate>(d_tagged, tagged_count);
    const auto got_diagonal = gpu.download<TaggedCandidate>(d_diagonal, diagonal_count);
    ASSERT_EQ(std::memcmp(got_tagged.data(), want_tagged.data(), tagged_count * sizeof(TaggedCandidate)), 0) << "eps " << eps;
    ASSERT_EQ(std::memcmp(got_diagonal.data(), want_diagonal.data(), diagonal_count * sizeof(TaggedCandidate)), 0)
        << "eps " << eps;
  }
  const std::size_t n = dets.size();
  std::vector<double> sigma(n), diag(n), x(c.begin(), c.end());
  kernels::SciSigma s{h.view, na, nb, dets.data(), n, x.data(), 0, n, sigma.data(), diag.data()};
  kernels::sci_sigma_cpu(s);
  Buffer d_space = gpu.upload(dets.data(), n * sizeof(Det));
  Buffer d_x = gpu.upload(x.data(), n * sizeof(double));
  Buffer d_sigma = gpu.backend->alloc_device(n * 8, "test"), d_diag = gpu.backend->alloc_device(n * 8, "test");
  kernels::SciSigma sg{resident.view(), na, nb, d_space.as<Det>(), n, d_x.as<double>(), 100, n - 100,
                       d_sigma.as<double>(), d_diag.as<double>()};
  kernels::sci_sigma(*gpu.stream, sg);
  const auto gs = gpu.download<double>(d_sigma, n - 100), gd = gpu.download<double>(d_diag, n - 100);
  for (std::size_t r = 0; r + 100 < n; ++r) {
    ASSERT_NEAR(gs[r], sigma[r + 100], 1e-11 * (1 + std::fabs(sigma[r + 100]))) << r;
    ASSERT_NEAR(gd[r], diag[r + 100], 1e-11 * (1 + std::fabs(diag[r + 100]))) << r;
  }
}

// Scoring's per-candidate part (kernels/sci/sci_score.hpp): candidates in the space or of another irrep
// are skipped, the others get E - H_aa floored away from zero; the GPU gives the CPU twin's bits
// (its file is compiled without fused multiply-adds, so E_PT2 is the same on both).
namespace {

struct ScoreCase {
  Hamiltonian h{sci::read_fcidump(data_file("h2o_FCIDUMP_symm"))};  // (ORBSYM 2, 1, 3, 1)
  std::vector<Det> space, candidates;
  kernels::sci::IrrepMasks irreps;
  double energy = 0;
  ScoreCase() {
    const auto all = all_dets(h.ints.norb, h.ints.nalpha(), h.ints.nbeta());
    for (std::size_t i = 0; i < all.size(); ++i) (i % 3 == 0 ? space : candidates).push_back(all[i]);
    candidates.insert(candidates.end(), space.begin(), space.begin() + 2);  // (two in the space)
    irreps.known = true;
    for (int p = 0; p < h.ints.norb; ++p) irreps.mask[h.ints.orbsym[p] - 1] |= std::uint64_t{1} << p;
    irreps.target = 0;
    // E equal to one candidate's H_aa: its denominator is floored
    energy = kernels::sci::diagonal(h.view, candidates[1]);
  }
};

}  // namespace

TEST(SciScore, CandidatesInTheSpaceOrOfAnotherIrrepAreSkippedTheOthersGetFlooredDenominators) {
  ScoreCase c;
  const std::size_t n = c.candidates.size();
  std::vector<double> den(n, -7);
  std::vector<unsigned char> skipped(n, 9);
  kernels::sci_score_rows_cpu({c.h.view, c.space.data(), c.space.size(), {}, c.irreps, rows_of(c.candidates), 2, n, c.energy,
                               den.data(), skipped.data()});
  // (through the space's filter: the same)
  const std::uint64_t bits = kernels::sci_space_filter_bits(c.space.size());
  std::vector<std::uint32_t> words(bits / 32);
  kernels::sci_space_filter_cpu(c.space.data(), c.space.size(), words.data(), bits);
  std::vector<double> den_filtered(n, -7);
  std::vector<unsigned char> skipped_filtered(n, 9);
  kernels::sci_score_rows_cpu({c.h.view, c.space.data(), c.space.size(), {words.data(), bits - 1}, c.irreps,
                               rows_of(c.candidates), 2, n, c.energy, den_filtered.data(), skipped_filtered.data()});
  EXPECT_EQ(skipped_filtered, skipped);
  EXPECT_EQ(std::memcmp(den_filtered.data(), den.data(), n * 8), 0);
  int other_irrep = 0, counted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Det& d = c.candidates[i];
    int g = 0;  // (the product of the electrons' labels, computed here orbital by orbital)
    for (int p = 0; p < c.h.ints.norb; ++p)
      if (((d.alpha >> p) & 1) != ((d.beta >> p) & 1)) g ^= c.h.ints.orbsym[p] - 1;
    const bool in_space = std::binary_search(c.space.begin(), c.space.end(), d);
    const bool skip = in_space || g != 0;
    other_irrep += !in_space && g != 0;
    ASSERT_EQ(skipped[i], skip ? 1 : 0) << i;
    if (skip) {
      EXPECT_EQ(den[i], -7) << i;  // (left alone)
      continue;
    }
    ++counted;
    const double want = c.energy - kernels::sci::diagonal(c.h.view, d);
    const double floor = kernels::sci::kDenominatorFloor;
    EXPECT_EQ(den[i], std::fabs(want) >= floor ? want : (want < 0 ? -floor : floor)) << i;
  }
  EXPECT_GT(other_irrep, 0);
  EXPECT_GT(counted, 0);
  EXPECT_EQ(skipped[n - 1], 1);  // (in the space)
  // unknown symmetry: only the space's are skipped
  c.irreps.known = false;
  kernels::sci_score_rows_cpu({c.h.view, c.space.data(), c.space.size(), {}, c.irreps, rows_of(c.candidates), 2, n, c.energy,
                               den.data(), skipped.data()});
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_EQ(skipped[i], std::binary_search(c.space.begin(), c.space.end(), c.candidates[i]) ? 1 : 0) << i;
}

// Rows as the semistochastic PT2 scores them: sorted keys (alpha, beta, tag), a determinant in a
// run of rows (one a tag); the scorer answers a run once, and every row of it the same as alone.
TEST(SciScore, RowsOfOneDeterminantInARunEachGetItsAnswer) {
  ScoreCase c;
  // (rows of `words` words, the determinant first; skips and denominators start as markers)
  const auto score = [&](const std::uint64_t* rows, std::uint32_t words, std::size_t n) {
    std::pair<std::vector<double>, std::vector<unsigned char>> out{std::vector<double>(n, -7),
                                                                   std::vector<unsigned char>(n, 9)};
    kernels::sci_score_rows_cpu({c.h.view,
                                 c.space.data(),
                                 c.space.size(),
                                 {},
                                 c.irreps,
                                 rows,
                                 words,
                                 n,
                                 c.energy,
                                 out.first.data(),
                                 out.second.data()});
    return out;
  };
  const std::size_t distinct = c.candidates.size();
  const auto [den_alone, skipped_alone] = score(rows_of(c.candidates), 2, distinct);
  // (runs of 1 to 3 rows, the whole list again until runs cross the scorer's chunks of 4096 rows)
  std::vector<std::uint64_t> rows;
  std::vector<std::size_t> of;
  for (std::uint64_t pass = 0; of.size() < 3 * 4096 + 17; ++pass)
    for (std::size_t i = 0; i < distinct; ++i)
      for (std::uint64_t t = 0; t < 1 + (i + pass) % 3; ++t) {
        rows.insert(rows.end(), {c.candidates[i].alpha, c.candidates[i].beta, 3 * pass + t});
        of.push_back(i);
      }
  const std::size_t n = of.size();
  const auto [den, skipped] = score(rows.data(), 3, n);
  std::size_t repeated = 0, counted = 0;
  for (std::size_t r = 0; r < n; ++r) {
    repeated += r > 0 && of[r] == of[r - 1];
    counted += !skipped[r];
    ASSERT_EQ(skipped[r], skipped_alone[of[r]]) << r;
    ASSERT_EQ(std::memcmp(&den[r], &den_alone[of[r]], 8), 0) << r;
  }
  EXPECT_GT(repeated, n / 3);
  EXPECT_GT(counted, 0u);
}

TEST(SciGpu, ScoreRowsAreTheCpusBits) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  for (const char* file : {"h2o_FCIDUMP_symm", "N2_sto6g_FCIDUMP"}) {
    Hamiltonian h(sci::read_fcidump(data_file(file)));
    const auto all = all_dets(h.ints.norb, h.ints.nalpha(), h.ints.nbeta());
    std::vector<Det> space, candidates;
    for (std::size_t i = 0; i < all.size(); ++i) (i % 5 == 0 ? space : candidates).push_back(all[i]);
    kernels::sci::IrrepMasks irreps;
    irreps.known = true;
    for (int p = 0; p < h.ints.norb; ++p) irreps.mask[h.ints.orbsym[p] - 1] |= std::uint64_t{1} << p;
    const std::size_t n = candidates.size();
    const double energy = kernels::sci::diagonal(h.view, space[0]) - 0.25;
    std::vector<double> den(n, 0);
    std::vector<unsigned char> skipped(n, 0);
    kernels::sci_score_rows_cpu({h.view, space.data(), space.size(), {}, irreps, rows_of(candidates), 2, n, energy, den.data(),
                                 skipped.data()});
    sci::ResidentHamiltonian resident(*gpu.backend, *gpu.stream, h.ints, h.tables);
    const kernels::sci::ListOrder order(h.view);
    const Buffer single = gpu.upload(order.single_table().data(), order.single_table().size() * 2);
    const Buffer opposite = gpu.upload(order.opposite_table().data(), order.opposite_table().size() * 2);
    const Buffer same_spin = gpu.upload(order.same_table().data(), order.same_table().size() * 2);
    Buffer d_space = gpu.upload(space.data(), space.size() * sizeof(Det));
    // (the rows as the semistochastic PT2 scores them: alpha, beta, a tag)
    std::vector<std::uint64_t> tagged;
    for (std::size_t i = 0; i < n; ++i) tagged.insert(tagged.end(), {candidates[i].alpha, candidates[i].beta, i % 7});
    Buffer d_candidates = gpu.upload(tagged.data(), tagged.size() * 8);
    Buffer d_den = gpu.upload(den.data(), n * 8);  // (the CPU's where skipped: left alone)
    Buffer d_skipped = gpu.backend->alloc_device(n, "test");
    const std::uint64_t bits = kernels::sci_space_filter_bits(space.size());  // (the GPU looks through its filter)
    Buffer d_words = gpu.backend->alloc_device(bits / 8, "test");
    kernels::sci_space_filter(*gpu.stream, d_space.as<Det>(), space.size(), d_words.as<std::uint32_t>(), bits);
    kernels::sci_score_rows(*gpu.stream, {resident.view(), d_space.as<Det>(), space.size(),
                                          {d_words.as<std::uint32_t>(), bits - 1}, irreps,
                                          d_candidates.as<std::uint64_t>(), 3, n, energy, d_den.as<double>(),
                                          d_skipped.as<unsigned char>()});
    const auto got_den = gpu.download<double>(d_den, n);
    const auto got_skipped = gpu.download<unsigned char>(d_skipped, n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got_skipped[i], skipped[i]) << file << " " << i;
      ASSERT_EQ(std::memcmp(&got_den[i], &den[i], 8), 0) << file << " " << i << ": " << got_den[i] << " vs " << den[i];
    }
  }
}

// The EN-PT2 terms' tile sums: each tile's rows in row order, skipped rows left out, the tags'
// slots and signs (tag 3b: v^2/den into batch b, 3b + 1: -v^2/den, 3b + 2: v/den); the GPU gives
// the CPU twin's bits.
namespace {

struct TileSumRows {
  std::vector<double> den, values;
  std::vector<unsigned char> skipped;
  std::vector<std::uint64_t> records;  // alpha, beta, tag, value bits: the diagonal terms' layout
  std::uint64_t n;
};

TileSumRows tile_sum_rows(std::uint64_t n, std::uint64_t first_batch, std::uint32_t slots) {
  TileSumRows t;
  t.n = n;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1, 1);
  for (std::uint64_t r = 0; r < n; ++r) {
    t.den.push_back(-0.5 - std::fabs(u(rng)) * 3);
    t.values.push_back(u(rng) * std::exp(8 * u(rng)));  // (values over many magnitudes: the order shows in the bits)
    t.skipped.push_back(rng() % 5 == 0);
    const std::uint64_t tag = 3 * (first_batch + rng() % slots) + rng() % 3;
    t.records.insert(t.records.end(), {rng(), rng(), tag, std::bit_cast<std::uint64_t>(t.values.back())});
  }
  return t;
}

// (the plain loop, tile by tile)
std::vector<double> tile_sums_by_hand(const TileSumRows& t, std::uint64_t tile_rows, std::uint32_t slots, bool tagged,
                                      std::uint64_t first_batch) {
  const std::uint64_t tiles = (t.n + tile_rows - 1) / tile_rows;
  std::vector<double> sums(tiles * slots, 0.0);
  for (std::uint64_t r = 0; r < t.n; ++r) {
    if (t.skipped[r]) continue;
    const double v = t.values[r], den = t.den[r];
    if (!tagged) {
      sums[r / tile_rows] += v * v / den;
      continue;
    }
    const std::uint64_t tag = t.records[4 * r + 2];
    const double term = tag % 3 == 0 ? v * v / den : tag % 3 == 1 ? -(v * v) / den : v / den;
    sums[r / tile_rows * slots + (tag / 3 - first_batch)] += term;
  }
  return sums;
}

kernels::SciTileSums tile_sum_args(const TileSumRows& t, std::uint64_t tile_rows, std::uint32_t slots, bool tagged,
                                   std::uint64_t first_batch) {
  kernels::SciTileSums a;
  a.denominator = t.den.data();
  a.skipped = t.skipped.data();
  a.n = t.n;
  a.values = tagged ? reinterpret_cast<const double*>(t.records.data() + 3) : t.values.data();
  a.value_stride = tagged ? 4 : 1;
  a.tags = tagged ? t.records.data() + 2 : nullptr;
  a.tag_stride = 4;
  a.first_batch = first_batch;
  a.slots = tagged ? slots : 1;
  a.tile_rows = tile_rows;
  return a;
}

}  // namespace

TEST(SciScore, TileSumsAreEachTilesRowsInOrder) {
  for (const bool tagged : {false, true})
    for (const std::uint64_t n : {std::uint64_t{1}, std::uint64_t{1000}, std::uint64_t{70001}}) {
      const std::uint64_t tile_rows = 4096, first_batch = 20;
      const std::uint32_t slots = tagged ? 10 : 1;
      const TileSumRows t = tile_sum_rows(n, first_batch, slots);
      kernels::SciTileSums a = tile_sum_args(t, tile_rows, slots, tagged, first_batch);
      std::vector<double> got((n + tile_rows - 1) / tile_rows * slots, -1.0);
      a.sums = got.data();
      kernels::sci_tile_sums_cpu(a);
      const std::vector<double> want = tile_sums_by_hand(t, tile_rows, slots, tagged, first_batch);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 8), 0) << "tagged " << tagged << " n " << n;
    }
}

TEST(SciGpu, TileSumsAreTheCpusBits) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  for (const bool tagged : {false, true})
    for (const std::uint64_t n : {std::uint64_t{3}, std::uint64_t{5000}, std::uint64_t{300001}}) {
      const std::uint64_t tile_rows = 65536, first_batch = 40;
      const std::uint32_t slots = tagged ? 10 : 1;
      const TileSumRows t = tile_sum_rows(n, first_batch, slots);
      kernels::SciTileSums a = tile_sum_args(t, tile_rows, slots, tagged, first_batch);
      const std::uint64_t values = (n + tile_rows - 1) / tile_rows * slots;
      std::vector<double> want(values);
      a.sums = want.data();
      kernels::sci_tile_sums_cpu(a);
      Buffer den = gpu.upload(t.den.data(), n * 8), skipped = gpu.upload(t.skipped.data(), n);
      Buffer vals = gpu.upload(t.values.data(), n * 8), records = gpu.upload(t.records.data(), n * 32);
      Buffer sums = gpu.backend->alloc_device(values * 8, "test");
      a.denominator = den.as<double>();
      a.skipped = skipped.as<unsigned char>();
      a.values = tagged ? records.as<double>() + 3 : vals.as<double>();
      a.tags = tagged ? records.as<std::uint64_t>() + 2 : nullptr;
      a.sums = sums.as<double>();
      kernels::sci_tile_sums(*gpu.stream, a);
      const auto got = gpu.download<double>(sums, values);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), values * 8), 0) << "tagged " << tagged << " n " << n;
    }
}

// sci.solve's resident space: H within the space stored gives the enumerating sigma's bits (on
// each backend, against that backend's sci_sigma: on cuda the host's rows laid out in the sigma
// kernel's lanes), over any rows, built from nothing or grown; with no room, it enumerates.
namespace {

void stored_sigma_matches_enumeration(Backend& be) {
  Hamiltonian h(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  const int na = h.ints.nalpha(), nb = h.ints.nbeta();
  const auto all = all_dets(h.ints.norb, na, nb);
  std::vector<Det> space;  // a sorted subspace: some excitations fall outside it
  for (std::size_t i = 0; i < all.size(); ++i)
    if (i % 3 != 1) space.push_back(all[i]);
  std::sort(space.begin(), space.end());
  const std::size_t n = space.size();
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.37 * i) / (1.0 + i % 97);
  auto stream = be.make_stream();
  auto upload = [&](const void* data, std::size_t bytes) {
    Buffer b = be.alloc_device(bytes, "test");
    be.copy_to_device(b.data(), data, bytes, *stream);
    return b;
  };
  auto download = [&](const Buffer& b, std::size_t count) {
    std::vector<double> out(count);
    be.copy_to_host(out.data(), b.data(), count * 8, *stream);
    stream->synchronize();
    return out;
  };
  const Buffer d_x = upload(x.data(), n * 8);
  sci::ResidentHamiltonian rh(be, *stream, h.ints, h.tables);
  const Buffer d_space = upload(space.data(), n * sizeof(Det));
  const std::uint64_t first = 37, rows = n - 100;
  Buffer want_sigma = be.alloc_device(rows * 8, "test"), want_diag = be.alloc_device(rows * 8, "test");
  kernels::SciSigma s{rh.view(), na, nb, d_space.as<Det>(), n, d_x.as<double>(), first, rows, want_sigma.as<double>(),
                      want_diag.as<double>()};
  kernels::sci_sigma(*stream, s);
  const auto ws = download(want_sigma, rows), wd = download(want_diag, rows);
  // Stored from nothing, not stored (products enumerate), and grown from a part's; on cuda with
  // the rows found either way (on the host, or enumerated on the device).
  for (const sci::RowSource source : {sci::RowSource::chosen, sci::RowSource::device_enumeration, sci::RowSource::host_strings}) {
    if (be.kind() == BackendKind::cpu && source != sci::RowSource::chosen) continue;
    for (const std::uint64_t limit : {std::uint64_t{1} << 30, std::uint64_t{0}, std::uint64_t{1} << 31}) {
      const bool grow = limit == std::uint64_t{1} << 31;
      std::unique_ptr<sci::ResidentSpace> part;
      if (grow) {
        std::vector<Det> half;
        for (std::size_t i = 0; i < n; i += 2) half.push_back(space[i]);
        part = std::make_unique<sci::ResidentSpace>(be, h.ints, h.tables, na, nb, half, limit, nullptr, source);
      }
      sci::ResidentSpace resident(be, h.ints, h.tables, na, nb, space, limit, std::move(part), source);
      const bool on_host = be.kind() == BackendKind::cpu || source == sci::RowSource::host_strings ||
                           (source == sci::RowSource::chosen &&
                            sci::ResidentSpace::rows_on_host(be.kind(), h.view, space.front()));
      EXPECT_EQ(resident.stored(), limit > 0);
      EXPECT_EQ(resident.rows_found_on_host(), limit > 0 && on_host);
      EXPECT_EQ(resident.grown(), grow);
      if (resident.stored()) EXPECT_GT(resident.entries(), n);
      Buffer got_sigma = be.alloc_device(rows * 8, "test"), got_diag = be.alloc_device(rows * 8, "test");
      resident.sigma(*stream, d_x.as<double>(), first, rows, got_sigma.as<double>(), got_diag.as<double>());
      const auto gs = download(got_sigma, rows), gd = download(got_diag, rows);
      for (std::uint64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(gs[r], ws[r]) << "row " << first + r << ", stored " << resident.stored() << ", source "
                                << static_cast<int>(source);
        ASSERT_EQ(gd[r], wd[r]) << "row " << first + r;
      }
      // Three vectors at once (H read once when stored): each product the bits it has alone.
      std::vector<double> xs(3 * n);
      for (std::size_t i = 0; i < 3 * n; ++i) xs[i] = i < n ? x[i] : std::cos(0.11 * i) / (1.0 + i % 13);
      const Buffer d_xs = upload(xs.data(), xs.size() * 8);
      Buffer block = be.alloc_device(3 * rows * 8, "test"), one = be.alloc_device(rows * 8, "test");
      resident.sigma(*stream, d_xs.as<double>(), first, rows, block.as<double>(), got_diag.as<double>(), 3);
      const auto together = download(block, 3 * rows);
      for (int v = 0; v < 3; ++v) {
        resident.sigma(*stream, d_xs.as<double>() + v * n, first, rows, one.as<double>(), got_diag.as<double>());
        const auto alone = download(one, rows);
        ASSERT_EQ(std::memcmp(together.data() + v * rows, alone.data(), rows * 8), 0)
            << "vector " << v << ", stored " << resident.stored() << ", source " << static_cast<int>(source);
      }
    }
  }
}

}  // namespace

TEST(SciResidentSpace, StoredHamiltonianGivesTheEnumeratingSigmasBits) {
  auto be = detail::make_cpu_backend(2ull << 30, 1ull << 30);
  stored_sigma_matches_enumeration(*be);
}

TEST(SciResidentSpace, StoredHamiltonianGivesTheEnumeratingSigmasBitsOnTheGpu) {
  REQUIRE_GPU();
  auto be = make_backend({"cuda", 2ull << 30, 1ull << 30});
  stored_sigma_matches_enumeration(*be);
}

namespace {

// Stored rows of the host's H, as the CPU twins write them (with each entry's place).
struct HostRows {
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint32_t> columns, places;
  std::vector<double> elements, diagonal;
  bool operator==(const HostRows& o) const {
    return offsets == o.offsets && columns == o.columns && places == o.places && diagonal == o.diagonal &&
           elements.size() == o.elements.size() && std::memcmp(elements.data(), o.elements.data(), elements.size() * 8) == 0;
  }
};

HostRows rows_from_counts(std::vector<std::uint64_t> counts) {
  HostRows out;
  out.offsets.assign(counts.size() + 1, 0);
  for (std::size_t r = 0; r < counts.size(); ++r) out.offsets[r + 1] = out.offsets[r] + counts[r];
  out.columns.resize(out.offsets.back());
  out.places.resize(out.offsets.back());
  out.elements.resize(out.offsets.back());
  out.diagonal.resize(counts.size());
  return out;
}

HostRows build_rows(const Hamiltonian& h, int na, int nb, const std::vector<Det>& space) {
  kernels::SciCouplings c;
  c.h = h.view, c.nalpha = na, c.nbeta = nb, c.space = space.data(), c.space_size = space.size(), c.n = space.size();
  std::vector<std::uint64_t> counts(space.size());
  c.counts = counts.data();
  kernels::sci_couplings_count_cpu(c);
  HostRows out = rows_from_counts(counts);
  c.offsets = out.offsets.data(), c.columns = out.columns.data(), c.elements = out.elements.data();
  c.places = out.places.data(), c.diagonal = out.diagonal.data();
  kernels::sci_couplings_write_cpu(c);
  return out;
}

HostRows grow_rows(const Hamiltonian& h, int na, int nb, const std::vector<Det>& previous, const HostRows& before,
                   const std::vector<Det>& space) {
  const kernels::sci::CouplingsUpdate update(h.view, na, nb, previous.data(), previous.size(), space.data(), space.size());
  EXPECT_TRUE(update.contains_previous());
  const kernels::sci::CouplingsUpdate::Stored stored{before.offsets.data(), before.columns.data(), before.places.data(),
                                                     before.elements.data(), before.diagonal.data()};
  std::vector<std::uint64_t> counts(space.size());
  update.count(stored, counts.data());
  HostRows out = rows_from_counts(counts);
  update.write(stored, out.offsets.data(), out.columns.data(), out.elements.data(), out.places.data(), out.diagonal.data());
  return out;
}

}  // namespace

// A lookup through the space's filter finds what the binary search finds, for every determinant
// of the full space (no false negatives), and the filter turns most of the absent ones away.
TEST(SciSpaceFilter, LookupsThroughTheFilterFindWhatTheSearchFinds) {
  const Hamiltonian h(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  auto all = all_dets(h.ints.norb, h.ints.nalpha(), h.ints.nbeta());
  std::mt19937_64 rng(3);
  std::shuffle(all.begin(), all.end(), rng);
  for (const std::size_t size : {std::size_t{1}, std::size_t{300}, all.size() / 5}) {
    std::vector<Det> space(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(size));
    std::sort(space.begin(), space.end());
    const std::uint64_t bits = kernels::sci_space_filter_bits(size);
    std::vector<std::uint32_t> words(bits / 32, 0xffffffffu);  // (the filter sets every word)
    kernels::sci_space_filter_cpu(space.data(), size, words.data(), bits);
    const kernels::sci::SpaceFilter filter{words.data(), bits - 1};
    std::uint64_t absent = 0, turned_away = 0;
    for (const Det& d : all) {
      const std::uint64_t found = kernels::sci::find_sorted(space.data(), size, d);
      ASSERT_EQ(kernels::sci::find_filtered(space.data(), size, filter, d), found);
      if (found == size) {
        ++absent;
        const std::uint64_t b = kernels::sci::filter_bit(filter, d);
        turned_away += !((words[b >> 5] >> (b & 31)) & 1u);
      }
    }
    EXPECT_GT(turned_away, absent * 9 / 10) << size;
  }
}

// H grown with the space (old rows kept and merged with their new partners, new rows found in
// full) must be, byte for byte, H built from nothing: over a chain of spaces each within the
// next, from one determinant to the whole space, closed and open shell.
TEST(SciCouplings, GrownRowsAreTheRowsBuiltFromNothing) {
  sci::Integrals open_shell = random_integrals(9, 7, 7);
  open_shell.ms2 = 1;
  std::vector<Hamiltonian> hs;
  hs.emplace_back(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  hs.emplace_back(open_shell);
  std::mt19937_64 rng(5);
  for (const Hamiltonian& h : hs) {
    const int na = h.ints.nalpha(), nb = h.ints.nbeta();
    auto all = all_dets(h.ints.norb, na, nb);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<Det> previous;
    HostRows before;
    for (const std::size_t size : {std::size_t{1}, std::size_t{40}, all.size() / 9, all.size() / 9 + 1, all.size() / 2, all.size()}) {
      std::vector<Det> space(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(size));
      std::sort(space.begin(), space.end());
      const HostRows built = build_rows(h, na, nb, space);
      if (!previous.empty()) EXPECT_TRUE(grow_rows(h, na, nb, previous, before, space) == built) << h.ints.norb << " orbitals, " << size;
      previous = space;
      before = built;
    }
    // A space that lost a determinant cannot grow from the one that had it.
    std::vector<Det> fewer(previous.begin() + 1, previous.end());
    EXPECT_FALSE(kernels::sci::CouplingsUpdate(h.view, na, nb, previous.data(), previous.size(), fewer.data(), fewer.size())
                     .contains_previous());
  }
}

// The same on the device: rows grown by the lanes' walk and by insertion (SciCouplings::Growth)
// are, byte for byte, the rows the device enumerates from nothing, in the sigma kernel's lanes
// (closed and open shell, over a chain of spaces each within the next; the larger steps give rows
// more gained partners than an inserted row takes, which walk instead).
TEST(SciCouplings, RowsGrownOnTheGpuAreTheRowsEnumeratedFromNothing) {
  REQUIRE_GPU();
  test::GpuRun gpu(4ull << 30);
  std::mt19937_64 rng(11);
  sci::Integrals open_shell = random_integrals(9, 7, 7);
  open_shell.ms2 = 1;
  std::vector<Hamiltonian> hs;
  hs.emplace_back(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  hs.emplace_back(open_shell);
  for (const Hamiltonian& h : hs) {
    const std::string file = h.ints.ms2 ? "open shell" : "N2_sto6g_FCIDUMP";
    const int na = h.ints.nalpha(), nb = h.ints.nbeta();
    sci::ResidentHamiltonian resident(*gpu.backend, *gpu.stream, h.ints, h.tables);
    const kernels::sci::ListOrder order(h.view);
    const Buffer single = gpu.upload(order.single_table().data(), order.single_table().size() * 2);
    const Buffer opposite = gpu.upload(order.opposite_table().data(), order.opposite_table().size() * 2);
    const Buffer same_spin = gpu.upload(order.same_table().data(), order.same_table().size() * 2);
    auto all = all_dets(h.ints.norb, na, nb);
    std::shuffle(all.begin(), all.end(), rng);
    struct DeviceRows {
      std::vector<Det> space;
      Buffer d_space, offsets, lane_ends, columns, elements, diagonal;
      std::uint64_t entries = 0;
    };
    // Rows of `space` on the device, from nothing or grown from `before`'s (walked or inserted).
    std::uint64_t most_gained = 0;
    const auto device_rows = [&](std::vector<Det> space, const DeviceRows* before, std::uint32_t insert) {
      DeviceRows out;
      out.space = std::move(space);
      const std::uint64_t n = out.space.size();
      out.d_space = gpu.upload(out.space.data(), n * sizeof(Det));
      out.offsets = gpu.backend->alloc_device((n + 1) * 8, "test");
      out.lane_ends = gpu.backend->alloc_device(n * kernels::kSciLanes * 4, "test");
      kernels::SciCouplings c;
      c.h = resident.view(), c.nalpha = na, c.nbeta = nb, c.space = out.d_space.as<Det>(), c.space_size = n, c.n = n;
      c.counts = out.offsets.as<std::uint64_t>(), c.lane_ends = out.lane_ends.as<std::uint32_t>();
      std::vector<std::uint32_t> row_before(n), now, added_at;
      std::vector<Det> added;
      Buffer d_rows, d_added, d_added_at, d_now, d_gained_start, d_gained, d_counts, d_filter;
      if (before) {  // (grown rows look their excitations up through the space's filter; rows from nothing do not)
        const std::uint64_t bits = kernels::sci_space_filter_bits(n);
        d_filter = gpu.backend->alloc_device(bits / 8, "test");
        kernels::sci_space_filter(*gpu.stream, out.d_space.as<Det>(), n, d_filter.as<std::uint32_t>(), bits);
        std::vector<std::uint32_t> words(bits / 32);
        kernels::sci_space_filter_cpu(out.space.data(), n, words.data(), bits);
        EXPECT_EQ(gpu.download<std::uint32_t>(d_filter, bits / 32), words);
        c.filter = {d_filter.as<std::uint32_t>(), bits - 1};
        now.resize(before->space.size());
        std::uint64_t k = 0;
        for (std::uint64_t j = 0; j < n; ++j)
          if (k < before->space.size() && before->space[k] == out.space[j]) row_before[j] = k, now[k++] = j;
          else row_before[j] = kernels::kSciAdded, added.push_back(out.space[j]), added_at.push_back(j);
        EXPECT_EQ(k, before->space.size());
        d_rows = gpu.upload(row_before.data(), n * 4);
        d_added = gpu.upload(added.data(), std::max<std::size_t>(added.size(), 1) * sizeof(Det));
        d_added_at = gpu.upload(added_at.data(), std::max<std::size_t>(added_at.size(), 1) * 4);
        d_now = gpu.upload(now.data(), now.size() * 4);
        kernels::SciCouplings::Growth& g = c.growth;
        g.previous_row = d_rows.as<std::uint32_t>(), g.added = d_added.as<Det>(), g.added_size = added.size();
        g.added_index = d_added_at.as<std::uint32_t>(), g.renumbered = d_now.as<std::uint32_t>();
        g.offsets = before->offsets.as<std::uint64_t>(), g.lane_ends = before->lane_ends.as<std::uint32_t>();
        g.columns = before->columns.as<std::uint32_t>(), g.elements = before->elements.as<double>();
        if (insert) {
          g.inserted_per_row = insert;
          g.order = {h.ints.norb, single.as<std::uint16_t>(), opposite.as<std::uint16_t>(), same_spin.as<std::uint16_t>()};
          d_counts = gpu.backend->alloc_device(n * 4, "test");
          kernels::sci_couplings_gained_count(*gpu.stream, c, d_counts.as<std::uint32_t>());
          const std::vector<std::uint32_t> counts = gpu.download<std::uint32_t>(d_counts, n);
          std::vector<std::uint64_t> start(n + 1, 0);
          for (std::uint64_t j = 0; j < n; ++j) {
            start[j + 1] = start[j] + counts[j];
            most_gained = std::max<std::uint64_t>(most_gained, counts[j]);
          }
          d_gained_start = gpu.upload(start.data(), (n + 1) * 8);
          d_gained = gpu.backend->alloc_device(std::max<std::uint64_t>(start[n], 1) * 4, "test");
          kernels::sci_couplings_gained_write(*gpu.stream, c, d_gained_start.as<std::uint64_t>(),
                                              d_counts.as<std::uint32_t>(), d_gained.as<std::uint32_t>());
          g.gained_start = d_gained_start.as<std::uint64_t>(), g.gained = d_gained.as<std::uint32_t>();
        }
      }
      kernels::sci_couplings_count(*gpu.stream, c);
      std::vector<std::uint64_t> at = gpu.download<std::uint64_t>(out.offsets, n);
      at.push_back(0);
      for (std::uint64_t j = 0, total = 0; j <= n; ++j) {
        const std::uint64_t count = at[j];
        at[j] = total;
        total += j < n ? count : 0;
      }
      out.entries = at[n];
      gpu.backend->copy_to_device(out.offsets.data(), at.data(), (n + 1) * 8, *gpu.stream);
      out.columns = gpu.backend->alloc_device(std::max<std::uint64_t>(out.entries, 1) * 4, "test");
      out.elements = gpu.backend->alloc_device(std::max<std::uint64_t>(out.entries, 1) * 8, "test");
      out.diagonal = gpu.backend->alloc_device(n * 8, "test");
      c.offsets = out.offsets.as<std::uint64_t>(), c.columns = out.columns.as<std::uint32_t>();
      c.elements = out.elements.as<double>(), c.diagonal = out.diagonal.as<double>();
      kernels::sci_couplings_write(*gpu.stream, c);
      gpu.stream->synchronize();
      return out;
    };
    const auto same = [&](const DeviceRows& a, const DeviceRows& b) {
      const std::uint64_t n = a.space.size();
      return a.entries == b.entries &&
             gpu.download<std::uint64_t>(a.offsets, n + 1) == gpu.download<std::uint64_t>(b.offsets, n + 1) &&
             gpu.download<std::uint32_t>(a.lane_ends, n * kernels::kSciLanes) ==
                 gpu.download<std::uint32_t>(b.lane_ends, n * kernels::kSciLanes) &&
             gpu.download<std::uint32_t>(a.columns, a.entries) == gpu.download<std::uint32_t>(b.columns, b.entries) &&
             gpu.download<std::uint64_t>(a.elements, a.entries) == gpu.download<std::uint64_t>(b.elements, b.entries) &&
             gpu.download<std::uint64_t>(a.diagonal, n) == gpu.download<std::uint64_t>(b.diagonal, n);
    };
    std::optional<DeviceRows> previous;
    ASSERT_GT(all.size() / 9, 40u);  // (the sizes below grow)
    for (const std::size_t size : {std::size_t{1}, std::size_t{40}, all.size() / 9, all.size() / 9 + 1, all.size() / 2, all.size()}) {
      std::vector<Det> space(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(size));
      std::sort(space.begin(), space.end());
      DeviceRows built = device_rows(space, nullptr, 0);
      if (previous) {
        // (0: walked; 64: inserted where a row gained at most 64 partners, walked elsewhere)
        for (const std::uint32_t insert : {0u, 64u, kernels::kSciInsertedPerRow}) {
          const DeviceRows grown = device_rows(space, &*previous, insert);
          EXPECT_TRUE(same(grown, built)) << file << ", " << previous->space.size() << " -> " << size
                                          << ", inserted up to " << insert;
        }
      }
      previous.emplace(std::move(built));
    }
    EXPECT_GT(most_gained, 64u) << file;  // (some rows walked beside inserted ones)
  }
}

// The host's stored H finds each row's partners through the space's strings and sorts them by
// their place in the excitation lists: each row must hold exactly what the enumeration visits
// (every listed excitation, kept when it is in the space), in its order, with its element bits.
// Spaces: whole, and random subsets of several densities; closed and open shell; symmetry zeros.
TEST(SciCouplings, StringPairsHoldTheEnumerationsEntriesInItsOrder) {
  sci::Integrals open_shell = random_integrals(9, 7, 5);
  open_shell.ms2 = 1;
  std::vector<Hamiltonian> hs;
  hs.emplace_back(sci::read_fcidump(data_file("N2_sto6g_FCIDUMP")));
  hs.emplace_back(sci::read_fcidump(data_file("h2o_FCIDUMP_symm")));
  hs.emplace_back(open_shell);
  std::mt19937_64 rng(11);
  for (const Hamiltonian& h : hs) {
    const int na = h.ints.nalpha(), nb = h.ints.nbeta();
    const auto all = all_dets(h.ints.norb, na, nb);
    for (const double keep : {1.0, 0.5, 0.1, 0.02}) {
      std::vector<Det> space;
      std::bernoulli_distribution in(keep);
      for (const Det& d : all)
        if (in(rng)) space.push_back(d);
      if (space.size() < 3) continue;
      const std::uint64_t n = space.size(), first = n / 3, rows = n - first;
      // The enumeration's rows.
      std::vector<std::uint64_t> want_offsets{0};
      std::vector<std::uint32_t> want_columns;
      std::vector<double> want_elements;
      for (std::uint64_t j = first; j < n; ++j) {
        int occ_a[64], occ_b[64];
        kernels::sci::occupied(space[j].alpha, occ_a);
        kernels::sci::occupied(space[j].beta, occ_b);
        for (std::uint32_t l = 0; l < kernels::sci::list_count(na, nb); ++l) {
          const auto ref = kernels::sci::list_at(l, na, nb, occ_a, occ_b);
          for (std::uint32_t k = 0; k < kernels::sci::cut_length(h.view, ref, 1.0, 0.0); ++k) {
            Det t;
            double element;
            if (!kernels::sci::list_entry(h.view, space[j], ref, k, 1.0, 0.0, &t, &element)) continue;
            const std::uint64_t i = kernels::sci::find_sorted(space.data(), n, t);
            if (i == n) continue;
            want_columns.push_back(static_cast<std::uint32_t>(i));
            want_elements.push_back(element);
          }
        }
        want_offsets.push_back(want_columns.size());
      }
      kernels::SciCouplings c;
      c.h = h.view;
      c.nalpha = na;
      c.nbeta = nb;
      c.space = space.data();
      c.space_size = n;
      c.first = first;
      c.n = rows;
      std::vector<std::uint64_t> counts(rows);
      c.counts = counts.data();
      kernels::sci_couplings_count_cpu(c);
      std::vector<std::uint64_t> offsets(rows + 1, 0);
      for (std::uint64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(counts[r], want_offsets[r + 1] - want_offsets[r]) << h.ints.norb << " orbitals, keep " << keep << ", row " << r;
        offsets[r + 1] = offsets[r] + counts[r];
      }
      std::vector<std::uint32_t> columns(offsets[rows]);
      std::vector<double> elements(offsets[rows]), diagonal(rows);
      c.offsets = offsets.data();
      c.columns = columns.data();
      c.elements = elements.data();
      c.diagonal = diagonal.data();
      kernels::sci_couplings_write_cpu(c);
      EXPECT_EQ(columns, want_columns) << h.ints.norb << " orbitals, keep " << keep;
      ASSERT_EQ(elements.size(), want_elements.size());
      EXPECT_EQ(std::memcmp(elements.data(), want_elements.data(), elements.size() * 8), 0);
      for (std::uint64_t r = 0; r < rows; ++r) EXPECT_EQ(diagonal[r], kernels::sci::diagonal(h.view, space[first + r]));
    }
  }
}

// Davidson with its vectors on the device gives the host's bits: one root over many blocks of the
// fixed shape, and three roots with restarts; a state saved on the device goes on with the same
// bits on the host, and the reverse. A device budget too small for the vectors keeps them on the host.
TEST(SciGpu, DavidsonOnTheDeviceIsTheHostsBits) {
  REQUIRE_GPU();
  test::GpuRun gpu;
  const BandedOperator a{100003};  // (not a whole number of blocks)
  // Multiplies on the host: next() read back when it is device memory.
  auto step = [&](sci::Davidson& d) {
    std::vector<double> x(d.dimension());
    if (d.on_backend()) {
      gpu.backend->copy_to_host(x.data(), d.next().data(), x.size() * 8, *gpu.stream);
      gpu.stream->synchronize();
    } else {
      std::copy(d.next().begin(), d.next().end(), x.begin());
    }
    return d.take(a(x));
  };
  for (const int roots : {1, 3}) {
    std::vector<std::vector<double>> guesses;
    for (int r = 0; r < roots; ++r) guesses.push_back(a.guess(r));
    const sci::DavidsonOptions options{1e-8, roots == 1 ? 12 : 9, 60};  // (small bases: restarts happen)
    sci::Davidson host(guesses, options), device(guesses, options), moved(guesses, options);
    host.set_diagonal(a.diagonals()), device.set_diagonal(a.diagonals()), moved.set_diagonal(a.diagonals());
    ASSERT_TRUE(device.place(*gpu.backend, *gpu.stream));
    ASSERT_TRUE(device.on_backend());
    for (int k = 0; k < 7; ++k) step(host), step(device), step(moved);
    // (saved on the device, loaded on the host; and saved on the host, loaded and placed on the device)
    Packer from_device, from_host;
    device.save(from_device), moved.save(from_host);
    const std::string device_bytes = from_device.take(), host_bytes = from_host.take();
    EXPECT_EQ(device_bytes, host_bytes) << roots << " roots";
    sci::Davidson on_host(std::vector<double>{1.0}, options), back_on_device(std::vector<double>{1.0}, options);
    Unpacker in1(device_bytes), in2(host_bytes);
    on_host.load(in1), back_on_device.load(in2);
    ASSERT_TRUE(back_on_device.place(*gpu.backend, *gpu.stream));
    while (!host.done()) step(host);
    while (!device.done()) step(device);
    while (!on_host.done()) step(on_host);
    while (!back_on_device.done()) step(back_on_device);
    const DavidsonResult expected = result_of(host);
    EXPECT_GT(expected.products, 7);
    EXPECT_TRUE(result_of(device) == expected) << roots << " roots";
    EXPECT_TRUE(result_of(on_host) == expected) << roots << " roots";
    EXPECT_TRUE(result_of(back_on_device) == expected) << roots << " roots";
  }
  test::GpuRun small(16 << 20);  // (16 MiB: the vectors, 22 MB, do not fit half of it)
  sci::Davidson d(a.guess(0.0), {1e-8, 12, 60});
  EXPECT_FALSE(d.place(*small.backend, *small.stream));
  EXPECT_FALSE(d.on_backend());
}
