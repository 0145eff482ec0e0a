// mps.tebd: 2nd-order (Strang) or 4th-order (Suzuki) Trotter evolution of an mps.init output under an XXZ or
// Bose-Hubbard chain, or a linear-optical interferometer's beam splitters applied as a circuit
// (stages/mps/models.hpp), with charge-blocked two-site updates (stages/mps/tebd.hpp), TeNPy's
// truncation parameters and measurements every measure_every steps.
//
// Checkpoints: a time step is a unit of the step's run (TebdStage::Run); after one, when the
// run's checkpoint interval has passed, a stop was requested, or every checkpoint_every steps,
// the runner commits the run's state (step counter, accumulated truncation error, MPS,
// measurements so far); a resumed run of the same step key goes on from there with the same bits.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <fmt/ranges.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/units.hpp"
#include "stages/mps/density_matrix.hpp"
#include "stages/mps/gates.hpp"
#include "stages/mps/models.hpp"
#include "stages/mps/mps_stages.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using namespace mps;

// Parameters that belong to some models only (those without a schema default, so that giving
// one for another model is noticed).
const std::vector<std::pair<const char*, std::vector<std::string>>> kModelParams = {
    {"U", {"bose_hubbard"}},          {"mu", {"bose_hubbard"}},      {"beam_splitters", {"interferometer"}},
    {"haar_seed", {"interferometer"}}, {"dt", {"xxz", "bose_hubbard"}}, {"steps", {"xxz", "bose_hubbard"}}};

BeamSplitter beam_splitter_from_json(const json& j, std::size_t k) {
  if (!j.is_object() || !j.contains("mode") || !j.contains("theta"))
    throw InputError(fmt::format("beam_splitters[{}] is {}; expected {{mode: m, theta: t}} with optional phi, phase_left, phase_right", k,
                                 j.dump()));
  BeamSplitter b{j.at("mode").get<int>(), j.at("theta").get<double>(), j.value("phi", 0.0), j.value("phase_left", 0.0),
                 j.value("phase_right", 0.0)};
  for (double v : {b.theta, b.phi, b.phase_left, b.phase_right})
    if (!std::isfinite(v)) throw InputError(fmt::format("beam_splitters[{}] has an angle {}; expected finite angles", k, v));
  return b;
}

ModelParams model_from_json(const json& p) {
  ModelParams m;
  m.model = p.at("model").get<std::string>();
  for (const auto& [name, owners] : kModelParams)
    if (p.contains(name) && std::find(owners.begin(), owners.end(), m.model) == owners.end())
      throw InputError(fmt::format("parameter '{}' is not for model '{}'; it belongs to {}", name, m.model, fmt::join(owners, ", ")));
  m.J = p.at("J").get<double>();
  m.delta = p.at("delta").get<double>();
  m.h = p.at("h").get<double>();
  m.order = p.at("order").get<int>();
  m.U = p.value("U", 0.0);
  m.mu = p.value("mu", 0.0);
  if (m.model == "interferometer") {
    if (p.contains("beam_splitters") == p.contains("haar_seed"))
      throw InputError("model 'interferometer' needs exactly one of 'beam_splitters' (a list) and 'haar_seed' (a Haar-random unitary)");
    m.haar = p.contains("haar_seed");
    if (m.haar) m.haar_seed = p.at("haar_seed").get<std::uint64_t>();
    else
      for (std::size_t k = 0; k < p.at("beam_splitters").size(); ++k) m.beam_splitters.push_back(beam_splitter_from_json(p.at("beam_splitters")[k], k));
    if (!m.haar && m.beam_splitters.empty()) throw InputError("parameter 'beam_splitters' is empty; expected at least one beam splitter");
    return m;
  }
  if (!p.contains("dt") || !p.contains("steps")) throw InputError(fmt::format("model '{}' needs the parameters 'dt' and 'steps'", m.model));
  m.dt = p.at("dt").get<double>();
  m.steps = p.at("steps").get<int>();
  if (!(m.dt > 0) || !std::isfinite(m.dt)) throw InputError(fmt::format("parameter 'dt' is {}; expected a finite time step > 0", m.dt));
  if (m.steps < 1) throw InputError(fmt::format("parameter 'steps' is {}; expected at least 1", m.steps));
  if (m.order != 2 && m.order != 4) throw InputError(fmt::format("parameter 'order' is {}; expected 2 (Strang) or 4 (Suzuki)", m.order));
  return m;
}

struct Params {
  ModelParams model;
  int measure_every = 1;
  std::int64_t gpu_svd_from = kernels::kGpuSvdFrom;
  int checkpoint_every = 0;  // 0: by the run's checkpoint interval (and on a stop request) only
  TruncParams trunc;
  Precision precision = Precision::complex128;
  bool precision_check = false;  // complex64: a complex128 shadow of the same evolution alongside

  static Params from_json(const json& p) {
    Params r;
    r.model = model_from_json(p);
    r.measure_every = p.at("measure_every").get<int>();
    r.gpu_svd_from = p.at("gpu_svd_from").get<std::int64_t>();
    if (r.gpu_svd_from < 0) throw InputError(fmt::format("parameter 'gpu_svd_from' is {}; expected 0 or more", r.gpu_svd_from));
    r.checkpoint_every = p.value("checkpoint_every", 0);
    // (the schema fills in top-level defaults only: the nested ones are TruncParams')
    r.trunc = trunc_params_from_json(p.at("trunc"), "trunc", false);  // (compute() sets the input's defaults)
    const json& precision = p.at("precision");
    if (precision == "complex64") r.precision = Precision::complex64;
    else if (precision != "complex128")
      throw InputError(fmt::format("parameter 'precision' is {}; expected complex128 or complex64", precision.dump()));
    r.precision_check = p.at("precision_check").get<bool>();
    if (r.precision_check && r.precision != Precision::complex64)
      throw InputError("parameter 'precision_check' compares complex64 with complex128; it needs precision: complex64");
    if (r.measure_every < 1) throw InputError(fmt::format("parameter 'measure_every' is {}; expected at least 1", r.measure_every));
    if (r.checkpoint_every < 0)
      throw InputError(fmt::format("parameter 'checkpoint_every' is {}; expected 0 (by the run's checkpoint interval) or "
                                   "a number of time steps >= 1", r.checkpoint_every));
    return r;
  }
};

// What is measured at one time.
struct Measurements {
  std::size_t width = 0;  // N + 1
  std::vector<double> times, density, entropy_vn, entropy_2, charges, norm, truncation_error, chi, energy, cut_loss, totals;
  // bond_terms[j]: the Hamiltonian's term on sites j, j+1 as a table (none: no energy).
  double seconds = 0;  // spent in take() (this run's, for the log; not checkpointed)
  void take(const U1Mps& psi, double t, double eps, double cut, const std::vector<GateTable>& bond_terms) {
    const auto start = std::chrono::steady_clock::now();
    take_at(psi, t, eps, cut, bond_terms);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void take_at(const U1Mps& psi, double t, double eps, double cut, const std::vector<GateTable>& bond_terms) {
    times.push_back(t);
    if (!bond_terms.empty()) {
      // Each bond's <h> is two Theta on the host: on the OpenMP threads (at chi 4096, L 100 the
      // bonds one after another took minutes), summed in bond order.
      std::vector<double> terms(static_cast<std::size_t>(psi.L - 1));
      parallel_for(psi.L - 1, [&](std::int64_t j) { terms[j] = bond_expectation(psi, static_cast<int>(j), bond_terms[j]); });
      double e = 0;
      for (double x : terms) e += x;
      energy.push_back(e);
    }
    if (psi.pair()) {
      // A density matrix: traces with the trace vector; the Fock cut's loss is what Tr rho lost.
      TraceMeasurements tm = trace_measurements(psi, psi.L / 2);
      density.insert(density.end(), tm.density.begin(), tm.density.end());
      entropies(psi);
      tm.left.resize(width), tm.totals.resize(width);
      charges.insert(charges.end(), tm.left.begin(), tm.left.end());
      totals.insert(totals.end(), tm.totals.begin(), tm.totals.end());
      norm.push_back(tm.trace);
      truncation_error.push_back(eps);
      cut_loss.push_back(1 - tm.trace);
      return;
    }
    const auto n = densities(psi);
    density.insert(density.end(), n.begin(), n.end());
    entropies(psi);
    // Widths of the input's largest N: a lossy interferometer may drop a total of weight 0.
    auto p = charge_distribution(psi, psi.L / 2), pn = total_charge_distribution(psi);
    p.resize(width), pn.resize(width);
    charges.insert(charges.end(), p.begin(), p.end());
    totals.insert(totals.end(), pn.begin(), pn.end());
    norm.push_back(std::sqrt(norm_squared(psi)));
    truncation_error.push_back(eps);
    cut_loss.push_back(cut);
  }
  // Of the MPS's own Schmidt values: for n_pair, the operator entanglement of rho vectorised.
  void entropies(const U1Mps& psi) {
    for (int k = 1; k < psi.L; ++k) {
      entropy_vn.push_back(mps::entropy_vn(psi.bonds[k]));
      entropy_2.push_back(entropy_renyi2(psi.bonds[k]));
      chi.push_back(static_cast<double>(psi.bonds[k].size()));
    }
  }
  // All of them, in the order they are packed (the run's saved state).
  template <class Self>
  static auto all(Self& m) {
    return std::array{&m.times, &m.density, &m.entropy_vn, &m.entropy_2, &m.charges, &m.norm, &m.truncation_error,
                      &m.chi, &m.energy, &m.cut_loss, &m.totals};
  }
  void put(Packer& out) const {
    for (const auto* v : all(*this)) out.put_vector(*v);
  }
  void get(Unpacker& in) {
    for (auto* v : all(*this)) *v = in.get_vector<double>();
  }
};

// precision_check's complex128 evolution of the same circuit, measured at the same times.
struct Shadow {
  U1Mps psi;
  Measurements m;
  double eps = 0, kept = 1;
  void put(Packer& out) const {
    out.put(eps), out.put(kept);
    out.put_mps(psi);
    m.put(out);
  }
  void get(Unpacker& in) {
    eps = in.get<double>(), kept = in.get<double>();
    psi = in.get_mps();
    m.get(in);
  }
};

// The truncation error the input state carries: mps.init's compression (its attribute), or the
// last accumulated value of an mps.tebd output; 0 if neither is there.
double input_truncation_error(const h5::File& in) {
  if (in.has_attribute("truncation_error")) return in.double_attribute("truncation_error");
  if (!in.exists("truncation_error")) return 0;
  const h5::Dataset ds = in.open_dataset("truncation_error");
  std::vector<double> v(shape_elements(ds.shape()));
  if (ds.dtype() != DType::float64 || v.empty()) return 0;
  ds.read_all(v.data());
  return v.back();
}

// How the updates shared the device budget, for the summary line: nothing where the budget held
// every update in one piece without a wait.
std::string sharing_line(const LayerUpdater::Sharing& s, const UpdateTimings& tm, int threads) {
  if (s.waited == 0 && s.alone == 0 && tm.grouped == 0) return {};
  std::string line = fmt::format(
      "; within the device budget at most {} updates ran at once on {} threads ({} waited for device memory)",
      s.most_at_once, threads, s.waited);
  if (s.alone)
    line += fmt::format(", {} ran alone after the others{}", s.alone,
                        s.alone_by_pool ? fmt::format(" ({} refused by the device pool beside them)", s.alone_by_pool)
                                        : " (their estimate did not fit beside another update)");
  return line;
}

// ------------------------------------------------------------------ ranks

// This rank's part of the log line: the bonds it updated and what its exchanges cost.
std::string describe_exchange(const mpi::Comm& comm, const ExchangeStats& x) {
  std::vector<std::string> bonds;
  for (const auto& [bond, count] : x.bonds) bonds.push_back(fmt::format("{} ({})", bond, count));
  return fmt::format("rank {} of {}: those are its share, by left site (times): {}; {} exchanges in {:.3f} s, {} bytes "
                     "sent, {} bytes received",
                     comm.rank(), comm.size(), bonds.empty() ? "none" : fmt::format("{}", fmt::join(bonds, ", ")),
                     x.exchanges, x.seconds, x.bytes_sent, x.bytes_received);
}

class TebdStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "mps.tebd", 1,
        "TEBD time evolution of a U(1) MPS under an XXZ or Bose-Hubbard chain (2nd- or 4th-order Trotter), or a "
        "linear-optical interferometer (nearest-neighbour beam splitters, given or from a Haar-random unitary) applied as "
        "a circuit; charge-blocked updates with one SVD per charge block and TeNPy's truncation; densities, entropies, "
        "the centre bond's charge distribution, norm, energy, truncation error and bond dimensions every measure_every "
        "steps (an interferometer's step is one beam splitter); complex128 or complex64 arithmetic, the latter's error against a "
        "complex128 evolution alongside on request",
        {{"state", "an mps.init (or mps.tebd) output"}},
        "- id: quench\n  stage: mps.tebd\n  inputs: {state: psi0}\n"
        "  params: {J: 1, delta: 0.5, dt: 0.05, steps: 40, trunc: {chi_max: 64}}\n"
        "- id: bh\n  stage: mps.tebd\n  inputs: {state: psi0}\n"
        "  params: {model: bose_hubbard, J: 1, U: 4, mu: 0, dt: 0.05, steps: 40}\n"
        "- id: gbs\n  stage: mps.tebd\n  inputs: {state: squeezed}\n"
        "  params: {model: interferometer, haar_seed: 7, measure_every: 100, trunc: {chi_max: 256}}\n"};
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
    plan.summary = {{"model", p.at("model")}};
    for (const char* key : {"dt", "steps", "order", "haar_seed"})
      if (p.contains(key) && (key != std::string("order") || p.at("model") != "interferometer")) plan.summary[key] = p.at(key);
    if (p.contains("beam_splitters")) plan.summary["beam_splitters"] = p.at("beam_splitters").size();
    plan.summary["precision"] = p.at("precision");
    if (p.at("precision_check").get<bool>()) {
      plan.summary["precision_check"] = true;
      for (const char* name : {"precision_error/density", "precision_error/entropy_vN", "precision_error/norm",
                               "precision_error/energy", "precision_error/truncation_error"})
        plan.results.push_back({name, result(DType::float64)});
    }
    return plan;
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  // Every rank evolves the whole MPS and computes its share of each layer's updates (LayerUpdater,
  // docs/mps.md "Ranks"); rank 0 alone measures and saves. A unit of host work is one time step
  // (one beam splitter of an interferometer); the runner commits the state (the step, the
  // accumulated truncation error, the MPS, the measurements so far, and the complex128 shadow's)
  // at its checkpoint interval, every checkpoint_every steps and at a stop, and a resumed run of
  // the same step key goes on from there with the same bits, on any rank count.
  class Run final : public StepRun {
   public:
    explicit Run(const StepContext& ctx);
    bool done() const override { return step_ >= ev_.steps; }
    std::optional<StepPass> next() override;
    HostProgress progress() const override {
      return {static_cast<std::uint64_t>(step_), static_cast<std::uint64_t>(ev_.steps),
              ev_.terms.empty() ? "beam splitters" : "time steps", p_.checkpoint_every > 0 && step_ % p_.checkpoint_every == 0};
    }
    StepPass output(StagePlan& plan) override;
    void write(const StagePlan& plan, const StepPass&, h5::File& out) const override;
    std::string describe(const StagePlan& plan, const StepPass&) const override;
    std::string save() const override;
    void load(std::string_view state) override;

   private:
    void measure(int step) {
      m_.take(psi_, ev_.times[step], eps_, 1 - kept_, ev_.terms);
      if (shadow_) shadow_->m.take(shadow_->psi, ev_.times[step], shadow_->eps, 1 - shadow_->kept, ev_.terms);
    }
    const StepContext& ctx_;
    const Params p_;
    const bool root_;
    U1Mps psi_;
    TruncParams trunc_;
    Evolution ev_;
    std::optional<comm::Communicator> ranks_;  // (LayerUpdater's exchange of the updates each rank computed)
    Measurements m_;
    double eps_ = 0, kept_ = 1;
    std::optional<Shadow> shadow_;
    std::unique_ptr<LayerUpdater> updater_, shadow_updater_;
    int step_ = 0;  // time steps done
  };

  // |complex64 - complex128| of the measurements at each time (max over sites or bonds).
  static void write_precision_error(h5::File& out, const Measurements& m, const Measurements& ref, bool circuit) {
    const std::size_t T = m.times.size();
    auto max_diff = [&](const std::vector<double>& a, const std::vector<double>& b) {
      std::vector<double> d(T, 0.0);
      const std::size_t w = a.size() / T;
      for (std::size_t t = 0; t < T; ++t)
        for (std::size_t i = 0; i < w; ++i) d[t] = std::max(d[t], std::abs(a[t * w + i] - b[t * w + i]));
      return d;
    };
    const char* run = "from a complex128 evolution of the same circuit with the same truncation run alongside "
                      "(precision_check): ";
    const std::vector<std::uint64_t> shape{T};
    auto put = [&](const char* name, const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
      const std::vector<double> d = max_diff(a, b);
      detail::write_array(out, name, DType::float64, shape, d.data(), (std::string(run) + what).c_str());
    };
    put("precision_error/density", m.density, ref.density, "max over sites of |density (complex64) - density (complex128)| at each time");
    put("precision_error/entropy_vN", m.entropy_vn, ref.entropy_vn, "max over bonds of |entropy_vN (complex64) - entropy_vN (complex128)| at each time");
    put("precision_error/norm", m.norm, ref.norm, "|norm (complex64) - norm (complex128)| at each time");
    put("precision_error/truncation_error", m.truncation_error, ref.truncation_error,
        "|truncation_error (complex64) - truncation_error (complex128)| at each time");
    if (!circuit) put("precision_error/energy", m.energy, ref.energy, "|energy (complex64) - energy (complex128)| at each time");
  }
  // The datasets of a mixed boundary (P(N)) and of an interferometer (its cut loss and unitary).
  static void write_optics(h5::File& out, const U1Mps& psi, std::uint64_t T, std::uint64_t N, const std::vector<double>& totals,
                           const std::vector<double>& cut, const std::vector<cplx>& unitary, const std::vector<double>& circuit) {
    if (psi.bonds[0].size() > 1)
      detail::write_array(out, "total_charge_distribution", DType::float64, {T, N + 1}, totals.data(),
                          psi.pair() ? "P(N) = Tr(rho Pi_N) / Tr rho, N = 0..total_charge: the total photon number distribution"
                                     : "P(N), N = 0..total_charge: the total particle (photon) number distribution, bond 0's lambda^2");
    if (unitary.empty()) return;
    detail::write_array(out, "cut_loss", DType::float64, {T}, cut.data(),
                        psi.pair() ? "1 - Tr rho: probability lost so far to the Fock cut (occupations > d-1) by the beam splitters; "
                                     "the measurements are divided by Tr rho, so they are conditional on staying inside the cut"
                                   : "probability lost so far to the Fock cut (occupations > d-1) by the beam splitters, 1 - prod(1 - loss "
                                     "of each gate); the state is renormalised after each gate, so the measurements are conditional on "
                                     "staying inside the cut");
    const std::uint64_t M = psi.L;
    detail::write_array(out, "unitary", DType::complex128, {M, M}, unitary.data(),
                        "the interferometer's mode matrix U: a+_j -> sum_i U_ij a+_i (output <n_i> = sum_j |U_ij|^2 <n_j> for "
                        "inputs without coherences between modes)");
    detail::write_array(out, "beam_splitters", DType::float64, {circuit.size() / 5, 5}, circuit.data(),
                        "the beam splitters in the order applied: (mode, theta, phi, phase_left, phase_right), each "
                        "exp(-i theta (e^{i phi} a+ b + e^{-i phi} a b+)) on modes (mode, mode + 1) after exp(i phase_left n_a) "
                        "exp(i phase_right n_b); U is the product of their mode matrices");
  }
};

TebdStage::Run::Run(const StepContext& ctx)
    : ctx_(ctx), p_(Params::from_json(ctx.params)), root_(!ctx.comm || ctx.comm->root()) {
  const std::string file = ctx.inputs.at("state")->where().file;
  h5::File in = h5::File::open(file, h5::Mode::read_only);
  psi_ = read_mps(in);
  ModelParams model = p_.model;
  model.density_matrix = psi_.pair();
  trunc_ = trunc_params_from_json(ctx.params.at("trunc"), "trunc", psi_.pair());
  ev_ = make_evolution(model, psi_.L, psi_.d);
  if (ctx.comm && ctx.comm->size() > 1) ranks_.emplace(*ctx.comm, ctx.backend);
  eps_ = input_truncation_error(in);
  if (p_.precision_check) shadow_.emplace(Shadow{psi_, {}, eps_, 1});
  m_.width = static_cast<std::size_t>(psi_.total_charge + 1);
  if (shadow_) shadow_->m.width = m_.width;
  updater_ = std::make_unique<LayerUpdater>(*ctx.backend, p_.gpu_svd_from, p_.precision, ranks_ ? &*ranks_ : nullptr);
  if (shadow_)
    shadow_updater_ = std::make_unique<LayerUpdater>(*ctx.backend, p_.gpu_svd_from, Precision::complex128, ranks_ ? &*ranks_ : nullptr);
}

std::optional<StepPass> TebdStage::Run::next() {
  if (step_ == 0 && root_ && m_.times.empty()) measure(0);
  const int step = step_ + 1;
  apply_step(psi_, ev_, step, trunc_, eps_, kept_, *updater_);
  if (shadow_) apply_step(shadow_->psi, ev_, step, trunc_, shadow_->eps, shadow_->kept, *shadow_updater_);
  if (root_ && (step % p_.measure_every == 0 || step == ev_.steps)) measure(step);
  step_ = step;
  return std::nullopt;
}

std::string TebdStage::Run::save() const {
  if (!root_) return {};  // (rank 0's is committed; every rank has the same MPS, rank 0 alone the measurements)
  Packer out;
  out.put(step_), out.put(eps_), out.put(kept_);
  out.put_mps(psi_);
  m_.put(out);
  if (shadow_) shadow_->put(out);
  return out.take();
}

void TebdStage::Run::load(std::string_view state) {
  Unpacker in(state);
  const int step = in.get<int>();
  const double eps = in.get<double>(), kept = in.get<double>();
  U1Mps psi = in.get_mps();
  Measurements m;
  m.get(in);
  Shadow shadow;
  if (shadow_) shadow.get(in);
  in.finish();
  if (step < 1 || step > ev_.steps)
    throw std::runtime_error(fmt::format("its step {} is not one of 1..{}", step, ev_.steps));
  psi_ = std::move(psi), eps_ = eps, kept_ = kept, step_ = step;
  const std::size_t width = m_.width;
  m_ = std::move(m);
  m_.width = width;
  if (shadow_) {
    shadow.m.width = width;
    *shadow_ = std::move(shadow);
  }
  if (root_)  // (copy_from_root loads on the other ranks only)
    spdlog::info("mps.tebd: resuming after {} {} of {} (t = {:.6g}) from the committed state",
                 ev_.terms.empty() ? "beam splitter" : "time step", step, ev_.steps, ev_.times[step]);
}

StepPass TebdStage::Run::output(StagePlan& plan) {
  const UpdateTimings tm = updater_->timings();
  const LayerUpdater& updater = *updater_;
  const Measurements& m = m_;
  const Shadow* sh = shadow_ ? &*shadow_ : nullptr;
  const StepContext& ctx = ctx_;
  const std::optional<comm::Communicator>& ranks = ranks_;
  spdlog::info(
      "mps.tebd: {} two-site updates on {} in {:.3f} s, bonds of a layer at once; summed over the threads: planning "
      "{:.3f} s, Theta "
      "{:.3f} s ({} GEMM products, {} sector pairs gathered, {} of them wide in {} rounds), SVD {:.3f} s ({} blocks on "
      "the host, {} by Jacobi, {} by gesvdp{}, {} fallbacks to the host), truncation {:.3f} s, "
      "C Y^dagger {:.3f} s, transfers and packing {:.3f} s; measurements {:.3f} s{}{}{}{}{}",
      tm.updates, backend_name(ctx.backend->kind()), updater.wall_seconds(), tm.planning, tm.theta, tm.products,
      tm.gathered_pairs, tm.wide_pairs, tm.rounds, tm.svd, tm.svd_paths.host, tm.svd_paths.jacobi, tm.svd_paths.polar,
      tm.svd_paths.polar ? fmt::format(" with a perturbation of at most {:.1e}", tm.svd_paths.polar_shift)
                         : std::string(),
      tm.svd_paths.host_fallbacks, tm.truncation, tm.finish, tm.transfers, m.seconds + (sh ? sh->m.seconds : 0.0),
      tm.canonicalizations
          ? fmt::format("; the chain brought back to canonical form after {} gates that were not unitary, in {:.3f} s",
                        tm.canonicalizations, tm.canonical)
          : std::string(),
      sharing_line(updater.sharing(), tm, omp_get_max_threads()),
      tm.grouped
          ? fmt::format(
                "; {} update{} larger than {} device share went in groups of centre charges ({} groups, C and Vh "
                "parked in host memory between the passes)",
                tm.grouped, tm.grouped == 1 ? "" : "s", tm.grouped == 1 ? "its" : "their",
                tm.groups - (tm.updates - tm.grouped))
          : std::string(),
      tm.svd_for_memory
          ? fmt::format("; {} charge block{} decomposed on the host: {} GPU SVD workspace did not fit the device "
                        "budget",
                        tm.svd_for_memory, tm.svd_for_memory == 1 ? "" : "s", tm.svd_for_memory == 1 ? "its" : "their")
          : std::string(),
      ranks ? "; " + describe_exchange(*ctx.comm, updater.exchange_stats()) : std::string());
  copy_from_root(*this, ctx_.comm);  // (rank 0's measurements to the others, for write())
  return planned_pass(plan, no_pass_kernel());
}

void TebdStage::Run::write(const StagePlan& plan, const StepPass&, h5::File& out) const {
  const U1Mps& psi = psi_;
  write_mps(out, psi);
  const Measurements& m = m_;
  const auto &times = m.times, &density = m.density, &svn = m.entropy_vn, &s2 = m.entropy_2, &charges = m.charges,
             &norm = m.norm, &eps = m.truncation_error, &chi_d = m.chi, &energy = m.energy, &cut = m.cut_loss,
             &totals = m.totals;
  const auto& unitary = ev_.unitary;
  std::vector<double> beam_splitters;
  for (const BeamSplitter& b : ev_.circuit)
    beam_splitters.insert(beam_splitters.end(), {double(b.mode), b.theta, b.phi, b.phase_left, b.phase_right});
  const std::string model = plan.summary.at("model").get<std::string>();
  const bool circuit = model == "interferometer";
  const std::uint64_t T = times.size(), L = psi.L, N = charges.size() / T - 1;
  const std::vector<std::int64_t> chi(chi_d.begin(), chi_d.end());
  detail::write_array(out, "times", DType::float64, {T}, times.data(),
                      circuit ? "beam splitters applied at each measurement" : "time of each measurement (step * dt)");
  const bool rho = psi.pair();
  detail::write_array(out, "density", DType::float64, {T, L}, density.data(),
                      rho              ? "Tr(rho n_j) / Tr rho at each time (photons per mode; rho the density matrix)"
                      : model == "xxz" ? "<n_j> at each time, n = S^z + 1/2"
                                       : "<n_j> at each time (bosons: mean occupation, photons per mode)");
  detail::write_array(
      out, "entropy_vN", DType::float64, {T, L - 1}, svn.data(),
      rho ? "operator entanglement of the density matrix: -sum l^2 ln l^2 (natural log) of the Schmidt values of "
            "rho vectorised and normalised to Frobenius norm 1, bonds 1..L-1 (not a von Neumann entropy of rho)"
          : "von Neumann entropy -sum l^2 ln l^2 (natural log) of bonds 1..L-1 (bond k cuts sites 0..k-1 "
            "from the rest)");
  detail::write_array(out, "entropy_2", DType::float64, {T, L - 1}, s2.data(),
                      rho ? "Renyi-2 operator entanglement -ln sum l^4 of rho vectorised, bonds 1..L-1"
                          : "Renyi-2 entropy -ln sum l^4 of bonds 1..L-1");
  detail::write_array(out, "charge_distribution", DType::float64, {T, N + 1}, charges.data(),
                      rho ? "P(N_left = n) = Tr(rho Pi_n) / Tr rho, n = 0..N: the probability of n photons left of "
                            "bond L/2 (sites 0..L/2-1)"
                          : "P(N_left = n), n = 0..N: the probability of n particles left of bond L/2 (sites 0..L/2-1)")
      .set_attribute("bond", static_cast<std::int64_t>(L / 2));
  detail::write_array(
      out, "norm", DType::float64, {T}, norm.data(),
      rho ? "Tr rho: 1 at the input (renormalised inside mps.init's cut), less what the Fock cut of the beam splitters "
            "(and any truncation) took"
          : "<psi|psi>^(1/2), contracted without assuming canonical form");
  detail::write_array(
      out, "truncation_error", DType::float64, {T}, eps.data(),
      "accumulated discarded weight: the input's own (mps.init's compression, or an earlier mps.tebd's) plus the "
      "sum over this step's two-site updates so far of eps = sum of the discarded squared Schmidt values "
      "(normalised to 1 before the cut), as TeNPy's TruncationError.eps");
  if (!circuit)
    detail::write_array(out, "energy", DType::float64, {T}, energy.data(),
                        "<H>: the sum of the bond terms' expectations (B form), the field included");
  detail::write_array(out, "chi", DType::int64, {T, L - 1}, chi.data(), "bond dimension of bonds 1..L-1");
  write_optics(out, psi, T, N, totals, cut, unitary, beam_splitters);
  const std::string precision = plan.summary.value("precision", std::string("complex128"));
  out.set_attribute("precision", precision);
  if (shadow_) TebdStage::write_precision_error(out, m, shadow_->m, circuit);
}

std::string TebdStage::Run::describe(const StagePlan& plan, const StepPass&) const {
  const U1Mps& psi = psi_;
  const Measurements& m = m_;
  std::size_t chi = 0;
  for (const Bond& b : psi.bonds) chi = std::max(chi, b.charges.size());
  const std::string energy = m.energy.empty() ? fmt::format("cut loss {:.3e}", m.cut_loss.back())
                                              : fmt::format("energy {:.12f}", m.energy.back());
  std::string check;
  if (shadow_) {
    const Measurements& reference = shadow_->m;
    double worst = 0;
    for (std::size_t i = 0; i < m.density.size(); ++i)
      worst = std::max(worst, std::abs(m.density[i] - reference.density[i]));
    check = fmt::format(", complex64's largest density error {:.3e}", worst);
  }
  return fmt::format("t = {:.6g}, {} measurements, max chi {}, truncation error {:.3e}, norm {:.12f}, {}{}",
                     m.times.back(), m.times.size(), chi, m.truncation_error.back(), m.norm.back(), energy, check);
}

}  // namespace

const Stage& mps_tebd() {
  static const TebdStage stage;
  return stage;
}

}  // namespace qstage::stages
