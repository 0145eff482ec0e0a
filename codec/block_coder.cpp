#include "codec/block_coder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "codec/codec.hpp"

namespace qstage::codec::detail {

namespace {

// The largest float at or below v (v not NaN).
float float_at_or_below(double v) {
  constexpr double kMax = std::numeric_limits<float>::max();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (v >= kMax) return std::isinf(v) ? kInf : static_cast<float>(kMax);
  if (v < -kMax) return -kInf;
  float f = static_cast<float>(v);
  if (static_cast<double>(f) > v) f = std::nextafter(f, -kInf);
  return f;
}

}  // namespace

BlockRules block_rules(double threshold, double error, bool thresholds, bool sparse, bool quantize) {
  BlockRules r;
  r.t = thresholds ? threshold : -1.0;
  r.e = error;
  r.lossless = !(error > 0);
  if (!r.lossless) {
    int p = 0;
    std::frexp(error, &p);  // error = f * 2^p with f in [0.5, 1)
    r.q = p - 1;
  }
  r.sparse = sparse;
  r.quantize = quantize && !r.lossless;
  r.step = 2 * error;
  r.t_below = float_at_or_below(r.t);
  r.te_below = float_at_or_below(std::max(r.t, r.e));
  return r;
}

namespace {

void put_u32(std::uint8_t* out, std::uint32_t w) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(w >> (8 * i));
}
std::uint32_t get_u32(const std::uint8_t* in) {
  std::uint32_t w = 0;
  for (int i = 0; i < 4; ++i) w |= static_cast<std::uint32_t>(in[i]) << (8 * i);
  return w;
}

[[noreturn]] void bad_block(const char* what) { throw FormatError(fmt::format("corrupted block: {}", what)); }

int write_raw(const float* x, int m, std::uint8_t* out) {
  for (int i = 0; i < m; ++i) put_u32(out + 4 * i, float_bits(x[i]));
  return 4 * m;
}

// Dense: [mid f32][kept bits u8][2-bit codes][bytes of each truncated residual not shared with the previous].
int write_dense(const float* y, int m, float mid, const BlockRules& r, std::uint8_t* out) {
  std::uint32_t w[kMaxBlockValues];
  std::uint32_t largest = 0;
  const bool around_zero = float_bits(mid) == 0;
  for (int i = 0; i < m; ++i) {
    const float residual = around_zero ? y[i] : y[i] - mid;
    w[i] = float_bits(residual);
    largest = std::max(largest, biased_exponent(residual));
  }
  const int bits = kept_bits(largest, r.q, r.lossless);
  const std::uint32_t mask = kept_mask(bits);
  const int bytes = kept_bytes(bits);
  put_u32(out, float_bits(mid));
  out[4] = static_cast<std::uint8_t>(bits);
  std::uint8_t* codes = out + 5;
  const int code_bytes = (m + 3) / 4;
  std::fill(codes, codes + code_bytes, std::uint8_t{0});
  int p = 5 + code_bytes;
  std::uint32_t previous = 0;
  for (int i = 0; i < m; ++i) {
    const std::uint32_t wi = w[i] & mask;
    const int lead = shared_leading_bytes(wi, previous, bytes);
    codes[i / 4] = static_cast<std::uint8_t>(codes[i / 4] | (lead << (2 * (i % 4))));
    for (int j = lead; j < bytes; ++j) out[p++] = word_byte(wi, j);
    previous = wi;
  }
  return p;
}

// Sparse: [count u8][kept bits u8][count in-block indices u8][truncated values, kept bytes each].
int write_sparse(const float* y, int m, int count, const BlockRules& r, std::uint8_t* out) {
  std::uint32_t largest = 0;
  for (int i = 0; i < m; ++i) largest = std::max(largest, biased_exponent(y[i]));
  const int bits = kept_bits(largest, r.q, r.lossless);
  const std::uint32_t mask = kept_mask(bits);
  const int bytes = kept_bytes(bits);
  out[0] = static_cast<std::uint8_t>(count);
  out[1] = static_cast<std::uint8_t>(bits);
  int p = 2, v = 2 + count;
  for (int i = 0; i < m; ++i) {
    if (!stored_in_sparse(y[i])) continue;
    out[p++] = static_cast<std::uint8_t>(i);
    const std::uint32_t wi = float_bits(y[i]) & mask;
    for (int j = 0; j < bytes; ++j) out[v++] = word_byte(wi, j);
  }
  return v;
}

// Quantized: [bit width u8][zigzag(q) of each value in that many bits, least significant first];
// -1 when some value's q is out of range.
int write_quantized(const float* y, int m, const BlockRules& r, std::uint8_t* out) {
  std::uint32_t z[kMaxBlockValues], largest = 0;
  for (int i = 0; i < m; ++i) {
    long long q = 0;
    if (!quantize(y[i], r.step, q)) return -1;
    z[i] = zigzag(q);
    largest = std::max(largest, z[i]);
  }
  const int width = bit_width(largest), bytes = quantized_bytes(m, width);
  out[0] = static_cast<std::uint8_t>(width);
  std::fill(out + 1, out + bytes, std::uint8_t{0});
  for (int i = 0; i < m; ++i)
    for (int b = 0; b < width; ++b)
      if ((z[i] >> b) & 1u) {
        const int bit = i * width + b;
        out[1 + bit / 8] = static_cast<std::uint8_t>(out[1 + bit / 8] | (1u << (bit % 8)));
      }
  return bytes;
}

bool decodes_within_bounds(std::uint8_t state, const std::uint8_t* payload, int bytes, const float* x, int m,
                           const BlockRules& r) {
  float decoded[kMaxBlockValues];
  decode_block(state, payload, bytes, m, r.step, decoded);
  for (int i = 0; i < m; ++i)
    if (!within(decoded[i], x[i], allowed_error(x[i], r.t, r.e))) return false;
  return true;
}

}  // namespace

BlockState encode_block(const float* x, int m, const BlockRules& r, std::uint8_t* out, int& bytes) {
  float y[kMaxBlockValues];
  bool finite = true;
  int nonzero = 0;
  for (int i = 0; i < m; ++i) {
    finite = finite && is_finite(x[i]);
    y[i] = thresholded(x[i], r.t);
    nonzero += stored_in_sparse(y[i]);
  }
  if (!finite) {
    bytes = write_raw(x, m, out);
    return kRaw;
  }
  if (decodes_within_bounds(kZero, out, 0, x, m, r)) {
    bytes = 0;
    return kZero;
  }
  const auto [lo, hi] = std::minmax_element(y, y + m);
  const float mid = midpoint(*lo, *hi);
  put_u32(out, float_bits(mid));
  if (decodes_within_bounds(kConstant, out, 4, x, m, r)) {
    bytes = 4;
    return kConstant;
  }
  // The smallest candidate that stays within the bounds; ties go to the earlier one, and raw
  // (always valid) comes last.
  std::uint8_t scratch[kMaxBlockPayload];
  BlockState chosen = kRaw;
  int chosen_bytes = 4 * m + 1;
  auto take = [&](BlockState state, int n) {
    if (n < chosen_bytes && decodes_within_bounds(state, scratch, n, x, m, r)) {
      std::copy(scratch, scratch + n, out);
      chosen = state;
      chosen_bytes = n;
    }
  };
  if (r.sparse && nonzero >= 1 && nonzero <= m / 2) take(kSparse, write_sparse(y, m, nonzero, r, scratch));
  if (r.quantize) {
    const int n = write_quantized(y, m, r, scratch);
    if (n >= 0) take(kQuantized, n);
  }
  take(kDense, write_dense(y, m, 0.0f, r, scratch));
  if (float_bits(mid) != 0) take(kDense, write_dense(y, m, mid, r, scratch));
  if (chosen == kRaw) chosen_bytes = write_raw(x, m, out);
  bytes = chosen_bytes;
  return chosen;
}

void decode_block(std::uint8_t state, const std::uint8_t* in, int bytes, int m, double step, float* out) {
  switch (state) {
    case kZero:
      if (bytes != 0) bad_block("a zero block with a payload");
      std::fill(out, out + m, 0.0f);
      return;
    case kConstant:
      if (bytes != 4) bad_block("a constant block whose payload is not 4 bytes");
      std::fill(out, out + m, bits_float(get_u32(in)));
      return;
    case kRaw:
      if (bytes != 4 * m) bad_block("a raw block of the wrong size");
      for (int i = 0; i < m; ++i) out[i] = bits_float(get_u32(in + 4 * i));
      return;
    case kSparse: {
      if (bytes < 2) bad_block("a truncated sparse block");
      const int count = in[0], bits = in[1];
      if (count < 1 || count > m) bad_block("a sparse block's count out of range");
      if (bits < 9 || bits > 32) bad_block("kept bits out of range");
      const int nb = kept_bytes(bits);
      if (bytes != 2 + count + count * nb) bad_block("a sparse block of the wrong size");
      std::fill(out, out + m, 0.0f);
      int previous = -1;
      for (int s = 0; s < count; ++s) {
        const int index = in[2 + s];
        if (index <= previous || index >= m) bad_block("sparse indices not increasing within the block");
        previous = index;
        std::uint32_t w = 0;
        for (int j = 0; j < nb; ++j) w |= static_cast<std::uint32_t>(in[2 + count + s * nb + j]) << (24 - 8 * j);
        out[index] = bits_float(w);
      }
      return;
    }
    case kDense: {
      const int code_bytes = (m + 3) / 4;
      if (bytes < 5 + code_bytes) bad_block("a truncated dense block");
      const float mid = bits_float(get_u32(in));
      const int bits = in[4];
      if (bits < 9 || bits > 32) bad_block("kept bits out of range");
      const int nb = kept_bytes(bits);
      const std::uint8_t* codes = in + 5;
      int p = 5 + code_bytes;
      std::uint32_t previous = 0;
      for (int i = 0; i < m; ++i) {
        const int lead = (codes[i / 4] >> (2 * (i % 4))) & 3;
        if (lead > nb) bad_block("a leading-byte code longer than the kept bytes");
        if (p + (nb - lead) > bytes) bad_block("a dense block shorter than its codes say");
        std::uint32_t w = lead == 0 ? 0u : previous & (0xffffffffu << (32 - 8 * lead));
        for (int j = lead; j < nb; ++j) w |= static_cast<std::uint32_t>(in[p++]) << (24 - 8 * j);
        out[i] = dense_value(mid, w);
        previous = w;
      }
      if (p != bytes) bad_block("a dense block longer than its codes say");
      return;
    }
    case kQuantized: {
      if (bytes < 1) bad_block("a truncated quantized block");
      const int width = in[0];
      if (width > 31 || bytes != quantized_bytes(m, width)) bad_block("a quantized block of the wrong size");
      // (The step is not in the block: it is 2e, from the header.)
      for (int i = 0; i < m; ++i) {
        std::uint64_t word = 0;
        const int bit = i * width;
        for (int k = 0; k < 5 && 1 + bit / 8 + k < bytes; ++k)
          word |= static_cast<std::uint64_t>(in[1 + bit / 8 + k]) << (8 * k);
        const auto z = static_cast<std::uint32_t>((word >> (bit % 8)) & ((1ull << width) - 1));
        out[i] = dequantize(unzigzag(z), step);
      }
      return;
    }
    default:
      bad_block("unknown block state");
  }
}

}  // namespace qstage::codec::detail
