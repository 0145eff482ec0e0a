#pragma once
// General-purpose tensor stages: they prove the engine and users need them anyway.
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& tensor_random();  // a large chunked random tensor from a seed
const Stage& tensor_matmul();  // out-of-core C = A · B, A streamed, B resident
const Stage& tensor_compare(); // a dataset against a reference: relative error, fails past rtol/atol
const Stage& tensor_stats();   // norm, min, max, non-finite count, checksum

}  // namespace qstage::stages
