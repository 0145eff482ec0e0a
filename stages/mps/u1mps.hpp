#pragma once
// A U(1)-symmetric matrix product state, block-sparse by charge (docs/mps.md).
//
// Bond k (k = 0..L) sits left of site k; its charge c counts the particles to the right of it, so
// bond 0 carries the total charge N and bond L carries 0. Bond 0 may carry several totals N, one
// index each (a mixed boundary, e.g. squeezed light): the state is sum_N lambda[0](N) |psi_N>
// with lambda[0](N) = sqrt(P(N)), and every bond's lambda are the Schmidt values of the state
// with N recorded on a leg left of site 0 (docs/mps.md). Each bond keeps its charges sorted
// ascending (equal charges contiguous: a sector) with one Schmidt value per index. Site j
// (between bonds j and j+1) keeps only its nonzero blocks (c_L, c_R), 0 <= c_L - c_R <= d-1,
// each a dense row-major matrix over the two sectors. Tensors are in B form (right-canonical,
// TeNPy's 'B' = Gamma lambda): sum over c_R and the right index of B B^dagger is the identity
// in every left sector.
#include <complex>
#include <cstdint>
#include <string>
#include <vector>

#include "io/h5.hpp"
#include "kernels/mps/u1_math.hpp"
#include "stages/mps/truncation.hpp"

namespace qstage::stages::mps {

using cplx = std::complex<double>;

struct Sector {
  int charge = 0;
  std::int64_t offset = 0;  // first index of the sector in the bond
  std::int64_t size = 0;
};

struct Bond {
  std::vector<int> charges;    // ascending
  std::vector<double> lambda;  // Schmidt values, one per index
  std::int64_t size() const { return static_cast<std::int64_t>(charges.size()); }
  std::vector<Sector> sectors() const;
  // The sector of `charge`, or one of size 0 if the bond has none.
  Sector sector(int charge) const;
};

struct Block {
  int c_left = 0, c_right = 0;
  std::int64_t rows = 0, cols = 0;
  std::vector<cplx> values;  // rows x cols, row-major
};

struct Site {
  std::vector<Block> blocks;  // sorted by (c_left, c_right)
  const Block* find(int c_left, int c_right) const;
  Block* find(int c_left, int c_right);
};

struct U1Mps {
  int L = 0, d = 2;
  int total_charge = 0;  // the largest charge of bond 0 (the only one unless the boundary is mixed); n_pair: the largest component
  // n: a state vector. n_pair: a density matrix rho vectorised (local index n_ket d + n_bra, charge
  // keys kernels::pair_key(N_ket, N_bra)); this MPS holds rho / weight normalised to Frobenius
  // norm 1, so rho = weight * (this), with Tr rho = 1 at mps.init (docs/mps.md).
  kernels::ChargeKind kind = kernels::ChargeKind::n;
  double weight = 1;
  kernels::ChargeRule rule() const { return {kind, d}; }
  bool pair() const { return kind == kernels::ChargeKind::n_pair; }
  std::vector<Bond> bonds;  // L + 1
  std::vector<Site> sites;  // L

  // Checks the structural invariants (sorted charges, block shapes matching their sectors,
  // allowed charge differences, sorted blocks); throws std::runtime_error naming the first broken one.
  void check_structure() const;
};

// A product state with the given occupations: bond dimension 1, lambda = 1.
U1Mps product_state(int d, const std::vector<int>& occupations);

// A product state of superpositions: site j is sum_n amplitudes[j][n] |n> (d entries each). Bond
// k carries every total the sites k..L-1 can reach, one index each, so bond 0 is a mixed boundary
// when a site has several occupations. Canonicalised: the result has norm 1.
// n_pair (`kind`): amplitudes[j] has d^2 entries, the vectorised rho_j[n_ket, n_bra] at n_ket d + n_bra.
U1Mps product_superposition(int d, const std::vector<std::vector<cplx>>& amplitudes,
                            kernels::ChargeKind kind = kernels::ChargeKind::n);

// A seeded random state of `total_charge` particles with up to `chi` indices per bond, brought to
// right-canonical form with exact Schmidt values (docs/mps.md says how it is drawn).
U1Mps random_state(int L, int d, int total_charge, int chi, std::uint64_t seed);

// Right-canonicalises `psi` (norm 1) and sets every bond's lambda to its Schmidt values, by a
// right-to-left sweep of per-sector SVDs then a left-to-right one; indices whose Schmidt value is
// zero (below 1e-14 of the largest) are dropped. With `off_form`, the sites right of it are known
// to be right-isometric (B form, as after an update of sites off_form and off_form + 1 by a gate
// that is not unitary): the first sweep starts there. The sweeps' per-sector SVDs run on the
// OpenMP threads, each on one thread (the bits do not depend on their count).
void canonicalize(U1Mps& psi, int off_form = -1);

// Truncates psi to `trunc` (TeNPy's parameters, the global cut over each bond's charges) by the
// SVD compression sweep: right-canonicalise, then cut each bond from left to right on its exact
// Schmidt values, then canonicalise again. Returns the summed discarded weight (each cut's,
// relative to the state it cut). A density matrix (n_pair) keeps rho = weight * (this): the
// weight loses what the cuts took, as after a truncated update.
double compress(U1Mps& psi, const TruncParams& trunc);

// --- measurements (B form: they assume right-canonical tensors and Schmidt lambdas)

std::vector<double> densities(const U1Mps& psi);                 // <n_j>, j = 0..L-1
double entropy_vn(const Bond& bond);                             // -sum l^2 ln l^2
double entropy_renyi2(const Bond& bond);                         // -ln sum l^4
std::vector<double> charge_distribution(const U1Mps& psi, int bond);  // P(N_left = n), n = 0..N (total_charge)
std::vector<double> total_charge_distribution(const U1Mps& psi);     // P(N), n = 0..total_charge: bond 0's lambda^2
// <psi|psi>, contracted from the left without assuming any canonical form.
double norm_squared(const U1Mps& psi);
// The largest |sum B B^dagger - 1| entry over all sites and left sectors.
double right_canonical_error(const U1Mps& psi);

// --- the HDF5 layout (docs/mps.md): flat datasets under `group`, the attributes L, d,
// total_charge, charge_kind ("n"), form ("B") and dtype on the file's root, and boundary
// ("mixed") when bond 0 carries several totals.

void write_mps(h5::File& out, const U1Mps& psi, const std::string& group = "");
// Reads an MPS written by write_mps; throws InputError naming the file and what is missing or broken.
U1Mps read_mps(const h5::File& in, const std::string& group = "");

}  // namespace qstage::stages::mps
