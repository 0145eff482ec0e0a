#pragma once
// Stages on sets of integer keys (determinants, bitstrings): de-duplication and what builds on it.
#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& keys_dedup();  // unique keys, their counts, value sums and the reverse index, out of core

// The family as the registry sees it (stages/common/family.hpp).
inline Family keys_family() { return {{&keys_dedup()}, {}}; }

}  // namespace qstage::stages
