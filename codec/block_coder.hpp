#pragma once
// One block (at most 256 values) of a component, coded by the rules of the codec (codec.hpp):
// the CPU twin of the CUDA block kernels (kernels/codec/codec_encode.cu, codec_decode.cu), built on the same block_math.hpp.
#include <cstdint>

#include "codec/block_math.hpp"

namespace qstage::codec::detail {

struct BlockRules {
  double t = -1;          // threshold (absolute); negative: the pipeline does not threshold
  double e = 0;           // error bound (absolute)
  int q = 0;              // 2^q <= e < 2^(q+1): truncation may lose less than 2^q
  bool lossless = false;  // e == 0: every bit is kept
  bool sparse = false;    // the sparse state is allowed (integrated)
  bool quantize = false;  // the quantized state is allowed (quantized; needs e > 0)
  double step = 0;        // 2e: the quantized state's step
  // The largest floats at or below t and max(t, e), for the GPU's float-only tests
  // (kernels/codec/choose.cuh): for every float x, |x| <= t exactly when |x| <= t_below.
  float t_below = -1, te_below = 0;
};
BlockRules block_rules(double threshold, double error, bool thresholds, bool sparse, bool quantize = false);

// Codes x[0, m) into out (room for kMaxBlockPayload bytes); returns the state and sets bytes.
// The choice is deterministic: non-finite values make the block raw; else zero, else constant
// if every value stays within its bound; else the smallest of sparse, quantized, dense around 0,
// dense around the midpoint and raw whose decoded values all stay within their bounds.
BlockState encode_block(const float* x, int m, const BlockRules& rules, std::uint8_t* out, int& bytes);

// Decodes one block of m values (`step`: 2e, for quantized blocks); throws FormatError when the
// payload is not exactly `bytes` long or is inconsistent.
void decode_block(std::uint8_t state, const std::uint8_t* in, int bytes, int m, double step, float* out);

}  // namespace qstage::codec::detail
