#include "stages/sci/problem.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "core/error.hpp"

namespace qstage::sci {

StateRequest StateRequest::from_json(const nlohmann::json& p) {
  StateRequest s;
  if (p.contains("irrep")) s.irrep = p.at("irrep").get<int>();
  if (p.contains("ms2")) s.ms2 = p.at("ms2").get<int>();
  if (p.contains("occupation")) s.occupation = p.at("occupation").get<std::vector<int>>();
  return s;
}

namespace {
// The FCIDUMP with the MS2 the step asked for.
Integrals integrals_of(const std::filesystem::path& fcidump, std::optional<int> ms2) {
  Integrals ints = read_fcidump(fcidump);
  if (ms2) {
    if ((ints.nelec + *ms2) % 2 != 0 || (ints.nelec + *ms2) / 2 > ints.norb || (ints.nelec - *ms2) / 2 > ints.norb ||
        std::abs(*ms2) > ints.nelec)
      throw InputError(fmt::format("parameter 'ms2' is {}, which NELEC={} in NORB={} orbitals cannot have; expected "
                                   "NELEC + MS2 even and at most NORB electrons of each spin", *ms2, ints.nelec, ints.norb));
    ints.ms2 = *ms2;
  }
  return ints;
}
}  // namespace

Problem::Problem(const std::filesystem::path& fcidump, const StateRequest& state)
    : ints(integrals_of(fcidump, state.ms2)), tables(build_excitation_tables(ints)), symmetry(ints.orbsym) {
  host = host_view(ints, tables);
  na = ints.nalpha();
  nb = ints.nbeta();
  max_per_source = max_candidates_per_source(tables, na, nb);
  // Selection needs determinants that couple to others (NELEC=0 ended in an internal error).
  if (max_per_source == 0)
    throw InputError(fmt::format("FCIDUMP '{}': NELEC={}, MS2={} in NORB={} orbitals couple no determinant to another "
                                 "(no electron, or no integral that moves one); expected at least one electron that an "
                                 "integral can excite", fcidump.filename().string(), ints.nelec, ints.ms2, ints.norb));
  target = find_target(host, ints, state.irrep, state.occupation);
}

void log_target(const Problem& p, std::string_view stage) {
  const TargetState& t = p.target;
  if (!t.symmetry_known)
    spdlog::warn("{}: ORBSYM's labels are not Molpro's irreps 1-8: the space is not kept to one irrep", stage);
  spdlog::info("{}: looking for the lowest state of irrep {} ({}), MS2 {}, from {} (diagonal {:.10f})", stage, t.irrep,
               t.irrep_from, t.ms2, describe(t.reference, p.ints.norb), t.reference_diagonal);
  if (t.lower_elsewhere)
    spdlog::warn("{}: a lower determinant is of irrep {} ({}, diagonal {:.10f}, {:.1f} mHa below the reference): the "
                 "lowest state may be of another irrep than {}; set 'irrep' (or 'occupation') to look there",
                 stage, t.lower_elsewhere_irrep, describe(*t.lower_elsewhere, p.ints.norb), t.lower_elsewhere_diagonal,
                 1e3 * (t.reference_diagonal - t.lower_elsewhere_diagonal), t.irrep);
}

}  // namespace qstage::sci
