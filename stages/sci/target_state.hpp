#pragma once
// Which state sci.solve looks for, and the determinant it grows its space from
// (docs/selected-ci.md, "Which state").
//
// The target is an irrep and a spin projection: the FCIDUMP's ISYM and MS2 unless the step's
// `irrep`, `ms2` or `occupation` parameters say otherwise. Irreps are the FCIDUMP's labels
// (Molpro's, 1..8, for D2h and its subgroups), whose products are the XORs of label - 1: a
// determinant's irrep is the product of its electrons' orbitals' labels. ORBSYM labels outside
// 1..8 (a file that does not use Molpro's convention) leave the symmetry unknown: every
// determinant then counts as the target's irrep, and the log says so.
//
// The reference determinant is the lowest diagonal energy found by a descent from aufbau over
// moves of one electron or of a pair of both spins (a Hartree-Fock-like start that does not trust
// the orbital order); when that determinant is of another irrep, the lowest single move into the
// target's irrep, then a descent over the moves that keep the irrep. Or it is given explicitly
// (`occupation`, spin orbitals as Dice numbers them: 2p for orbital p's alpha, 2p + 1 for its beta).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/sci/sci_math.hpp"
#include "stages/sci/fcidump.hpp"

namespace qstage::sci {

using kernels::sci::Det;

// The orbitals' irreps as masks, for a determinant's irrep in a few popcounts.
class OrbitalSymmetry {
 public:
  explicit OrbitalSymmetry(const std::vector<int>& orbsym);
  bool known() const { return masks_.known; }
  // Label (1..8) of a determinant.
  int irrep(const Det& d) const { return masks_.known ? kernels::sci::irrep_of(masks_, d) + 1 : 1; }
  // The labels a determinant can have: the products of the orbitals' labels.
  std::vector<int> reachable() const;
  // For the kernels, with the target's label (1..8).
  kernels::sci::IrrepMasks masks(int target) const {
    kernels::sci::IrrepMasks m = masks_;
    m.target = target - 1;
    return m;
  }

 private:
  kernels::sci::IrrepMasks masks_;  // mask[g]: the orbitals of label g + 1
};

struct TargetState {
  int irrep = 1, ms2 = 0;
  std::string irrep_from;  // "ISYM", "parameter irrep", "occupation"
  Det reference{};
  double reference_diagonal = 0;
  // The descent's lowest determinant when it is of another irrep and lower than the reference.
  std::optional<Det> lower_elsewhere;
  double lower_elsewhere_diagonal = 0;
  int lower_elsewhere_irrep = 0;
  bool symmetry_known = true;
};

// The target from the integrals (their MS2 already the one the step asked for) and the step's
// `irrep` and `occupation` parameters. Throws InputError for an occupation with the wrong
// electrons, an irrep no determinant has, or an occupation of another irrep than `irrep`.
TargetState find_target(const kernels::sci::HamiltonianView& h, const Integrals& ints, std::optional<int> irrep,
                        const std::optional<std::vector<int>>& occupation);

// <S^2> of sum_i c_i |D_i> (normalised here), from S^2 = S_- S_+ + S_z (S_z + 1).
double spin_squared(const std::vector<Det>& dets, const std::vector<double>& c);

// "alpha 0-3, 5; beta 0-3, 6": a determinant's occupied orbitals (0-based), for logs.
std::string describe(const Det& d, int norb);

}  // namespace qstage::sci
