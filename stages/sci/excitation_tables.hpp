#pragma once
// What coupled-configuration generation reads besides h1 and the ERIs (seed 004 §4.2, heat-bath
// CI): per source orbital or orbital pair, the excitations it can make with their integrals, in
// lists padded to one width so a GPU thread finds entry k of list l at l * width + k.
//
// - singles: per orbital p, the targets r != p with an upper bound of |<D'|H|D>| over every
//   determinant (|h_pr| + sum_k max(|J|, |J - K|, |2J - K|), J = (pr|kk), K = (pk|kr): orbital k
//   holding an electron of the other spin, of the same spin, or both), sorted by the bound
//   descending: a source with coefficient c skips the rest of p's list once bound * |c| <= eps.
// - opposite-spin doubles: per pair (p alpha, q beta), index p * norb + q, the targets (r alpha,
//   s beta), r != p and s != q, with value (pr|qs);
// - same-spin doubles: per pair p < q, index q(q-1)/2 + p, the targets r < s outside {p, q}
//   with value (pr|qs) - (ps|qr).
// Doubles are exact Hamiltonian elements up to the phase, so lists sorted by |value| descending
// let generation stop at the first |value| * |c| <= eps (heat-bath screening). Zero values are
// left out; ties keep (r, s) ascending, so the tables are the same on every machine.
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/sci/sci_math.hpp"
#include "stages/sci/fcidump.hpp"

namespace qstage::sci {

struct ExcitationTables {
  int norb = 0;
  std::vector<double> coulomb, exchange;  // J_pq = (pp|qq), K_pq = (pq|qp): norb x norb

  std::uint32_t single_width = 0;
  std::vector<std::uint32_t> single_length;  // norb
  std::vector<std::uint8_t> single_target;   // norb x single_width (padding 0)
  std::vector<double> single_bound;          // norb x single_width (padding 0)

  std::uint32_t opposite_width = 0;
  std::vector<std::uint32_t> opposite_length;  // norb x norb
  std::vector<std::uint16_t> opposite_target;  // pairs x width: r | s << 8
  std::vector<double> opposite_value;

  std::uint32_t same_width = 0;
  std::vector<std::uint32_t> same_length;  // norb (norb - 1) / 2
  std::vector<std::uint16_t> same_target;  // pairs x width: r | s << 8, r < s
  std::vector<double> same_value;

  std::uint64_t bytes() const;
};

ExcitationTables build_excitation_tables(const Integrals& ints);

// The most candidates one source determinant with `nalpha` and `nbeta` electrons can yield
// (every list entry of its occupied orbitals and pairs): what a generation buffer is sized for.
std::uint64_t max_candidates_per_source(const ExcitationTables& t, int nalpha, int nbeta);

// A view of host-resident integrals and tables (the CPU twin reads it directly; the GPU copies
// the same arrays to the device).
kernels::sci::HamiltonianView host_view(const Integrals& ints, const ExcitationTables& t);

// The integrals and tables copied where a backend's kernels read them (device memory on cuda,
// charged to the device budget), for the life of a pass's kernel.
class ResidentHamiltonian {
 public:
  ResidentHamiltonian(Backend& backend, Stream& stream, const Integrals& ints, const ExcitationTables& t);
  const kernels::sci::HamiltonianView& view() const { return view_; }
  // What it takes: declare it as a pass's resident device bytes.
  static std::uint64_t bytes(const Integrals& ints, const ExcitationTables& t);

 private:
  std::vector<Buffer> buffers_;
  kernels::sci::HamiltonianView view_;
};

}  // namespace qstage::sci
