#pragma once
// What ranks the candidates for the next space: the amplitude a model gives a determinant outside
// the space, from what the score pass has for it. Selection keeps the candidates of largest
// |amplitude| (a two-level top-K), and the amplitude is also the start of their coefficient in
// the next Davidson. The PT2 energy does not go through here: it is Epstein-Nesbet's whatever
// the model.
//
// `first_order` is heat-bath CI's perturbative estimate, c_a = <a|H|psi> / (E - H_aa). Seed 004's
// neural-network quantum state is the model meant to plug in next. It would evaluate a network at
// the determinant's occupation bits, in batches on the device, and this interface is where it goes.
#include <memory>
#include <string>
#include <vector>

#include "kernels/sci/sci_math.hpp"

namespace qstage::sci {

// One candidate, as the score pass sees it.
struct CandidateTerms {
  kernels::sci::Det det;
  double coupling = 0;     // <a|H|psi>: the candidate's summed H_ai c_i over the space
  double denominator = 0;  // E_var - H_aa, kept away from zero
};

class AmplitudeModel {
 public:
  virtual ~AmplitudeModel() = default;
  virtual std::string name() const = 0;
  // Called from several threads at once on distinct candidates: const and thread-safe. The same
  // candidate must give the same bits on every call (results are bitwise reproducible).
  virtual double amplitude(const CandidateTerms& c) const = 0;
};

// The models qstage has, by the name the `amplitude_model` parameter takes.
const std::vector<std::string>& amplitude_model_names();
// Throws InputError naming the known models for any other name.
std::unique_ptr<AmplitudeModel> make_amplitude_model(const std::string& name);

}  // namespace qstage::sci
