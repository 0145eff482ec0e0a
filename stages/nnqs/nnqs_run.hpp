#pragma once
// sci.nnqs's run (seed 004, sections 2.2 and 3: iterate, expand, infer, select, optimize).
//
// Iteration k holds a sorted space S_k of determinants (k = 0: the target state's reference,
// sci/target_state.hpp) and the network psi (model/wavefunction.hpp):
//   expand     every determinant coupled to S_k (|H_ai| > eps_couple, kernels::sci_generate),
//   dedup      de-duplicated (kernels::cpu::RadixUnique, keys.dedup's bytes), those in S_k and of
//              other irreps dropped: the coupled set C_k, with H between it and S_k,
//   optimize   `fit_steps` AdamW steps fitting psi to H's lowest eigenvector c within S_k and to
//              its first-order amplitudes (H c)_a / (E_c - H_aa) on C_k, then `steps` on
//              E = <psi|H_S+C|psi> / <psi|psi>: H within S_k (sci::ResidentSpace, the products
//              sci.solve's Davidson uses) and between S_k and C_k, C_k's diagonal alone, so that
//              the local energies of S_k reach the coupled amplitudes (seed 004) and E stays
//              bounded below. Each step takes S_k and a stride of C_k of about |S_k| rows. The
//              gradient goes through the surrogate 2 Re sum_x conj(psi(x)) g(x), g = (H psi -
//              E psi) / <psi|psi> held fixed, which has E's gradient. The energy reported is psi's
//              within S_k alone: variational, never below the FCI energy but by rounding.
//   infer      |psi| of each determinant of C_k, in batches of inference_batch, no gradient,
//   select     the max_new_dets largest (ties: the lower determinant) join S_k to make S_{k+1}.
// It stops after max_iterations, at max_dets, when no candidate is left, or when an iteration
// moved E by less than energy_tolerance. Every iteration ends in a commit: the network's
// parameters, AdamW's state, the space and the history, so a resumed run goes on with the bits of
// an uninterrupted one. Rank 0 does the work; the others get its result before the output.
#include <memory>

#include "stages/nnqs/nnqs_params.hpp"
#include "stages/common/stage.hpp"

namespace qstage::nnqs {

std::unique_ptr<stages::StepRun> start_run(const stages::StepContext& ctx, const NnqsParams& params);

}  // namespace qstage::nnqs
