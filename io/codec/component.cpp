#include "io/codec/component.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace qstage::codec::detail {

bool groups(Pipeline p) { return p == Pipeline::group || p == Pipeline::group2l || p == Pipeline::quantized; }

BlockRules rules_for(const Coding& c) {
  switch (c.pipeline) {
    case Pipeline::szx: return block_rules(0, c.e, false, false);
    case Pipeline::threshold: return block_rules(c.t, c.e, true, false);
    case Pipeline::integrated: return block_rules(c.t, c.e, true, true);
    case Pipeline::quantized: return block_rules(c.t, c.e, false, false, true);
    case Pipeline::group:
    case Pipeline::group2l: break;
  }
  return block_rules(c.t, c.e, false, false);  // the significant values: nothing left to threshold
}

ComponentParts code_component(const float* x, std::uint64_t n, int stride, const Coding& c) {
  ComponentParts parts;
  std::vector<float> values;  // contiguous: all values, or the significant ones
  values.reserve(groups(c.pipeline) ? 0 : n);
  if (groups(c.pipeline)) {
    parts.bitmap.assign(div_up(n, 8), 0);
    for (std::uint64_t i = 0; i < n; ++i)
      if (significant(x[i * stride], c.t)) {
        parts.bitmap[i / 8] = static_cast<std::uint8_t>(parts.bitmap[i / 8] | (1u << (i % 8)));
        values.push_back(x[i * stride]);
      }
  } else {
    for (std::uint64_t i = 0; i < n; ++i) values.push_back(x[i * stride]);
  }
  parts.coded = values.size();
  const BlockRules rules = rules_for(c);
  const std::uint64_t blocks = div_up(parts.coded, c.block);
  parts.meta.assign(3 * blocks, 0);
  std::uint8_t buffer[kMaxBlockPayload];
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const int count = static_cast<int>(std::min<std::uint64_t>(c.block, parts.coded - b * c.block));
    int bytes = 0;
    parts.meta[b] = encode_block(values.data() + b * c.block, count, rules, buffer, bytes);
    parts.meta[blocks + 2 * b] = static_cast<std::uint8_t>(bytes);
    parts.meta[blocks + 2 * b + 1] = static_cast<std::uint8_t>(bytes >> 8);
    parts.payload.insert(parts.payload.end(), buffer, buffer + bytes);
  }
  return parts;
}

void decode_component(const StoredComponent& c, const std::uint8_t* stream, std::uint64_t n, int stride,
                      const Coding& coding, float* out, BlockCounts* counts) {
  const std::uint64_t blocks = div_up(c.coded, coding.block);
  std::vector<float> values(c.coded);
  const std::uint8_t* payload = stream + c.payload_offset;
  std::uint64_t at = 0;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const int count = static_cast<int>(std::min<std::uint64_t>(coding.block, c.coded - b * coding.block));
    const int bytes = block_payload_size(c.meta, blocks, b);
    decode_block(c.meta[b], payload + at, bytes, count, 2 * coding.e, values.data() + b * coding.block);
    at += static_cast<std::uint64_t>(bytes);
    if (counts) {
      std::uint64_t* slot[] = {&counts->zero,  &counts->constant, &counts->sparse,
                               &counts->dense, &counts->raw,      &counts->quantized};
      ++*slot[c.meta[b]];
    }
  }
  if (!groups(coding.pipeline)) {
    for (std::uint64_t i = 0; i < n; ++i) out[i * stride] = values[i];
    return;
  }
  std::uint64_t k = 0;
  for (std::uint64_t i = 0; i < n; ++i) out[i * stride] = (c.bitmap[i / 8] >> (i % 8)) & 1u ? values[k++] : 0.0f;
}

}  // namespace qstage::codec::detail
