#pragma once
// Neural-network quantum states inside selected CI (seed 004, cuNNQS-SCI): sci.nnqs.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& sci_nnqs();

}  // namespace qstage::stages
