#pragma once
// How a pass's rows are cut into batches: whole tiles sized by the budgets, or explicit ranges
// a stage derives from its data (key ranges over key-sorted rows).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/pass.hpp"
#include "io/h5.hpp"

namespace qstage::engine {

// Batches covering [first, rows): explicit ranges, or pieces of batch_rows rows (whole tiles
// except at the end) computed when asked for, so a pass of 10^12 rows holds no list of 10^10
// batches.
class Batches {
 public:
  Batches() = default;
  // Explicit ranges, the first of which is the pass's batch number `first_index`.
  Batches(std::vector<RowRange> explicit_ranges, std::uint64_t first_index)
      : explicit_(std::move(explicit_ranges)), uniform_(false), first_index_(first_index) {}
  Batches(std::uint64_t first, std::uint64_t rows, std::uint64_t batch_rows)
      : first_(first), rows_(rows), batch_rows_(batch_rows) {}
  std::uint64_t size() const {
    if (!uniform_) return explicit_.size();
    return rows_ > first_ && batch_rows_ ? (rows_ - first_ + batch_rows_ - 1) / batch_rows_ : 0;
  }
  RowRange operator[](std::uint64_t i) const {
    if (!uniform_) return explicit_[i];
    const std::uint64_t begin = first_ + i * batch_rows_;
    return {begin, std::min(rows_, begin + batch_rows_)};
  }
  // The pass's number of batch i (explicit batches: its index in PassSpec::batches).
  std::uint64_t pass_index(std::uint64_t i) const { return first_index_ + i; }

 private:
  std::vector<RowRange> explicit_;
  bool uniform_ = true;
  std::uint64_t first_ = 0, rows_ = 0, batch_rows_ = 0;
  std::uint64_t first_index_ = 0;
};

// The batches of `spec` from row `first` on: its explicit batches, or pieces of batch_rows rows.
Batches partition(const PassSpec& spec, std::uint64_t first, std::uint64_t batch_rows);

// The number of reduction units (partials) in a batch.
std::uint64_t partials_in(const PassSpec& spec, const RowRange& batch);

// Checks explicit batches: consecutive, non-empty, covering [0, rows), aligned to the chunks of
// outputs of pass rows; and row_ranges inputs: a range per batch, inside the dataset.
// Throws std::invalid_argument (a stage's bug, not the user's).
void check_batches(const PassSpec& spec);

// Splits a 1-D dataset of ascending uint64 keys at `bounds` (ascending): batch i holds the rows
// whose keys lie in [bounds[i-1], bounds[i]), the first from row 0, the last up to the end;
// empty ranges are dropped. O(log rows) single-row reads per bound, on the calling thread.
std::vector<RowRange> key_range_batches(const h5::Dataset& sorted_keys, const std::vector<std::uint64_t>& bounds);

}  // namespace qstage::engine
