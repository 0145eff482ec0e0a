#pragma once
#include <vector>

#include "stages/stage.hpp"
#include "stages/views.hpp"

namespace qstage::stages {
// Heat-bath selected CI (stages/sci/solve_stage.cpp).
const Stage& sci_solve();
// Its `qstage inspect --plot` view (stages/sci/views.cpp).
std::vector<View> sci_views();
}  // namespace qstage::stages
