#pragma once
// Exact tensor-network contraction: build a network, find a path, plan it, contract it; and the
// state-vector simulator that checks circuits.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& tn_build();
const Stage& tn_path();
const Stage& tn_plan();
const Stage& tn_contract();
const Stage& tn_statevector();

}  // namespace qstage::stages
