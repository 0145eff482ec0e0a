#include "stages/sci/amplitude_model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace qstage::sci {
namespace {

class FirstOrderAmplitude final : public AmplitudeModel {
 public:
  std::string name() const override { return "first_order"; }
  double amplitude(const CandidateTerms& c) const override { return c.coupling / c.denominator; }
};

}  // namespace

const std::vector<std::string>& amplitude_model_names() {
  static const std::vector<std::string> names{"first_order"};
  return names;
}

std::unique_ptr<AmplitudeModel> make_amplitude_model(const std::string& name) {
  if (name == "first_order") return std::make_unique<FirstOrderAmplitude>();
  throw InputError(fmt::format("parameter 'amplitude_model' is '{}'; expected one of: {}", name,
                               fmt::join(amplitude_model_names(), ", ")));
}

}  // namespace qstage::sci
