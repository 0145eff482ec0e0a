#pragma once
// U(1)-symmetric matrix product states (docs/mps.md): initial states (mps.init) and their
// charge-blocked TEBD time evolution (mps.tebd), computed on the host.
#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& mps_init();
const Stage& mps_tebd();
// `qstage inspect --plot` of mps.tebd outputs (stages/mps/views.cpp).
std::vector<View> mps_views();

// The family as the registry sees it (stages/common/family.hpp).
inline Family mps_family() { return {{&mps_init(), &mps_tebd()}, mps_views()}; }

}  // namespace qstage::stages
