#pragma once
// The per-value arithmetic of the block coder (codec.hpp), shared by the CPU coder and the CUDA
// kernels so both make the same decisions and the same bytes. Only IEEE operations that every
// backend rounds the same way appear here: comparisons, float and double additions and
// subtractions, exact halvings, and bit manipulation (no multiply-adds that a compiler could
// contract into an FMA).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.hpp"

namespace qstage::codec::detail {

// Block states (one byte per block in the stream).
enum BlockState : std::uint8_t {
  kZero = 0,      // every value decodes to 0; no payload
  kConstant = 1,  // every value decodes to one float32 (payload: that value)
  kSparse = 2,    // a few nonzero values: count, in-block indices and truncated values (integrated only)
  kDense = 3,     // float32 mid, then each value - mid truncated and XOR leading-byte coded
  kRaw = 4,       // the original bits (lossless fallback, and blocks with NaN or Inf)
  kQuantized = 5, // each value a multiple q of 2e, zigzag(q) in a block-wide bit width (quantized only)
};

// Largest payload of a block of 256 values: a dense block with no leading bytes in common.
constexpr int kMaxBlockValues = 256;
constexpr int kMaxBlockPayload = 4 + 1 + kMaxBlockValues / 4 + 4 * kMaxBlockValues;  // (quantized: at most 1 + 31 * 256 / 8)

QSTAGE_HD std::uint32_t float_bits(float x) {
  std::uint32_t w;
  std::memcpy(&w, &x, sizeof w);
  return w;
}
QSTAGE_HD float bits_float(std::uint32_t w) {
  float x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}
QSTAGE_HD bool is_finite(float x) { return ((float_bits(x) >> 23) & 0xffu) != 0xffu; }
QSTAGE_HD double magnitude(float x) { return x < 0 ? -static_cast<double>(x) : static_cast<double>(x); }

// Whether the threshold t replaces a component by 0: at or below t (NaN never: the comparison is
// false), except that a threshold of 0 changes no bits (it keeps -0, which is at or below 0 but
// is not +0's bits: with e = 0 too, the coding is lossless).
QSTAGE_HD bool zeroed(float x, double t) { return magnitude(x) <= t && (t > 0 || float_bits(x) == 0); }

// The value a component becomes before coding.
QSTAGE_HD float thresholded(float x, double t) { return zeroed(x, t) ? 0.0f : x; }

// Whether group and group2l keep a component (the complement of thresholding: NaN is kept).
QSTAGE_HD bool significant(float x, double t) { return !zeroed(x, t); }

// How far a decoded component may be from the original: max(t, e) where thresholding zeroes
// it, e elsewhere (the codec's guarantee).
QSTAGE_HD double allowed_error(float x, double t, double e) {
  return magnitude(x) <= t ? (t > e ? t : e) : e;
}
// A bound of 0 asks for the original's bits: -0 and +0 are equal numbers, not equal bits.
QSTAGE_HD bool within(float decoded, float original, double bound) {
  if (!(bound > 0)) return float_bits(decoded) == float_bits(original);
  const double d = static_cast<double>(decoded) - static_cast<double>(original);
  return (d < 0 ? -d : d) <= bound;
}

// The middle of [lo, hi] rounded to float32: exact halving of an exact-or-rounded double sum.
QSTAGE_HD float midpoint(float lo, float hi) {
  return static_cast<float>((static_cast<double>(lo) + static_cast<double>(hi)) * 0.5);
}

// Whether a sparse block stores a value: every value but +0 (which is what the others decode
// to), so -0 is stored as it is.
QSTAGE_HD bool stored_in_sparse(float y) { return float_bits(y) != 0; }

// Bits kept of a float32 (sign, exponent and the leading mantissa bits) so that truncating a
// value of the block loses less than 2^q: a value whose biased exponent is b (b = 0 for zeros and
// denormals, which scale like b = 1) loses less than 2^(max(b,1) - 127 - k) when k mantissa
// bits stay, so the block's largest exponent fixes k = max(b,1) - 127 - q, within [0, 23].
// `q_lossless` marks e = 0: all 32 bits stay.
QSTAGE_HD int kept_bits(std::uint32_t largest_biased_exponent, int q, bool q_lossless) {
  if (q_lossless) return 32;
  const int b = largest_biased_exponent < 1 ? 1 : static_cast<int>(largest_biased_exponent);
  int k = b - 127 - q;
  k = k < 0 ? 0 : (k > 23 ? 23 : k);
  return 9 + k;
}
QSTAGE_HD std::uint32_t kept_mask(int bits) { return bits >= 32 ? 0xffffffffu : ~((1u << (32 - bits)) - 1u); }
QSTAGE_HD int kept_bytes(int bits) { return (bits + 7) / 8; }
QSTAGE_HD std::uint32_t biased_exponent(float x) { return (float_bits(x) >> 23) & 0xffu; }

// Leading bytes (most significant first) that w shares with the previous word, at most 3 and at
// most the kept bytes: the 2-bit code of XOR leading-byte coding.
QSTAGE_HD int shared_leading_bytes(std::uint32_t w, std::uint32_t previous, int bytes) {
  const std::uint32_t x = w ^ previous;
#ifdef __CUDA_ARCH__
  const int zero_bytes = __clz(x) / 8;  // (4 when x is 0)
#else
  const int zero_bytes = x ? __builtin_clz(x) / 8 : 4;
#endif
  const int lead = zero_bytes < 3 ? zero_bytes : 3;
  return lead < bytes ? lead : bytes;
}

// Byte j (0 = most significant) of a word.
QSTAGE_HD std::uint8_t word_byte(std::uint32_t w, int j) { return static_cast<std::uint8_t>(w >> (24 - 8 * j)); }

// A dense block's value from its mid and truncated residual (mid 0 adds nothing, so the
// residual's bits, a negative zero included, come back as they are).
QSTAGE_HD float dense_value(float mid, std::uint32_t residual_bits) {
  const float r = bits_float(residual_bits);
  return float_bits(mid) == 0 ? r : mid + r;
}

// Quantized blocks: a value becomes q = rint(y / step) with step = 2e (|y - q step| <= e up to
// rounding, which the encoder's check catches), stored as zigzag(q) in the block's bit width.
// |q| stays below 2^30 so zigzag(q) fits 31 bits.
QSTAGE_HD bool quantize(float y, double step, long long& q) {
  const double r = rint(static_cast<double>(y) / step);
  if (!(r > -1073741824.0 && r < 1073741824.0)) return false;
  q = static_cast<long long>(r);
  return true;
}
QSTAGE_HD std::uint32_t zigzag(long long q) { return static_cast<std::uint32_t>((q << 1) ^ (q >> 63)); }
QSTAGE_HD long long unzigzag(std::uint32_t z) {
  return static_cast<long long>(z >> 1) ^ -static_cast<long long>(z & 1u);
}
QSTAGE_HD float dequantize(long long q, double step) { return static_cast<float>(static_cast<double>(q) * step); }
QSTAGE_HD int bit_width(std::uint32_t z) {
  int w = 0;
  while (z) {
    ++w;
    z >>= 1;
  }
  return w;
}
QSTAGE_HD int quantized_bytes(int m, int width) { return 1 + (m * width + 7) / 8; }

}  // namespace qstage::codec::detail
