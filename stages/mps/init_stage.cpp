// mps.init: an initial U(1) MPS (product states, squeezed vacua or a seeded random state) in the layout of
// docs/mps.md, for mps.tebd to evolve.
#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "stages/mps/density_matrix.hpp"
#include "stages/mps/models.hpp"
#include "stages/mps/mps_stages.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/u1mps.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using namespace mps;

// Parameters that belong to one state only; giving one for another state is a mistake to report.
const std::vector<std::pair<const char*, const char*>> kStateParams = {
    {"first", "neel"}, {"filled", "domain_wall"}, {"occupations", "fock"},
    {"total_charge", "random"}, {"chi", "random"}, {"seed", "random"}, {"squeezing", "squeezed"}, {"squeezing_phase", "squeezed"},
    {"eta", "squeezed"}, {"density_matrix", "squeezed"}};

// A per-mode parameter of the squeezed state: one number for every mode, or a list of L.
std::vector<double> per_mode(const json& p, const char* name, int L, double fallback) {
  if (!p.contains(name)) return std::vector<double>(static_cast<std::size_t>(L), fallback);
  const json& v = p.at(name);
  std::vector<double> out = v.is_array() ? v.get<std::vector<double>>() : std::vector<double>(static_cast<std::size_t>(L), v.get<double>());
  if (static_cast<int>(out.size()) != L)
    throw InputError(fmt::format("parameter '{}' has {} entries; expected one number or L = {}", name, out.size(), L));
  for (std::size_t j = 0; j < out.size(); ++j)
    if (!std::isfinite(out[j])) throw InputError(fmt::format("parameter '{}'[{}] is {}; expected a finite number", name, j, out[j]));
  return out;
}

// Each mode's squeezed vacuum cut at d, checked: r >= 0, and d >= 3 where squeezing is asked for
// (d = 2 would keep only the vacuum of a squeezed mode).
std::vector<std::vector<cplx>> squeezed_modes(const json& p) {
  const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
  if (!p.contains("squeezing")) throw InputError("state 'squeezed' needs the parameter 'squeezing' (r: one number or L numbers)");
  const auto r = per_mode(p, "squeezing", L, 0), phase = per_mode(p, "squeezing_phase", L, 0);
  std::vector<std::vector<cplx>> modes;
  for (int j = 0; j < L; ++j) {
    if (r[j] < 0) throw InputError(fmt::format("parameter 'squeezing'[{}] is {}; expected r >= 0", j, r[j]));
    if (r[j] > 0 && d < 3)
      throw InputError(fmt::format("state 'squeezed' has d = {}, which keeps only the vacuum of a squeezed mode; expected d >= 3", d));
    modes.push_back(squeezed_vacuum(r[j], phase[j], d));
  }
  return modes;
}

// The transmissivity of the uniform loss (1: none), checked.
double transmissivity(const json& p) {
  const double eta = p.value("eta", 1.0);
  if (!(eta > 0 && eta <= 1))
    throw InputError(fmt::format("parameter 'eta' is {}; expected a transmissivity 0 < eta <= 1 (loss 1 - eta)", eta));
  return eta;
}

// Whether the squeezed state is written as a density matrix (n_pair): eta < 1, or asked for.
bool density_matrix(const json& p) { return p.value("density_matrix", transmissivity(p) < 1); }

// Each mode's lossy squeezed state rho_j (d x d, the loss applied before the cut), normalised to
// trace 1 inside the cut and vectorised at n_ket d + n_bra; `lost` = 1 - prod_j (its trace in the cut).
std::vector<std::vector<cplx>> lossy_modes(const json& p, double& lost) {
  const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
  squeezed_modes(p);  // (its checks)
  const auto r = per_mode(p, "squeezing", L, 0), phase = per_mode(p, "squeezing_phase", L, 0);
  const double eta = transmissivity(p);
  if (static_cast<long>(L) * (d - 1) > kernels::kPairMax)
    throw InputError(fmt::format("a density matrix of L = {} modes cut at d = {} may hold {} photons; expected at most {}", L, d,
                                 static_cast<long>(L) * (d - 1), kernels::kPairMax));
  std::vector<std::vector<cplx>> modes;
  double kept = 1;
  for (int j = 0; j < L; ++j) {
    std::vector<cplx> rho = lossy_squeezed_density(r[j], phase[j], eta, d);
    double tr = 0;
    for (int n = 0; n < d; ++n) tr += rho[n * d + n].real();
    for (cplx& v : rho) v /= tr;
    kept *= tr;
    modes.push_back(std::move(rho));
  }
  lost = 1 - kept;
  return modes;
}

// The probability the Fock cut removes from the product of `modes`: 1 - prod_j sum_{n<d} |a_n|^2.
double cut_loss(const std::vector<std::vector<cplx>>& modes) {
  double kept = 1;
  for (const auto& a : modes) {
    double w = 0;
    for (const cplx& v : a) w += std::norm(v);
    kept *= w;
  }
  return 1 - kept;
}

// The occupations of a product state, checked against L and d.
std::vector<int> occupations(const json& p) {
  const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
  const std::string state = p.at("state").get<std::string>();
  std::vector<int> n(static_cast<std::size_t>(L), 0);
  if (state == "neel") {
    const int first = p.value("first", std::string("odd")) == "odd" ? 0 : 1;
    for (int j = first; j < L; j += 2) n[j] = 1;
  } else if (state == "domain_wall") {
    const int filled = p.contains("filled") ? p.at("filled").get<int>() : L / 2;
    if (filled > L) throw InputError(fmt::format("parameter 'filled' is {}; expected at most L = {} sites", filled, L));
    for (int j = 0; j < filled; ++j) n[j] = 1;
  } else {
    if (!p.contains("occupations")) throw InputError("state 'fock' needs the parameter 'occupations' (a list of L occupations)");
    n = p.at("occupations").get<std::vector<int>>();
    if (static_cast<int>(n.size()) != L)
      throw InputError(fmt::format("parameter 'occupations' has {} entries; expected L = {}", n.size(), L));
    for (std::size_t j = 0; j < n.size(); ++j)
      if (n[j] < 0 || n[j] > d - 1)
        throw InputError(fmt::format("parameter 'occupations'[{}] is {}; expected an occupation in [0, d-1] = [0, {}]", j, n[j], d - 1));
  }
  return n;
}

void check(const json& p) {
  const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
  if (p.contains("trunc")) trunc_params_from_json(p.at("trunc"), "trunc", false);
  const std::string state = p.at("state").get<std::string>();
  for (const auto& [name, owner] : kStateParams)
    if (p.contains(name) && state != owner)
      throw InputError(fmt::format("parameter '{}' is for state '{}', not '{}'", name, owner, state));
  if (state == "random") {
    if (!p.contains("total_charge")) throw InputError("state 'random' needs the parameter 'total_charge'");
    const int n = p.at("total_charge").get<int>();
    if (n < 0 || n > L * (d - 1))
      throw InputError(fmt::format("parameter 'total_charge' is {}; expected 0 <= total_charge <= L (d-1) = {}", n, L * (d - 1)));
  } else if (state == "squeezed") {
    squeezed_modes(p);
    double lost = 0;
    if (density_matrix(p)) lossy_modes(p, lost);
  } else {
    occupations(p);
  }
}

class InitStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "mps.init", 1,
        "an initial U(1)-symmetric MPS (Neel, domain wall, any Fock state, a seeded random state in "
        "right-canonical form with exact Schmidt values, or single-mode squeezed vacua cut at d photons per mode, whose "
        "total photon number N is carried by bond 0 as a mixed boundary), block-sparse by charge",
        {},
        "- id: psi0\n  stage: mps.init\n  params: {L: 40, state: neel}\n"
        "- id: squeezed\n  stage: mps.init\n  params: {L: 6, d: 9, state: squeezed, squeezing: [0.5, 0.5, 0.5, 0, 0, 0]}\n"};
    return info;
  }
  StagePlan plan(const json& p, const std::map<std::string, DatasetInfo>&) const override {
    check(p);
    auto result = [](DType t) { return DatasetInfo{{t, {}, {}}}; };
    StagePlan plan = computed_plan({{"values", result(DType::complex128)},
                                    {"blocks", result(DType::int64)},
                                    {"block_offsets", result(DType::int64)},
                                    {"bond_offsets", result(DType::int64)},
                                    {"bond_charges", result(DType::int32)},
                                    {"lambda", result(DType::float64)}});
    plan.summary = {{"L", p.at("L")}, {"d", p.at("d")}, {"state", p.at("state")}};
    return plan;
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public ComputedRun {
   public:
    using ComputedRun::ComputedRun;
    void compute() override;
    std::string save() const override {
      Packer out;
      out.put_mps(psi_);
      out.put(lost_);
      out.put(discarded_);
      return out.take();
    }
    void load(std::string_view state) override {
      Unpacker in(state);
      psi_ = in.get_mps();
      lost_ = in.get<double>(), discarded_ = in.get<double>();
      in.finish();
    }
    void write(const StagePlan&, const StepPass&, h5::File& out) const override;
    std::string describe(const StagePlan&, const StepPass&) const override;

   private:
    U1Mps psi_;
    double lost_ = 0, discarded_ = 0;  // the Fock cut's loss, the compression's discarded weight
  };
};

void InitStage::Run::compute() {
  const json& p = ctx_.params;
  const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
  const std::string state = p.at("state").get<std::string>();
  double& lost = lost_;
  U1Mps& psi = psi_;
  if (state == "random")
    psi = random_state(L, d, p.at("total_charge").get<int>(), p.value("chi", 16), p.value("seed", std::uint64_t{0}));
  else if (state == "squeezed" && density_matrix(p)) {
    psi = product_superposition(d, lossy_modes(p, lost), kernels::ChargeKind::n_pair);
  } else if (state == "squeezed") {
    const auto modes = squeezed_modes(p);
    psi = product_superposition(d, modes);
    lost = cut_loss(modes);
  } else
    psi = product_state(d, occupations(p));
  // (the compression sweep: bonds cut on their exact Schmidt values, so that mps.tebd starts at chi_max)
  discarded_ = p.contains("trunc") ? compress(psi, trunc_params_from_json(p.at("trunc"), "trunc", psi.pair())) : 0.0;
  psi.check_structure();
}

void InitStage::Run::write(const StagePlan&, const StepPass&, h5::File& out) const {
  const U1Mps& psi = psi_;
  const double lost = lost_, discarded = discarded_;
  write_mps(out, psi);
  // (mps.tebd's accumulated truncation_error starts from it)
  out.set_attribute("truncation_error", discarded);
  if (psi.bonds[0].size() == 1) return;
  // A mixed boundary: its P(N), and what the Fock cut took from the input.
  const auto pn = psi.pair() ? trace_measurements(psi, psi.L / 2).totals : total_charge_distribution(psi);
  detail::write_array(
      out, "total_charge_distribution", DType::float64, {pn.size()}, pn.data(),
      psi.pair() ? "P(N), N = 0..total_charge: the total photon number distribution Tr(rho Pi_N), "
                   "renormalised inside the Fock cut"
                 : "P(N), N = 0..total_charge: the total particle (photon) number distribution, bond 0's lambda^2, "
                   "renormalised inside the Fock cut");
  out.set_attribute("cut_loss", lost);
}
std::string InitStage::Run::describe(const StagePlan&, const StepPass&) const {
  const U1Mps& psi = psi_;
  const double discarded = discarded_;
  std::size_t chi = 0, blocks = 0;
  for (const Bond& b : psi.bonds) chi = std::max(chi, b.charges.size());
  for (const Site& s : psi.sites) blocks += s.blocks.size();
  return fmt::format("L {}, d {}, N {}{}, max chi {}, {} blocks, truncation error {:.3e}", psi.L, psi.d,
                     psi.bonds[0].size() > 1 ? "<= " : "", psi.total_charge, chi, blocks, discarded);
}

}  // namespace

const Stage& mps_init() {
  static const InitStage stage;
  return stage;
}

}  // namespace qstage::stages
