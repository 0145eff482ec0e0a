#pragma once
// A selected-CI problem as a step asks for it: the FCIDUMP's integrals with the MS2 asked for, the
// excitation tables, and the state to look for (sci/target_state.hpp) with the determinant a space
// grows from. sci.solve and sci.nnqs build it the same way from the same parameters.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"
#include "stages/sci/target_state.hpp"

namespace qstage::sci {

// The step's `irrep`, `ms2` and `occupation` parameters (each optional).
struct StateRequest {
  std::optional<int> irrep, ms2;
  std::optional<std::vector<int>> occupation;
  static StateRequest from_json(const nlohmann::json& params);
};

struct Problem {
  Integrals ints;
  ExcitationTables tables;
  kernels::sci::HamiltonianView host;
  int na = 0, nb = 0;
  std::uint64_t max_per_source = 0;  // the most candidates one determinant generates
  OrbitalSymmetry symmetry;
  TargetState target;  // the state looked for, and the determinant the space grows from
  // Throws InputError for an MS2 the electrons cannot have, a file whose integrals couple no
  // determinant to another, and what find_target refuses.
  Problem(const std::filesystem::path& fcidump, const StateRequest& state);
};

// What the log says of the state `stage` looks for (rank 0), and of a lower determinant elsewhere.
void log_target(const Problem& p, std::string_view stage);

}  // namespace qstage::sci
