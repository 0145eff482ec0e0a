#pragma once
// The compression stages (seed 003; the codec is io/codec, its GPU twin kernels/codec_gpu.cu).
#include "stages/stage.hpp"

namespace qstage::stages {

const Stage& compress();           // a dataset into a chunked dataset of compressed chunks (filter 32881)
const Stage& decompress();         // a compressed dataset back to plain values, decoded on the device
const Stage& compress_evaluate();  // ratio, error, fidelity and throughput of codec settings on a dataset

}  // namespace qstage::stages
