#include "engine/partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace qstage::engine {

namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return b ? (a + b - 1) / b : 0; }

}  // namespace

Batches partition(const PassSpec& spec, std::uint64_t first, std::uint64_t batch_rows) {
  if (spec.batches.empty()) return Batches(first, spec.rows, batch_rows);
  std::vector<RowRange> out;
  for (const auto& b : spec.batches)
    if (b.begin >= first) out.push_back(b);
  const std::uint64_t skipped = spec.batches.size() - out.size();
  return Batches(std::move(out), skipped);
}

std::uint64_t partials_in(const PassSpec& spec, const RowRange& batch) {
  return spec.batches.empty() ? ceil_div(batch.size(), spec.tile_rows) : 1;
}

void check_batches(const PassSpec& spec) {
  for (const auto& in : spec.inputs) {
    if (in.kind != InputKind::row_ranges) continue;
    if (in.ranges.size() != spec.batches.size() || spec.batches.empty())
      throw std::invalid_argument(fmt::format("row_ranges input '{}' has {} ranges for {} explicit batches", in.name,
                                              in.ranges.size(), spec.batches.size()));
    const std::uint64_t rows = in.rows();
    for (const auto& r : in.ranges)
      if (r.begin > r.end || r.end > rows)
        throw std::invalid_argument(fmt::format("row_ranges input '{}': range [{}, {}) is not inside its {} rows", in.name,
                                                r.begin, r.end, rows));
  }
  if (spec.batches.empty()) return;
  std::uint64_t expected = 0;
  for (const auto& b : spec.batches) {
    if (b.begin != expected || b.end <= b.begin)
      throw std::invalid_argument(fmt::format("explicit batches must be consecutive and non-empty; [{}, {}) follows row {}",
                                              b.begin, b.end, expected));
    for (const auto& o : spec.outputs)
      if (o.kind != OutputKind::appended && b.begin % o.layout.chunk[0] != 0)
        throw std::invalid_argument(fmt::format("explicit batch boundary {} is not a multiple of output '{}''s {} chunk rows",
                                                b.begin, o.name, o.layout.chunk[0]));
    expected = b.end;
  }
  if (expected != spec.rows)
    throw std::invalid_argument(fmt::format("explicit batches end at row {}; the pass has {} rows", expected, spec.rows));
}

std::vector<RowRange> key_range_batches(const h5::Dataset& keys, const std::vector<std::uint64_t>& bounds) {
  const auto shape = keys.shape();
  if (shape.size() != 1 || keys.dtype() != h5::DType::uint64)
    throw std::invalid_argument("key_range_batches needs a 1-D uint64 dataset of sorted keys");
  const std::uint64_t rows = shape[0];
  auto key_at = [&](std::uint64_t row) {
    std::uint64_t k = 0;
    keys.read_rows(row, 1, &k);
    return k;
  };
  // First row whose key is >= bound (binary search over the file).
  auto lower_bound = [&](std::uint64_t bound) {
    std::uint64_t lo = 0, hi = rows;
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      if (key_at(mid) < bound) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  std::vector<RowRange> out;
  std::uint64_t begin = 0;
  for (std::uint64_t bound : bounds) {
    const std::uint64_t end = std::max(begin, lower_bound(bound));
    if (end > begin) out.push_back({begin, end});
    begin = end;
  }
  if (rows > begin) out.push_back({begin, rows});
  return out;
}

}  // namespace qstage::engine
