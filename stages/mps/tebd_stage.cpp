// mps.tebd: 2nd-order (Strang) or 4th-order (Suzuki) Trotter evolution of an mps.init output under an XXZ chain, with
// charge-blocked two-site updates (stages/mps/tebd.hpp), TeNPy's truncation parameters and
// measurements every measure_every steps.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <map>

#include "core/error.hpp"
#include "stages/mps/gates.hpp"
#include "stages/mps/mps_stages.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"
#include "stages/tensor/common.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using namespace mps;

struct Params {
  double J = 1, delta = 0, h = 0, dt = 0;
  int steps = 0, order = 2, measure_every = 1;
  std::int64_t gpu_svd_from = kernels::kGpuSvdFrom;
  TruncParams trunc;

  static Params from_json(const json& p) {
    Params r;
    r.J = p.at("J").get<double>();
    r.delta = p.at("delta").get<double>();
    r.h = p.at("h").get<double>();
    r.dt = p.at("dt").get<double>();
    r.steps = p.at("steps").get<int>();
    r.order = p.at("order").get<int>();
    r.measure_every = p.at("measure_every").get<int>();
    r.gpu_svd_from = p.at("gpu_svd_from").get<std::int64_t>();
    if (r.gpu_svd_from < 0) throw InputError(fmt::format("parameter 'gpu_svd_from' is {}; expected 0 or more", r.gpu_svd_from));
    const json& t = p.at("trunc");
    // (the schema fills in top-level defaults only: the nested ones are here)
    r.trunc.chi_max = t.value("chi_max", std::int64_t{100});
    r.trunc.svd_min = t.value("svd_min", 1e-14);
    r.trunc.trunc_cut = t.value("trunc_cut", 1e-14);
    if (!(r.dt > 0) || !std::isfinite(r.dt)) throw InputError(fmt::format("parameter 'dt' is {}; expected a finite time step > 0", r.dt));
    if (r.steps < 1) throw InputError(fmt::format("parameter 'steps' is {}; expected at least 1", r.steps));
    if (r.order != 2 && r.order != 4)
      throw InputError(fmt::format("parameter 'order' is {}; expected 2 (Strang) or 4 (Suzuki)", r.order));
    if (r.measure_every < 1) throw InputError(fmt::format("parameter 'measure_every' is {}; expected at least 1", r.measure_every));
    if (r.trunc.chi_max < 1) throw InputError(fmt::format("parameter 'trunc.chi_max' is {}; expected at least 1", r.trunc.chi_max));
    if (r.trunc.svd_min < 0 || r.trunc.trunc_cut < 0)
      throw InputError("parameters 'trunc.svd_min' and 'trunc.trunc_cut' must be >= 0");
    return r;
  }
};

// What is measured at one time.
struct Measurements {
  std::vector<double> times, density, entropy_vn, entropy_2, charges, norm, truncation_error, chi, energy;
  // bond_terms[j]: the Hamiltonian's term on sites j, j+1 as a table.
  void take(const U1Mps& psi, double t, double eps, const std::vector<GateTable>& bond_terms) {
    times.push_back(t);
    double e = 0;
    for (int j = 0; j + 1 < psi.L; ++j) e += bond_expectation(psi, j, bond_terms[j]);
    energy.push_back(e);
    const auto n = densities(psi);
    density.insert(density.end(), n.begin(), n.end());
    for (int k = 1; k < psi.L; ++k) {
      entropy_vn.push_back(mps::entropy_vn(psi.bonds[k]));
      entropy_2.push_back(entropy_renyi2(psi.bonds[k]));
      chi.push_back(static_cast<double>(psi.bonds[k].size()));
    }
    const auto p = charge_distribution(psi, psi.L / 2);
    charges.insert(charges.end(), p.begin(), p.end());
    norm.push_back(std::sqrt(norm_squared(psi)));
    truncation_error.push_back(eps);
  }
};

// The gate of bond j (sites j, j+1) for a time step tau. The field is split over the bonds so
// that every site gets it once: half from each of its two bonds, all of it at the chain's ends.
std::vector<cplx> xxz_term(const Params& p, int L, int j) {
  const double wl = j == 0 ? 1.0 : 0.5, wr = j + 1 == L - 1 ? 1.0 : 0.5;
  return xxz_bond_hamiltonian(p.J, p.delta, wl * p.h, wr * p.h);
}

GateTable xxz_gate(const Params& p, int L, int j, double tau) {
  return gate_table(exp_minus_i(xxz_term(p, L, j), 4, tau), 2, fmt::format("the XXZ gate of bond ({}, {})", j, j + 1));
}

class TebdStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "mps.tebd", 1,
        "TEBD time evolution of a U(1) MPS under an XXZ chain (2nd- or 4th-order Trotter), charge-blocked updates with one "
        "SVD per charge block and TeNPy's truncation; densities, entropies, the centre bond's charge distribution, "
        "norm, energy, truncation error and bond dimensions every measure_every steps",
        {{"state", "an mps.init (or mps.tebd) output"}},
        "- id: quench\n  stage: mps.tebd\n  inputs: {state: psi0}\n"
        "  params: {J: 1, delta: 0.5, dt: 0.05, steps: 40, trunc: {chi_max: 64}}\n"};
    return info;
  }
  StagePlan plan(const json& p, const std::map<std::string, DatasetInfo>&) const override {
    Params::from_json(p);
    auto result = [](DType t) { return DatasetInfo{{t, {}, {}}}; };
    StagePlan plan = computed_plan({{"values", result(DType::complex128)},
                                    {"times", result(DType::float64)},
                                    {"density", result(DType::float64)},
                                    {"entropy_vN", result(DType::float64)},
                                    {"entropy_2", result(DType::float64)},
                                    {"charge_distribution", result(DType::float64)},
                                    {"norm", result(DType::float64)},
                                    {"truncation_error", result(DType::float64)},
                                    {"chi", result(DType::int64)},
                                    {"energy", result(DType::float64)},
                                    {"blocks", result(DType::int64)},
                                    {"block_offsets", result(DType::int64)},
                                    {"bond_offsets", result(DType::int64)},
                                    {"bond_charges", result(DType::int32)},
                                    {"lambda", result(DType::float64)}});
    plan.summary = {{"model", p.at("model")}, {"dt", p.at("dt")}, {"steps", p.at("steps")}, {"order", p.at("order")}};
    return plan;
  }
  std::string compute(const KernelContext& ctx) const override {
    const Params p = Params::from_json(ctx.params);
    const std::string file = ctx.inputs.at("state")->where().file;
    h5::File in = h5::File::open(file, h5::Mode::read_only);
    U1Mps psi = read_mps(in);
    if (psi.d != 2)
      throw InputError(fmt::format("the XXZ model needs spin-1/2 sites; the state in '{}' has d = {}, expected 2", file, psi.d));
    const int L = psi.L;
    // A step is Strang steps of weights w (1 for order 2; Suzuki's a, a, 1-4a, a, a for order 4,
    // as TeNPy's suzuki_trotter_decomposition): the even bonds (0,1), (2,3), ... by w dt/2, the odd
    // ones by w dt, the even ones again by w dt/2.
    const double a = 1 / (4 - std::cbrt(4.0));
    const std::vector<double> weights = p.order == 2 ? std::vector<double>{1} : std::vector<double>{a, a, 1 - 4 * a, a, a};
    struct Gates {
      std::vector<GateTable> half, full;
    };
    std::map<double, Gates> gates;  // per weight
    for (double w : weights) {
      if (gates.count(w)) continue;
      Gates& g = gates[w];
      for (int j = 0; j + 1 < L; ++j) {
        g.half.push_back(xxz_gate(p, L, j, w * p.dt / 2));
        g.full.push_back(xxz_gate(p, L, j, w * p.dt));
      }
    }
    std::vector<GateTable> terms;
    for (int j = 0; j + 1 < L; ++j)
      terms.push_back(gate_table(xxz_term(p, L, j), 2, fmt::format("the XXZ term of bond ({}, {})", j, j + 1)));
    Measurements m;
    double eps = 0;
    m.take(psi, 0.0, eps, terms);
    LayerUpdater updater(*ctx.backend, p.gpu_svd_from);
    auto layer = [&](int parity, const std::vector<GateTable>& g) { eps += updater.apply(psi, parity, g, p.trunc); };
    for (int step = 1; step <= p.steps; ++step) {
      for (double w : weights) {
        const Gates& g = gates.at(w);
        layer(0, g.half);
        layer(1, g.full);
        layer(0, g.half);
      }
      if (step % p.measure_every == 0 || step == p.steps) m.take(psi, step * p.dt, eps, terms);
    }
    const UpdateTimings tm = updater.timings();
    spdlog::info(
        "mps.tebd: {} two-site updates on {} in {:.3f} s, bonds of a layer at once; summed over the threads: Theta "
        "{:.3f} s, SVD {:.3f} s ({} blocks on the host, {} by Jacobi, {} Jacobi fallbacks), truncation {:.3f} s, "
        "C Y^dagger {:.3f} s, transfers and packing {:.3f} s",
        tm.updates, backend_name(ctx.backend->kind()), updater.wall_seconds(), tm.theta, tm.svd, tm.svd_paths.host,
        tm.svd_paths.jacobi, tm.svd_paths.host_fallbacks, tm.truncation, tm.finish, tm.transfers);
    Packer out;
    out.put_mps(psi);
    for (const auto* v : {&m.times, &m.density, &m.entropy_vn, &m.entropy_2, &m.charges, &m.norm, &m.truncation_error, &m.chi, &m.energy})
      out.put_vector(*v);
    return out.take();
  }
  void write_results(const StagePlan&, const StepResults& r, h5::File& out) const override {
    Unpacker in(*r.computed);
    const U1Mps psi = in.get_mps();
    write_mps(out, psi);
    const auto times = in.get_vector<double>(), density = in.get_vector<double>(), svn = in.get_vector<double>(),
               s2 = in.get_vector<double>(), charges = in.get_vector<double>(), norm = in.get_vector<double>(),
               eps = in.get_vector<double>(), chi_d = in.get_vector<double>(), energy = in.get_vector<double>();
    const std::uint64_t T = times.size(), L = psi.L, N = psi.total_charge;
    const std::vector<std::int64_t> chi(chi_d.begin(), chi_d.end());
    detail::write_array(out, "times", DType::float64, {T}, times.data(), "time of each measurement (step * dt)");
    detail::write_array(out, "density", DType::float64, {T, L}, density.data(), "<n_j> at each time, n = S^z + 1/2");
    detail::write_array(out, "entropy_vN", DType::float64, {T, L - 1}, svn.data(),
                        "von Neumann entropy -sum l^2 ln l^2 (natural log) of bonds 1..L-1 (bond k cuts sites 0..k-1 "
                        "from the rest)");
    detail::write_array(out, "entropy_2", DType::float64, {T, L - 1}, s2.data(), "Renyi-2 entropy -ln sum l^4 of bonds 1..L-1");
    detail::write_array(out, "charge_distribution", DType::float64, {T, N + 1}, charges.data(),
                        "P(N_left = n), n = 0..N: the probability of n particles left of bond L/2 (sites 0..L/2-1)")
        .set_attribute("bond", static_cast<std::int64_t>(L / 2));
    detail::write_array(out, "norm", DType::float64, {T}, norm.data(),
                        "<psi|psi>^(1/2), contracted without assuming canonical form");
    detail::write_array(out, "truncation_error", DType::float64, {T}, eps.data(),
                        "accumulated discarded weight: the sum over this step's two-site updates so far of eps = sum of the "
                        "discarded squared Schmidt values (normalised to 1 before the cut), as TeNPy's TruncationError.eps");
    detail::write_array(out, "energy", DType::float64, {T}, energy.data(),
                        "<H>: the sum of the bond terms' expectations (B form), the field included");
    detail::write_array(out, "chi", DType::int64, {T, L - 1}, chi.data(), "bond dimension of bonds 1..L-1");
  }
  std::string describe_results(const StagePlan&, const StepResults& r) const override {
    Unpacker in(*r.computed);
    const U1Mps psi = in.get_mps();
    std::vector<std::vector<double>> v;
    for (int i = 0; i < 9; ++i) v.push_back(in.get_vector<double>());
    std::size_t chi = 0;
    for (const Bond& b : psi.bonds) chi = std::max(chi, b.charges.size());
    return fmt::format("t = {:.6g}, {} measurements, max chi {}, truncation error {:.3e}, norm {:.12f}, energy {:.12f}",
                       v[0].back(), v[0].size(), chi, v[6].back(), v[5].back(), v[8].back());
  }
};

}  // namespace

const Stage& mps_tebd() {
  static const TebdStage stage;
  return stage;
}

}  // namespace qstage::stages
