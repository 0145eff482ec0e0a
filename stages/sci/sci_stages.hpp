#pragma once
// Selected configuration interaction: molecular integrals in, and (later) the variational and
// perturbative steps of heat-bath CI.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& sci_integrals();

}  // namespace qstage::stages
