#pragma once
// Selected configuration interaction: molecular integrals in (sci.integrals), and heat-bath CI
// iterated to convergence with its perturbative correction (sci.solve).
#include <vector>

#include "stages/stage.hpp"
#include "stages/views.hpp"

namespace qstage::stages {

const Stage& sci_integrals();
const Stage& sci_solve();
// sci.solve's `qstage inspect --plot` view (stages/sci/views.cpp).
std::vector<View> sci_views();

}  // namespace qstage::stages
