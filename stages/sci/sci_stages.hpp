#pragma once
// Selected configuration interaction: molecular integrals in (sci.integrals), and heat-bath CI
// iterated to convergence with its perturbative correction (sci.solve).
#include <vector>

#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& sci_integrals();
const Stage& sci_solve();
// sci.solve's `qstage inspect --plot` view (stages/sci/views.cpp).
std::vector<View> sci_views();

// The family as the registry sees it (stages/common/family.hpp).
inline Family sci_family() { return {{&sci_integrals(), &sci_solve()}, sci_views()}; }

}  // namespace qstage::stages
