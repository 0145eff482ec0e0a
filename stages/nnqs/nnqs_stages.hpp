#pragma once
// Neural-network quantum states inside selected CI (seed 004, cuNNQS-SCI): sci.nnqs.
#include <vector>

#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& sci_nnqs();
std::vector<View> nnqs_views();

// The family as the registry sees it (stages/common/family.hpp).
inline Family nnqs_family() { return {{&sci_nnqs()}, nnqs_views()}; }

}  // namespace qstage::stages
