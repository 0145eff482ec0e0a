#pragma once
// Stages on sets of integer keys (determinants, bitstrings): de-duplication and what builds on it.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& keys_dedup();  // unique keys, their counts, value sums and the reverse index, out of core

}  // namespace qstage::stages
