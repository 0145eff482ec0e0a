#include "stages/mps/models.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>

#include "core/error.hpp"
#include "kernels/tensor/random.hpp"

namespace qstage::stages::mps {

std::vector<cplx> xxz_bond_hamiltonian(double J, double delta, double h_left, double h_right) {
  // Basis |n_left n_right>, index 2 n_left + n_right; S^z = n - 1/2.
  std::vector<cplx> h(16);
  for (int nl = 0; nl < 2; ++nl)
    for (int nr = 0; nr < 2; ++nr) {
      const double zl = nl - 0.5, zr = nr - 0.5;
      h[(2 * nl + nr) * 5] = J * delta * zl * zr - h_left * zl - h_right * zr;
    }
  // (S+S- + S-S+)/2 swaps |10> and |01> with amplitude 1/2.
  h[1 * 4 + 2] = h[2 * 4 + 1] = J * 0.5;
  return h;
}

std::vector<cplx> bose_hubbard_bond_hamiltonian(int d, double J, double U, double mu, double w_left, double w_right) {
  const int dd = d * d;
  std::vector<cplx> h(static_cast<std::size_t>(dd * dd));
  auto onsite = [&](int n) { return U / 2 * n * (n - 1) - mu * n; };
  for (int nl = 0; nl < d; ++nl)
    for (int nr = 0; nr < d; ++nr) {
      const int i = nl * d + nr;
      h[i * dd + i] = w_left * onsite(nl) + w_right * onsite(nr);
      // b+_l b_r |nl, nr> = sqrt((nl + 1) nr) |nl + 1, nr - 1>, and its conjugate.
      if (nl + 1 < d && nr > 0) {
        const int k = (nl + 1) * d + nr - 1;
        h[k * dd + i] = h[i * dd + k] = -J * std::sqrt((nl + 1.0) * nr);
      }
    }
  return h;
}

// ---------------------------------------------------------------- linear optics

namespace {

// The 2 x 2 mode matrix of a beam splitter with its input phases (models.hpp).
std::array<cplx, 4> mode_matrix(const BeamSplitter& b) {
  const double c = std::cos(b.theta), s = std::sin(b.theta);
  const cplx pl = std::polar(1.0, b.phase_left), pr = std::polar(1.0, b.phase_right);
  return {c * pl, cplx{0, -s} * std::polar(1.0, b.phi) * pr, cplx{0, -s} * std::polar(1.0, -b.phi) * pl, c * pr};
}

// Rows a, b of the row-major M-column matrix W <- u (rows a, b of W).
void mix_rows(std::vector<cplx>& W, int M, int a, int b, const std::array<cplx, 4>& u) {
  for (int k = 0; k < M; ++k) {
    const cplx x = W[a * M + k], y = W[b * M + k];
    W[a * M + k] = u[0] * x + u[1] * y;
    W[b * M + k] = u[2] * x + u[3] * y;
  }
}

}  // namespace

std::vector<cplx> interferometer_unitary(const std::vector<BeamSplitter>& bs, int M) {
  std::vector<cplx> U(static_cast<std::size_t>(M * M));
  for (int i = 0; i < M; ++i) U[i * M + i] = 1.0;
  for (const BeamSplitter& b : bs) mix_rows(U, M, b.mode, b.mode + 1, mode_matrix(b));
  return U;
}

std::vector<cplx> haar_unitary(int M, std::uint64_t seed) {
  // Complex Gaussian entries by Box-Muller: element e = i M + j uses counters 2e and 2e + 1.
  const std::uint64_t key = kernels::splitmix64(seed);
  auto uniform = [&](std::uint64_t counter) { return (kernels::random_double(kernels::random_bits(key, counter)) + 1) / 2; };
  std::vector<cplx> Z(static_cast<std::size_t>(M * M));
  for (std::uint64_t e = 0; e < Z.size(); ++e) {
    const double r = std::sqrt(-std::log(1 - uniform(2 * e))), a = 2 * std::numbers::pi * uniform(2 * e + 1);
    Z[e] = std::polar(r, a);  // (g1 + i g2) / sqrt 2 with g1, g2 standard normals
  }
  // Gram-Schmidt over the columns, each projected twice (it keeps orthogonality at rounding
  // level): Z = Q R with R's diagonal positive, so Q is Haar-distributed (Mezzadri 2007).
  for (int j = 0; j < M; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int k = 0; k < j; ++k) {
        cplx dot{};
        for (int i = 0; i < M; ++i) dot += std::conj(Z[i * M + k]) * Z[i * M + j];
        for (int i = 0; i < M; ++i) Z[i * M + j] -= dot * Z[i * M + k];
      }
    double norm = 0;
    for (int i = 0; i < M; ++i) norm += std::norm(Z[i * M + j]);
    for (int i = 0; i < M; ++i) Z[i * M + j] /= std::sqrt(norm);
  }
  return Z;
}

std::vector<BeamSplitter> decompose_unitary(const std::vector<cplx>& U, int M) {
  // Null W = U below the diagonal, column by column from the bottom, with g = BS^dagger on rows
  // (r - 1, r): g W(r, c) = 0 when tan theta = |y| / |x| and phi = arg x - arg y - pi/2. Then
  // g_K ... g_1 U = D (diagonal phases), so U = BS_1 ... BS_K D: the circuit applies D, then
  // BS_K first and BS_1 last.
  std::vector<cplx> W = U;
  std::vector<BeamSplitter> nulling;
  for (int c = 0; c + 1 < M; ++c)
    for (int r = M - 1; r > c; --r) {
      const cplx x = W[(r - 1) * M + c], y = W[r * M + c];
      BeamSplitter b{r - 1, std::atan2(std::abs(y), std::abs(x)), 0, 0, 0};
      if (std::abs(y) > 0) b.phi = std::arg(x) - std::arg(y) - std::numbers::pi / 2;
      const auto u = mode_matrix(b);
      mix_rows(W, M, r - 1, r, {std::conj(u[0]), std::conj(u[2]), std::conj(u[1]), std::conj(u[3])});
      nulling.push_back(b);
    }
  std::vector<BeamSplitter> circuit(nulling.rbegin(), nulling.rend());
  // D's phase on mode j commutes with every gate before the first one on j: fold it in there.
  std::vector<bool> placed(static_cast<std::size_t>(M), false);
  for (BeamSplitter& b : circuit)
    for (int side = 0; side < 2; ++side) {
      const int j = b.mode + side;
      if (placed[j]) continue;
      (side == 0 ? b.phase_left : b.phase_right) += std::arg(W[j * M + j]);
      placed[j] = true;
    }
  return circuit;
}

std::vector<cplx> beam_splitter_gate(const BeamSplitter& b, int d) {
  const int dd = d * d;
  std::vector<cplx> g(static_cast<std::size_t>(dd * dd));
  for (int n = 0; n <= 2 * (d - 1); ++n) {
    // Basis |k, n - k>, k = 0..n: a+ b |k, n-k> = sqrt((k + 1)(n - k)) |k + 1, n - k - 1>.
    std::vector<cplx> h(static_cast<std::size_t>((n + 1) * (n + 1)));
    for (int k = 0; k < n; ++k) {
      const double amp = b.theta * std::sqrt((k + 1.0) * (n - k));
      h[(k + 1) * (n + 1) + k] = amp * std::polar(1.0, b.phi);
      h[k * (n + 1) + k + 1] = amp * std::polar(1.0, -b.phi);
    }
    const std::vector<cplx> u = exp_minus_i(h, n + 1, 1.0);
    require_unitary(u, n + 1, fmt::format("with theta = {}, the beam splitter on modes ({}, {})", b.theta, b.mode, b.mode + 1),
                    "a smaller 'theta' (the beam splitter repeats with period 2 pi)");
    for (int l = std::max(0, n - d + 1); l <= std::min(n, d - 1); ++l)
      for (int k = std::max(0, n - d + 1); k <= std::min(n, d - 1); ++k)
        g[(l * d + n - l) * dd + k * d + n - k] = u[l * (n + 1) + k] * std::polar(1.0, b.phase_left * k + b.phase_right * (n - k));
  }
  return g;
}

std::vector<cplx> squeezed_vacuum(double r, double phase, int d) {
  std::vector<cplx> a(static_cast<std::size_t>(d));
  const cplx ratio = -std::polar(std::tanh(r), phase);
  cplx amp = 1 / std::sqrt(std::cosh(r));
  // a_{n+1} / a_n = (-e^{i phase} tanh r) sqrt((2n+1)(2n+2)) / (2 (n+1)): no factorials to overflow.
  for (int n = 0; 2 * n < d; ++n) {
    a[2 * n] = amp;
    amp *= ratio * std::sqrt((2 * n + 1.0) * (2 * n + 2.0)) / (2.0 * (n + 1));
  }
  return a;
}

std::vector<cplx> lossy_squeezed_density(double r, double phase, double eta, int d) {
  // The pure amplitudes a_{2n} (monotonically decreasing in n) until |a|^2 < 1e-30, past the cut.
  std::vector<cplx> a;
  const cplx ratio = -std::polar(std::tanh(r), phase);
  cplx amp = 1 / std::sqrt(std::cosh(r));
  for (int n = 0;; ++n) {
    a.push_back(amp), a.push_back(cplx{});
    if (2 * n >= d && std::norm(amp) < 1e-30) break;
    if (a.size() > (1u << 24)) throw InputError(fmt::format("squeezing r = {} is too large for the lossy state's Fock sum", r));
    amp *= ratio * std::sqrt((2 * n + 1.0) * (2 * n + 2.0)) / (2.0 * (n + 1));
  }
  const auto size = static_cast<int>(a.size());
  // log C(m + k, k)
  auto log_binomial = [](int m, int k) { return std::lgamma(m + k + 1.0) - std::lgamma(m + 1.0) - std::lgamma(k + 1.0); };
  std::vector<cplx> rho(static_cast<std::size_t>(d * d), cplx{});
  for (int m = 0; m < d; ++m)
    for (int q = 0; q < d; ++q) {
      if ((m - q) % 2 != 0) continue;  // a squeezed vacuum has even photon numbers only: rho stays even-even / odd-odd
      cplx sum{};
      for (int k = 0; m + k < size && q + k < size; ++k) {
        if (k > 0 && eta == 1) break;
        const cplx x = a[m + k] * std::conj(a[q + k]);
        if (x == cplx{}) continue;
        const double lw = 0.5 * (log_binomial(m, k) + log_binomial(q, k)) + (k > 0 ? k * std::log1p(-eta) : 0.0) + 0.5 * (m + q) * std::log(eta);
        sum += std::exp(lw) * x;
      }
      rho[m * d + q] = sum;
    }
  return rho;
}

// ---------------------------------------------------------------- evolutions

namespace {

// The Trotter circuit of bond terms term(j): a step is Strang steps of weights w (1 for order 2;
// Suzuki's a, a, 1-4a, a, a for order 4, as TeNPy's suzuki_trotter_decomposition): the even
// bonds (0,1), (2,3), ... by w dt/2, the odd ones by w dt, the even ones again by w dt/2.
// `couplings` names the parameters of the bond terms, for messages.
Evolution trotter(const ModelParams& p, int L, int d, const std::string& name, const std::string& couplings,
                  const std::function<std::vector<cplx>(int)>& term) {
  Evolution ev;
  ev.steps = p.steps;
  for (int s = 0; s <= p.steps; ++s) ev.times.push_back(s * p.dt);
  const double a = 1 / (4 - std::cbrt(4.0));
  const std::vector<double> weights = p.order == 2 ? std::vector<double>{1} : std::vector<double>{a, a, 1 - 4 * a, a, a};
  struct Gates {
    std::size_t half = 0, full = 0;  // the first of L - 1 tables
  };
  std::map<double, Gates> gates;  // per weight
  auto gate = [&](int j, double tau) {
    const std::string what = fmt::format("the {} gate of bond ({}, {})", name, j, j + 1);
    const std::vector<cplx> g = exp_minus_i(term(j), d * d, tau);
    require_unitary(g, d * d, fmt::format("with dt = {} ({}), {}", p.dt, couplings, what), "a smaller 'dt' or smaller couplings");
    ev.tables.push_back(gate_table(g, d, what));
  };
  for (double w : weights) {
    if (gates.count(w)) continue;
    gates[w].half = ev.tables.size();
    for (int j = 0; j + 1 < L; ++j) gate(j, w * p.dt / 2);
    gates[w].full = ev.tables.size();
    for (int j = 0; j + 1 < L; ++j) gate(j, w * p.dt);
  }
  std::vector<Update> step;
  auto layer = [&](int parity, std::size_t first) {
    for (int j = parity; j + 1 < L; j += 2) step.push_back({j, first + j, -1});
  };
  for (double w : weights) {
    layer(0, gates.at(w).half);
    layer(1, gates.at(w).full);
    layer(0, gates.at(w).half);
  }
  ev.step_updates.push_back(std::move(step));
  for (int j = 0; j + 1 < L; ++j)
    ev.terms.push_back(gate_table(term(j), d, fmt::format("the {} term of bond ({}, {})", name, j, j + 1)));
  return ev;
}

// The weight of a site's on-site term on bond j: half from each of its two bonds, all of it at
// the chain's ends, so that every site gets it once.
std::pair<double, double> onsite_weights(int L, int j) { return {j == 0 ? 1.0 : 0.5, j + 1 == L - 1 ? 1.0 : 0.5}; }

// 1 - G^dagger G of a beam splitter gate, zero on the pair totals n <= d-1 where G is unitary by
// construction (rounding there would only fake a loss).
std::vector<cplx> cut_loss_operator(const std::vector<cplx>& g, int d) {
  const int dd = d * d;
  std::vector<cplx> k(g.size());
  // G conserves the pair total, so G^dagger G is block-diagonal in it: sum only inside a block.
  for (int n = d; n <= 2 * (d - 1); ++n) {
    std::vector<int> idx;
    for (int a = n - d + 1; a <= d - 1; ++a) idx.push_back(a * d + n - a);
    for (int r : idx)
      for (int c : idx) {
        cplx s = r == c ? 1.0 : 0.0;
        for (int i : idx) s -= std::conj(g[i * dd + r]) * g[i * dd + c];
        k[r * dd + c] = s;
      }
  }
  return k;
}

Evolution interferometer(const ModelParams& p, int L, int d) {
  if (L < 2) throw InputError(fmt::format("the interferometer needs at least 2 modes; the state has L = {}", L));
  Evolution ev;
  const std::vector<BeamSplitter> bs = p.haar ? decompose_unitary(haar_unitary(L, p.haar_seed), L) : p.beam_splitters;
  ev.steps = static_cast<int>(bs.size());
  for (std::size_t k = 0; k < bs.size(); ++k) {
    const BeamSplitter& b = bs[k];
    if (b.mode < 0 || b.mode + 1 >= L)
      throw InputError(fmt::format("beam splitter {} couples modes ({}, {}); expected neighbouring modes in [0, L-1] = [0, {}]", k,
                                   b.mode, b.mode + 1, L - 1));
    const std::vector<cplx> g = beam_splitter_gate(b, d);
    const std::string what = fmt::format("beam splitter {} (modes {}, {})", k, b.mode, b.mode + 1);
    ev.tables.push_back(gate_table(g, d, what));
    ev.tables.push_back(gate_table(cut_loss_operator(g, d), d, what + "'s cut loss"));
    ev.step_updates.push_back({{b.mode, 2 * k, static_cast<std::int64_t>(2 * k + 1)}});
  }
  for (int s = 0; s <= ev.steps; ++s) ev.times.push_back(s);
  ev.unitary = interferometer_unitary(bs, L);
  ev.circuit = bs;
  return ev;
}

// Whether sites (j, j+1) can hold d or more particles together: the largest charge of bond j
// minus the smallest of bond j+2.
bool can_reach_cut(const U1Mps& psi, int j) {
  if (!psi.pair()) return psi.bonds[j].charges.back() - psi.bonds[j + 2].charges.front() >= psi.d;
  // n_pair: either component (ket or bra) of the pair
  int ket_hi = 0, bra_hi = 0, ket_lo = kernels::kPairMax, bra_lo = kernels::kPairMax;
  for (int c : psi.bonds[j].charges) ket_hi = std::max(ket_hi, kernels::pair_ket(c)), bra_hi = std::max(bra_hi, kernels::pair_bra(c));
  for (int c : psi.bonds[j + 2].charges) ket_lo = std::min(ket_lo, kernels::pair_ket(c)), bra_lo = std::min(bra_lo, kernels::pair_bra(c));
  return ket_hi - ket_lo >= psi.d || bra_hi - bra_lo >= psi.d;
}

}  // namespace

Evolution make_evolution(const ModelParams& p, int L, int d) {
  if (p.model == "interferometer") return interferometer(p, L, d);
  if (p.density_matrix)
    throw InputError(fmt::format("model '{}' needs a state vector; the input is a density matrix (charge_kind n_pair), which only "
                                 "model 'interferometer' evolves", p.model));
  if (p.model == "bose_hubbard")
    return trotter(p, L, d, "Bose-Hubbard", fmt::format("J = {}, U = {}, mu = {}", p.J, p.U, p.mu), [&](int j) {
      const auto [wl, wr] = onsite_weights(L, j);
      return bose_hubbard_bond_hamiltonian(d, p.J, p.U, p.mu, wl, wr);
    });
  if (d != 2) throw InputError(fmt::format("the XXZ model needs spin-1/2 sites; the state has d = {}, expected 2", d));
  return trotter(p, L, d, "XXZ", fmt::format("J = {}, delta = {}, h = {}", p.J, p.delta, p.h), [&](int j) {
    const auto [wl, wr] = onsite_weights(L, j);
    return xxz_bond_hamiltonian(p.J, p.delta, wl * p.h, wr * p.h);
  });
}

void apply_step(U1Mps& psi, const Evolution& ev, int step, const TruncParams& trunc, double& eps, double& kept,
                LayerUpdater& updater) {
  std::vector<LayerUpdater::BondGate> layer;
  auto flush = [&] {
    updater.apply(psi, layer, trunc, eps);
    layer.clear();
  };
  for (const Update& u : ev.updates(step)) {
    if (u.loss < 0) {
      const bool overlaps = std::any_of(layer.begin(), layer.end(), [&](const auto& x) { return std::abs(x.bond - u.bond) < 2; });
      if (overlaps) flush();
      layer.push_back({u.bond, &ev.tables[u.gate]});
      continue;
    }
    flush();
    if (psi.pair()) {
      // A density matrix: G (x) conj(G) cut at d loses Tr rho; the update's kept norm goes into
      // the weight (rho = weight * state), so the trace itself records the loss.
      const bool reach = can_reach_cut(psi, u.bond);
      const double before = psi.weight;
      updater.apply(psi, {{u.bond, &ev.tables[u.gate]}}, trunc, eps);
      if (reach && psi.weight < before * (1 - 1e-15)) updater.recanonicalize(psi, u.bond);
      continue;
    }
    const double lost = can_reach_cut(psi, u.bond) ? bond_expectation(psi, u.bond, ev.tables[u.loss]) : 0.0;
    updater.apply(psi, {{u.bond, &ev.tables[u.gate]}}, trunc, eps);
    if (lost <= 0) continue;
    kept *= 1 - lost;
    // Below 1e-15 the tensors stay within that of B form: not worth a sweep.
    if (lost > 1e-15) updater.recanonicalize(psi, u.bond);
  }
  flush();
}

}  // namespace qstage::stages::mps
