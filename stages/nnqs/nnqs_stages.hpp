#pragma once
// Neural-network quantum states inside selected CI (seed 004, cuNNQS-SCI): sci.nnqs.
#include <vector>

#include "stages/stage.hpp"
#include "stages/views.hpp"

namespace qstage::stages {

const Stage& sci_nnqs();
std::vector<View> nnqs_views();

}  // namespace qstage::stages
