#pragma once
// How a pass's rows are cut into batches: whole tiles sized by the budgets, or explicit ranges
// a stage derives from its data (key ranges over key-sorted rows).
#include <cstdint>
#include <vector>

#include "engine/pass.hpp"
#include "io/h5.hpp"

namespace qstage::engine {

// Batches covering [first, spec.rows): the spec's explicit batches from `first` on, or pieces
// of batch_rows rows (whole tiles except at the end).
std::vector<RowRange> partition(const PassSpec& spec, std::uint64_t first, std::uint64_t batch_rows);

// The number of reduction units (partials) in a batch.
std::uint64_t partials_in(const PassSpec& spec, const RowRange& batch);

// Checks explicit batches: consecutive, non-empty, covering [0, rows), aligned to output chunks.
// Throws std::invalid_argument (a stage's bug, not the user's).
void check_batches(const PassSpec& spec);

// Splits a 1-D dataset of ascending uint64 keys at `bounds` (ascending): batch i holds the rows
// whose keys lie in [bounds[i-1], bounds[i]), the first from row 0, the last up to the end;
// empty ranges are dropped. O(log rows) single-row reads per bound, on the calling thread.
std::vector<RowRange> key_range_batches(const h5::Dataset& sorted_keys, const std::vector<std::uint64_t>& bounds);

}  // namespace qstage::engine
