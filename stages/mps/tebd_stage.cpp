// mps.tebd: 2nd-order (Strang) or 4th-order (Suzuki) Trotter evolution of an mps.init output under an XXZ chain, with
// charge-blocked two-site updates (stages/mps/tebd.hpp), TeNPy's truncation parameters and
// measurements every measure_every steps.
//
// Checkpoints: after a time step, when the run's checkpoint interval has passed, a stop was
// requested, or every checkpoint_every steps, rank 0 writes the state (step counter, accumulated
// truncation error, MPS, measurements so far) atomically to stage-tebd-<step>.bin in the step's
// work directory and commits a pass state naming it (KernelContext::checkpoints); a resumed run
// of the same step key goes on from there with the same bits.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/hash.hpp"
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
  int checkpoint_every = 0;  // 0: by the run's checkpoint interval (and on a stop request) only
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
    r.checkpoint_every = p.value("checkpoint_every", 0);
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
    if (r.checkpoint_every < 0)
      throw InputError(fmt::format("parameter 'checkpoint_every' is {}; expected 0 (by the run's checkpoint interval) or "
                                   "a number of time steps >= 1", r.checkpoint_every));
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
  // All of them, in the order they are packed (compute()'s result and the checkpoints).
  std::vector<std::vector<double>*> all() {
    return {&times, &density, &entropy_vn, &entropy_2, &charges, &norm, &truncation_error, &chi, &energy};
  }
  void put(Packer& out) {
    for (const auto* v : all()) out.put_vector(*v);
  }
  void get(Unpacker& in) {
    for (auto* v : all()) *v = in.get_vector<double>();
  }
};

// ------------------------------------------------------------------------------ checkpoints

constexpr const char* kCheckpointPrefix = "stage-tebd-";

// Removes the step's checkpoint files other than `keep` (those an earlier commit named).
void remove_other_checkpoints(const std::filesystem::path& dir, const std::string& keep) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kCheckpointPrefix) && name != keep) std::filesystem::remove(entry.path(), ec);
  }
}

// Rank 0, after time step `step`: the state into a file (atomically), then the pass state naming
// it. Throws StopRequested once committed if a stop was requested.
void checkpoint(const KernelContext& ctx, int step, double eps, const U1Mps& psi, Measurements& m) {
  Packer out;
  out.put(step), out.put(eps);
  out.put_mps(psi);
  m.put(out);
  const std::string bytes = out.take(), name = fmt::format("{}{}.bin", kCheckpointPrefix, step);
  fsutil::write_file_atomic(ctx.work_dir / name, bytes);
  const json data = {{"tebd", {{"step", step}, {"file", name}, {"bytes", bytes.size()}, {"hash", hash_bytes(bytes)}}}};
  try {
    ctx.checkpoints->commit(data, static_cast<std::uint64_t>(step));
  } catch (const StopRequested&) {
    remove_other_checkpoints(ctx.work_dir, name);
    throw;
  }
  remove_other_checkpoints(ctx.work_dir, name);
}

// The state the last checkpoint of this step key committed, into psi, m and eps; its step, or 0
// if there is none (or it cannot be used: then the evolution starts again, nothing is lost).
int restore(const KernelContext& ctx, const Params& p, U1Mps& psi, Measurements& m, double& eps) {
  if (!ctx.passes || !ctx.passes->data.contains("tebd")) return 0;
  const json& c = ctx.passes->data["tebd"];
  const std::filesystem::path file = ctx.work_dir / c.at("file").get<std::string>();
  try {
    const std::string bytes = fsutil::read_file(file);
    if (bytes.size() != c.at("bytes").get<std::size_t>() || hash_bytes(bytes) != c.at("hash").get<std::string>())
      throw std::runtime_error("it does not hold the state its commit recorded");
    Unpacker in(bytes);
    const int step = in.get<int>();
    const double e = in.get<double>();
    U1Mps saved = in.get_mps();
    Measurements saved_m;
    saved_m.get(in);
    if (!in.done() || step != c.at("step").get<int>() || step < 1 || step > p.steps)
      throw std::runtime_error("its content does not match its commit");
    psi = std::move(saved);
    m = std::move(saved_m);
    eps = e;
    spdlog::info("mps.tebd: resuming after time step {} of {} (t = {:.6g}) from {}", step, p.steps, step * p.dt,
                 file.filename().string());
    return step;
  } catch (const std::exception& e) {
    spdlog::warn("mps.tebd: discarding checkpoint {}: {}; starting from t = 0", file.string(), e.what());
    return 0;
  }
}

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
    // (a resumed run: the committed state replaces psi, m and eps)
    const int done = restore(ctx, p, psi, m, eps);
    if (done == 0) m.take(psi, 0.0, eps, terms);
    auto layer = [&](int parity, const std::vector<GateTable>& g) {
      for (int j = parity; j + 1 < L; j += 2) eps += update_bond(psi, j, g[j], p.trunc);
    };
    for (int step = done + 1; step <= p.steps; ++step) {
      for (double w : weights) {
        const Gates& g = gates.at(w);
        layer(0, g.half);
        layer(1, g.full);
        layer(0, g.half);
      }
      if (step % p.measure_every == 0 || step == p.steps) m.take(psi, step * p.dt, eps, terms);
      if (ctx.checkpoints) {  // (due() also draws the progress line: asked every step)
        const bool due = ctx.checkpoints->due(step, p.steps, "time steps");
        if (step < p.steps && (due || (p.checkpoint_every > 0 && step % p.checkpoint_every == 0)))
          checkpoint(ctx, step, eps, psi, m);
      }
    }
    Packer out;
    out.put_mps(psi);
    m.put(out);
    return out.take();
  }
  void write_results(const StagePlan&, const StepResults& r, h5::File& out) const override {
    Unpacker in(*r.computed);
    const U1Mps psi = in.get_mps();
    write_mps(out, psi);
    Measurements m;
    m.get(in);
    const auto &times = m.times, &density = m.density, &svn = m.entropy_vn, &s2 = m.entropy_2, &charges = m.charges,
               &norm = m.norm, &eps = m.truncation_error, &chi_d = m.chi, &energy = m.energy;
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
    Measurements m;
    m.get(in);
    std::size_t chi = 0;
    for (const Bond& b : psi.bonds) chi = std::max(chi, b.charges.size());
    return fmt::format("t = {:.6g}, {} measurements, max chi {}, truncation error {:.3e}, norm {:.12f}, energy {:.12f}",
                       m.times.back(), m.times.size(), chi, m.truncation_error.back(), m.norm.back(), m.energy.back());
  }
};

}  // namespace

const Stage& mps_tebd() {
  static const TebdStage stage;
  return stage;
}

}  // namespace qstage::stages
