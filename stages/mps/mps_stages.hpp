#pragma once
// U(1)-symmetric matrix product states (docs/mps.md): initial states (mps.init) and their
// charge-blocked TEBD time evolution (mps.tebd), computed on the host.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& mps_init();
const Stage& mps_tebd();

}  // namespace qstage::stages
