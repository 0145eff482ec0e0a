#pragma once
// FCIDUMP: molecular integrals as quantum-chemistry codes write them (Knowles & Handy's format;
// PySCF, Molpro, Psi4, Dice), read into the arrays selected CI needs.
//
// A Fortran namelist header, `&FCI NORB=.., NELEC=.., MS2=.., ORBSYM=.., ISYM=.. &END` (one line
// or several; it may also end with `/` or `$END`, and may say `UHF=.FALSE.`), then one integral a
// line, `value i j k l` with 1-based spatial orbitals:
//   i j k l > 0       (ij|kl) in chemists' notation, any one of its 8 equivalent orders
//   i j > 0, k = l = 0  h_ij (either order)
//   i > 0, j = k = l = 0  an orbital energy (kept apart; not an integral)
//   0 0 0 0           the core energy (nuclear repulsion plus frozen core), first or last
// Values may use Fortran `D` exponents. An integral given again in another order keeps its first
// value (and must agree to rounding). Anything else is refused with the file's line number.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/sci/sci_math.hpp"

namespace qstage::sci {

// The most spatial orbitals qstage takes: one 64-bit occupation string per spin.
constexpr int kMaxOrbitals = 64;
// An integral given twice (two of its orders) may differ by rounding, not more: |a - b| <= this
// times max(1, |a|).
constexpr double kRepeatTolerance = 1e-10;

struct Integrals {
  int norb = 0, nelec = 0, ms2 = 0, isym = 1;
  std::vector<int> orbsym;        // NORB irrep labels (all 1 when the file gives none)
  double core = 0;                // the core energy (0 when the file has no core line)
  std::vector<double> h1;         // NORB x NORB, symmetric, row-major
  // (ij|kl) packed with 8-fold symmetry: pair(i, j) = i(i+1)/2 + j for i >= j (0-based), and
  // eri[pair(pair(i,j), pair(k,l))] likewise: PySCF's `ao2mo` "s8" layout.
  std::vector<double> eri;
  std::vector<double> orbital_energies;  // NORB values; NaN where the file gives none
  std::uint64_t integral_lines = 0;      // lines read after the header
  std::uint64_t repeated_lines = 0;      // of them, integrals given before in another order (first kept)

  int nalpha() const { return (nelec + ms2) / 2; }
  int nbeta() const { return (nelec - ms2) / 2; }
  double eri_at(int i, int j, int k, int l) const;  // 0-based, any order
  double h1_at(int i, int j) const { return h1[static_cast<std::size_t>(i) * static_cast<std::size_t>(norb) + static_cast<std::size_t>(j)]; }
};

// 0-based pair index of i, j (either order) in 8-fold packing.
inline std::uint64_t pair_index(std::uint64_t i, std::uint64_t j) { return kernels::sci::eri_pair(i, j); }
// Entries of the packed ERI array for `norb` orbitals.
std::uint64_t packed_eri_size(int norb);

// Parses `text` (the file's content; `name` for messages). Throws InputError "NAME:LINE: what is
// wrong; expected ..." for a malformed header or line, a truncated file, a value that is not
// finite, an index beyond NORB, UHF=.TRUE., NORB above kMaxOrbitals, or NELEC inconsistent with
// MS2 (parity, or more electrons of a spin than orbitals).
Integrals parse_fcidump(const std::string& text, const std::string& name);
Integrals read_fcidump(const std::filesystem::path& path);

}  // namespace qstage::sci
