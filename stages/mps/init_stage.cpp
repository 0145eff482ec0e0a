// mps.init: an initial U(1) MPS (product states or a seeded random state) in the layout of
// docs/mps.md, for mps.tebd to evolve.
#include <fmt/format.h>

#include <numeric>

#include "core/error.hpp"
#include "stages/mps/mps_stages.hpp"
#include "stages/mps/serial.hpp"
#include "stages/mps/u1mps.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using namespace mps;

// Parameters that belong to one state only; giving one for another state is a mistake to report.
const std::vector<std::pair<const char*, const char*>> kStateParams = {
    {"first", "neel"}, {"filled", "domain_wall"}, {"occupations", "fock"},
    {"total_charge", "random"}, {"chi", "random"}, {"seed", "random"}};

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
  const std::string state = p.at("state").get<std::string>();
  for (const auto& [name, owner] : kStateParams)
    if (p.contains(name) && state != owner)
      throw InputError(fmt::format("parameter '{}' is for state '{}', not '{}'", name, owner, state));
  if (state == "random") {
    if (!p.contains("total_charge")) throw InputError("state 'random' needs the parameter 'total_charge'");
    const int n = p.at("total_charge").get<int>();
    if (n < 0 || n > L * (d - 1))
      throw InputError(fmt::format("parameter 'total_charge' is {}; expected 0 <= total_charge <= L (d-1) = {}", n, L * (d - 1)));
  } else {
    occupations(p);
  }
}

class InitStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "mps.init", 1,
        "an initial U(1)-symmetric MPS (Neel, domain wall, any Fock state, or a seeded random state in "
        "right-canonical form with exact Schmidt values), block-sparse by charge",
        {},
        "- id: psi0\n  stage: mps.init\n  params: {L: 40, state: neel}\n"};
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
  std::string compute(const KernelContext& ctx) const override {
    const json& p = ctx.params;
    const int L = p.at("L").get<int>(), d = p.at("d").get<int>();
    U1Mps psi = p.at("state") == "random"
                    ? random_state(L, d, p.at("total_charge").get<int>(), p.value("chi", 16),
                                   p.value("seed", std::uint64_t{0}))
                    : product_state(d, occupations(p));
    psi.check_structure();
    Packer out;
    out.put_mps(psi);
    return out.take();
  }
  void write_results(const StagePlan&, const StepResults& r, h5::File& out) const override {
    Unpacker in(*r.computed);
    write_mps(out, in.get_mps());
  }
  std::string describe_results(const StagePlan&, const StepResults& r) const override {
    Unpacker in(*r.computed);
    const U1Mps psi = in.get_mps();
    std::size_t chi = 0, blocks = 0;
    for (const Bond& b : psi.bonds) chi = std::max(chi, b.charges.size());
    for (const Site& s : psi.sites) blocks += s.blocks.size();
    return fmt::format("L {}, d {}, N {}, max chi {}, {} blocks", psi.L, psi.d, psi.total_charge, chi, blocks);
  }
};

}  // namespace

const Stage& mps_init() {
  static const InitStage stage;
  return stage;
}

}  // namespace qstage::stages
