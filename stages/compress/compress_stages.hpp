#pragma once
// The compression stages (seed 003; the codec is codec/, its GPU twin kernels/codec/codec_gpu.cu).
#include "stages/common/family.hpp"

namespace qstage::stages {

const Stage& compress();           // a dataset into a chunked dataset of compressed chunks (filter 32881)
const Stage& decompress();         // a compressed dataset back to plain values, decoded on the device
const Stage& compress_evaluate();  // ratio, error, fidelity and throughput of codec settings on a dataset

// The family as the registry sees it (stages/common/family.hpp).
inline Family compress_family() { return {{&compress(), &decompress(), &compress_evaluate()}, {}}; }

}  // namespace qstage::stages
