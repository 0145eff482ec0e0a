#pragma once
// Global truncation of Schmidt values over charge blocks, with TeNPy's parameters: used by the
// two-site update (tebd.hpp) and by the compression of a whole MPS (u1mps.hpp, compress).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qstage::stages::mps {

// TeNPy's trunc_params (tenpy.linalg.truncation.truncate), the same names and meaning: keep at
// most chi_max values and at least chi_min, never cut between two values whose logs differ by
// less than degeneracy_tol (0: none), drop values below svd_min (S < svd_min), and drop the
// smallest values while their summed squares stay <= trunc_cut^2; all on the Schmidt values
// normalised to 1. A constraint that would keep nothing is not applied (TeNPy's order: chi_max,
// chi_min, degeneracy_tol, svd_min, trunc_cut).
struct TruncParams {
  std::int64_t chi_max = 100;
  double svd_min = 1e-14;
  double trunc_cut = 1e-14;
  std::int64_t chi_min = 0;
  double degeneracy_tol = 0;
};

// A density matrix's (n_pair) default degeneracy_tol: its pairs (N_ket, N_bra) and (N_bra, N_ket)
// have Schmidt values equal to rounding, and a cut between them would leave rho non-Hermitian.
inline constexpr double kDensityMatrixDegeneracyTol = 1e-8;

// The parameter `name` (an object of chi_max, svd_min, trunc_cut, chi_min, degeneracy_tol; absent
// ones take the defaults above, degeneracy_tol kDensityMatrixDegeneracyTol for a density
// matrix), checked: throws InputError naming what is wrong.
TruncParams trunc_params_from_json(const nlohmann::json& t, const std::string& name, bool density_matrix);

struct Truncation {
  std::vector<std::int64_t> kept;  // per block, a prefix of its (descending) values
  double discarded = 0;            // eps: the summed squares of the dropped normalised values
};

// Global truncation over blocks: `values[b]` are block b's singular values, descending. Values
// are ranked by (value descending, block ascending, index ascending), so ties are cut the same
// way every time.
Truncation truncate(const std::vector<std::vector<double>>& values, const TruncParams& p);

}  // namespace qstage::stages::mps
