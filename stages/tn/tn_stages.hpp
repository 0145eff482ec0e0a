#pragma once
// Exact tensor-network contraction: build a network, find a path, plan it, contract it; and the
// state-vector simulator that checks circuits.
#include <vector>

#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& tn_build();
const Stage& tn_path();
const Stage& tn_plan();
const Stage& tn_contract();
const Stage& tn_statevector();
// `qstage inspect --plot` of tn.plan outputs (stages/tn/views.cpp).
std::vector<View> tn_views();

// The family as the registry sees it (stages/common/family.hpp).
inline Family tn_family() { return {{&tn_build(), &tn_path(), &tn_plan(), &tn_contract(), &tn_statevector()}, tn_views()}; }

}  // namespace qstage::stages
