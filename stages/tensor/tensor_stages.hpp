#pragma once
// General-purpose tensor stages: they prove the engine and users need them anyway.
#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& tensor_random();  // a large chunked random tensor from a seed
const Stage& tensor_matmul();  // out-of-core C = A · B, A streamed, B resident
const Stage& tensor_compare(); // a dataset against a reference: relative error, fails past rtol/atol
const Stage& tensor_stats();   // norm, min, max, non-finite count, checksum

// The family as the registry sees it (stages/common/family.hpp).
inline Family tensor_family() { return {{&tensor_random(), &tensor_matmul(), &tensor_compare(), &tensor_stats()}, {}}; }

}  // namespace qstage::stages
