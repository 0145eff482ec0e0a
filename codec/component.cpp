#include "codec/component.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace qstage::codec::detail {

bool groups(Pipeline p) { return p == Pipeline::group || p == Pipeline::quantized || two_level(p); }
// (quantized keeps group's zstd bitmap: on QAOA intermediates the two-level form cost it up to a
// quarter of its ratio at 1e-2, for 1.2-1.6x faster GPU decoding.)
bool two_level(Pipeline p) { return p == Pipeline::group2l; }

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
  // The values to code, contiguous: x itself, or a copy of every stride-th value or of the
  // significant ones.
  std::vector<float> copy;
  const float* values = x;
  if (groups(c.pipeline)) {
    parts.bitmap.assign(div_up(n, 8), 0);
    for (std::uint64_t i = 0; i < n; ++i)
      if (significant(x[i * stride], c.t)) {
        parts.bitmap[i / 8] = static_cast<std::uint8_t>(parts.bitmap[i / 8] | (1u << (i % 8)));
        copy.push_back(x[i * stride]);
      }
    values = copy.data();
    parts.coded = copy.size();
  } else {
    if (stride != 1) {
      copy.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) copy[i] = x[i * stride];
      values = copy.data();
    }
    parts.coded = n;
  }
  const BlockRules rules = rules_for(c);
  const std::uint64_t blocks = div_up(parts.coded, c.block);
  parts.meta.assign(3 * blocks, 0);
  // Blocks are coded in parallel, a chunk at a time, each into its own slot; the chunk's
  // payloads are then appended in block order (the same bytes for any thread count).
  constexpr std::uint64_t kChunk = 4096;
  std::vector<std::uint8_t> slots(std::min(blocks, kChunk) * kMaxBlockPayload);
  std::vector<int> bytes(std::min(blocks, kChunk));
  for (std::uint64_t first = 0; first < blocks; first += kChunk) {
    const std::int64_t count = static_cast<std::int64_t>(std::min(kChunk, blocks - first));
#pragma omp parallel for schedule(static)
    for (std::int64_t k = 0; k < count; ++k) {
      const std::uint64_t b = first + static_cast<std::uint64_t>(k);
      const int m = static_cast<int>(std::min<std::uint64_t>(c.block, parts.coded - b * c.block));
      parts.meta[b] = encode_block(values + b * c.block, m, rules,
                                   slots.data() + static_cast<std::uint64_t>(k) * kMaxBlockPayload, bytes[k]);
    }
    for (std::int64_t k = 0; k < count; ++k) {
      const std::uint64_t b = first + static_cast<std::uint64_t>(k);
      parts.meta[blocks + 2 * b] = static_cast<std::uint8_t>(bytes[k]);
      parts.meta[blocks + 2 * b + 1] = static_cast<std::uint8_t>(bytes[k] >> 8);
      const std::uint8_t* at = slots.data() + static_cast<std::uint64_t>(k) * kMaxBlockPayload;
      parts.payload.insert(parts.payload.end(), at, at + bytes[k]);
    }
  }
  return parts;
}

std::vector<ComponentParts> code_components(const float* x, std::uint64_t n, int parts, const Coding& c) {
  std::vector<ComponentParts> out;
  for (int part = 0; part < parts; ++part) out.push_back(code_component(x + part, n, parts, c));
  return out;
}

void decode_component(const StoredComponent& c, const std::uint8_t* stream, std::uint64_t n, int stride,
                      const Coding& coding, float* out, BlockCounts* counts) {
  const std::uint64_t blocks = div_up(c.coded, coding.block);
  std::vector<std::uint64_t> offsets(blocks + 1, 0);
  for (std::uint64_t b = 0; b < blocks; ++b)
    offsets[b + 1] = offsets[b] + static_cast<std::uint64_t>(block_payload_size(c.meta, blocks, b));
  std::vector<float> values(c.coded);
  const std::uint8_t* payload = stream + c.payload_offset;
  // Blocks decode in parallel; the first failing block (in block order) is the one reported.
  std::uint64_t failed = blocks;
  std::string reason;
#pragma omp parallel for schedule(static)
  for (std::int64_t k = 0; k < static_cast<std::int64_t>(blocks); ++k) {
    const auto b = static_cast<std::uint64_t>(k);
    const int m = static_cast<int>(std::min<std::uint64_t>(coding.block, c.coded - b * coding.block));
    try {
      decode_block(c.meta[b], payload + offsets[b], static_cast<int>(offsets[b + 1] - offsets[b]), m, 2 * coding.e,
                   values.data() + b * coding.block);
    } catch (const FormatError& e) {
#pragma omp critical(qstage_codec_decode)
      if (b < failed) {
        failed = b;
        reason = e.what();
      }
    }
  }
  if (failed < blocks) throw FormatError(fmt::format("block {}: {}", failed, reason));
  if (counts) {
    std::uint64_t* slot[] = {&counts->zero,  &counts->constant, &counts->sparse,
                             &counts->dense, &counts->raw,      &counts->quantized};
    for (std::uint64_t b = 0; b < blocks; ++b) ++*slot[c.meta[b]];
  }
  if (!groups(coding.pipeline)) {
    for (std::uint64_t i = 0; i < n; ++i) out[i * stride] = values[i];
    return;
  }
  std::uint64_t k = 0;
  for (std::uint64_t i = 0; i < n; ++i) out[i * stride] = (c.bitmap[i / 8] >> (i % 8)) & 1u ? values[k++] : 0.0f;
}

}  // namespace qstage::codec::detail
