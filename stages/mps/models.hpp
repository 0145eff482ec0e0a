#pragma once
// The models mps.tebd evolves under (docs/mps.md): Hamiltonians as two-site bond terms (XXZ,
// Bose-Hubbard) made into Trotter circuits, and linear-optical interferometers (beam splitters
// on neighbouring modes) as circuits of their own. Each becomes an Evolution: per step, the list
// of two-site updates the time loop applies.
#include <cstdint>
#include <string>
#include <vector>

#include "stages/mps/gates.hpp"
#include "stages/mps/tebd.hpp"
#include "stages/mps/u1mps.hpp"

namespace qstage::stages::mps {

// --- Hamiltonians (bond terms, d^2 x d^2, basis |n_left n_right> at index n_left d + n_right)

// The XXZ bond Hamiltonian of spin-1/2 sites (up = particle, n = S^z + 1/2), 4 x 4:
//   J [ (S+S- + S-S+)/2 + delta Sz Sz ] - h_left Sz_left - h_right Sz_right.
std::vector<cplx> xxz_bond_hamiltonian(double J, double delta, double h_left, double h_right);

// The Bose-Hubbard bond Hamiltonian with occupations 0..d-1:
//   -J (b+_l b_r + b_l b+_r) + sum_{s = l, r} w_s [U/2 n_s (n_s - 1) - mu n_s].
std::vector<cplx> bose_hubbard_bond_hamiltonian(int d, double J, double U, double mu, double w_left, double w_right);

// --- linear optics

// A beam splitter on modes (mode, mode + 1) = (a, b) after phase shifters on its inputs:
//   G = exp(-i theta (e^{i phi} a+ b + e^{-i phi} a b+)) exp(i phase_left n_a) exp(i phase_right n_b).
// Its mode matrix (a+_j -> sum_i u_ij a+_i) is
//   u = [[cos theta, -i e^{i phi} sin theta], [-i e^{-i phi} sin theta, cos theta]] diag(e^{i phase_left}, e^{i phase_right}).
struct BeamSplitter {
  int mode = 0;
  double theta = 0, phi = 0, phase_left = 0, phase_right = 0;
};

// The M x M mode matrix (row-major) of a sequence of beam splitters applied in order: U = u_K ... u_1.
std::vector<cplx> interferometer_unitary(const std::vector<BeamSplitter>& bs, int M);

// A Haar-random M x M unitary from `seed` (Gram-Schmidt of a complex Gaussian matrix drawn from
// kernels/tensor/random.hpp's stream, which is Mezzadri's QR with a positive diagonal of R).
std::vector<cplx> haar_unitary(int M, std::uint64_t seed);

// Nearest-neighbour beam splitters (Reck-style Givens nulling, docs/mps.md) whose
// interferometer_unitary is U; the leftover diagonal phases are folded into the input phase
// shifters of the first beam splitter on each mode. M >= 2.
std::vector<BeamSplitter> decompose_unitary(const std::vector<cplx>& U, int M);

// The beam splitter's gate in the Fock space cut at d: for every pair total n = n_a + n_b the
// exact (n+1)-dimensional block, restricted to occupations <= d-1. Blocks with n <= d-1 are
// exactly unitary; blocks with n >= d lose the amplitude that would leave the cut.
std::vector<cplx> beam_splitter_gate(const BeamSplitter& bs, int d);

// Single-mode squeezed vacuum S(r e^{i phase})|0> in the Fock basis cut at d (d amplitudes):
//   (cosh r)^{-1/2} sum_n (-e^{i phase} tanh r)^n sqrt((2n)!) / (2^n n!) |2n>,
// the exact amplitudes below the cut (their squares sum to 1 minus the weight above it).
std::vector<cplx> squeezed_vacuum(double r, double phase, int d);

// The single-mode lossy squeezed state: the pure-loss channel of transmissivity eta,
//   rho -> sum_k K_k rho K_k^dagger,  K_k = sqrt((1-eta)^k / k!) eta^{n/2} a^k,
// applied to the UNCUT squeezed vacuum S(r e^{i phase})|0> (its amplitudes summed until they are
// below 1e-30 in probability), then restricted to occupations 0..d-1: d x d row-major,
//   rho[m, m'] = eta^{(m+m')/2} sum_k (1-eta)^k sqrt(C(m+k, k) C(m'+k, k)) a_{m+k} conj(a_{m'+k}),
// whose trace is the probability inside the cut (<n> = eta sinh^2 r before the cut). 0 < eta <= 1.
std::vector<cplx> lossy_squeezed_density(double r, double phase, double eta, int d);

// --- evolutions

struct ModelParams {
  std::string model = "xxz";  // xxz | bose_hubbard | interferometer
  double J = 1, delta = 0, h = 0, U = 0, mu = 0, dt = 0;
  int steps = 0, order = 2;
  std::vector<BeamSplitter> beam_splitters;  // interferometer: explicit, or from haar_seed
  bool haar = false;
  std::uint64_t haar_seed = 0;
  bool density_matrix = false;  // the input is n_pair (only an interferometer evolves it)
};

struct Update {
  int bond = 0;            // sites (bond, bond + 1)
  std::size_t gate = 0;    // index into Evolution::tables
  std::int64_t loss = -1;  // index of the table of 1 - G^dagger G (the Fock cut's loss), or -1: exactly unitary
};

struct Evolution {
  int steps = 0;
  std::vector<double> times;  // the time after step s, s = 0..steps
  std::vector<GateTable> tables;
  // Trotter models: one list for every step; interferometers: one list per step.
  std::vector<std::vector<Update>> step_updates;
  std::vector<GateTable> terms;  // the Hamiltonian's bond terms (energy); empty for an interferometer
  std::vector<cplx> unitary;     // interferometer: its M x M mode matrix
  std::vector<BeamSplitter> circuit;  // interferometer: the beam splitters, step s applies circuit[s - 1]
  const std::vector<Update>& updates(int step) const { return step_updates.size() == 1 ? step_updates[0] : step_updates.at(step - 1); }
};

// The evolution of `p` on a chain of L sites of dimension d. Throws InputError if the model does
// not fit (XXZ needs d = 2; beam splitters must couple modes inside the chain).
Evolution make_evolution(const ModelParams& p, int L, int d);

// Applies step `step`: eps gains each update's discarded weight; `kept` is multiplied by the
// probability each gate keeps inside the Fock cut. A gate that loses some is followed by
// canonicalize (the update's renormalisation would otherwise leave the tensors off B form).
// Consecutive exactly unitary updates on disjoint sites (a brickwork layer) go to `updater` together.
void apply_step(U1Mps& psi, const Evolution& ev, int step, const TruncParams& trunc, double& eps, double& kept,
                LayerUpdater& updater);

}  // namespace qstage::stages::mps
