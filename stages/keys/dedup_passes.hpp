#pragma once
// De-duplication of multi-word keys as passes of a stage (seed 004, section 4.1: sort-based
// regular sampling). keys.dedup is these passes and a finish pass; a stage that generates keys in
// an earlier pass (sci.solve's candidate determinants) runs the same passes on that pass's output.
//
// The passes, each a StepPass run by the engine (batched, spread over ranks, checkpointed):
//   sample     streams the keys; each fixed tile of tile_rows rows is sorted and made unique, and
//              gives `samples` keys at regular positions, jittered per tile (and how many distinct keys they stand
//              for); the reduction (a tree fold, so rank- and batch-independent) gathers them.
//              after(): B-1 splitters at equal quantiles of those weights, distinct keys, so every
//              copy of a key falls in one bucket; B from the data and the device budget.
//   partition  streams the keys (and values); each tile is sorted stably and reduced to one
//              record per distinct key (count, value: a PairwiseSum in input order, origin), and the
//              records go out grouped by bucket: an appended output with `buckets` = B, which the
//              engine's exchange phase moves to bucket b's owner (rank b mod P). Bucket b then
//              holds its records tile after tile, whatever the batches or ranks were. With the
//              reverse index, every row's position among its tile's distinct keys goes to `local`.
//   merge      one explicit batch per non-empty bucket: sorts its records stably by key and sums
//              the counts and values of equal keys in tile order: `keys`, `counts` (and `values`)
//              appended in bucket order, i.e. globally ascending. The value of a key is thus
//              PairwiseSum over tiles (in tile order) of the tile's PairwiseSum (in input order): the same bits
//              for any batch size, budget or rank count. With the reverse index, each record
//              also leaves (origin, merge batch, position) in `pairs`, exchanged by row bucket.
// and, for the reverse index, a pass over the input rows (finish_pass) with one explicit batch
// per row bucket: it scatters that row bucket's pairs into a table over its (tile, local) ids and
// reads every row's index through `local`. That is out of core (a batch holds one row bucket, and
// the merge holds one key bucket) and moves only one pair per *record*, not per row, through the
// second exchange: tiles with heavy duplication send little.
//
// Record layouts (all uint64 columns, float64 values as their bits):
//   input with an interleaved value: (n, words + 1) uint64, the key's words then the value's bits
//     (SCI's {alpha, beta, value} candidates, written as u64 with the double's bit pattern);
//   partition's `records`: kernels::RecordLayout (key words, [value bits], count, [origin]);
//   merge's `pairs`: (origin, merge batch, position in that batch's keys).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/serial.hpp"
#include "kernels/keys/sort_unique.hpp"
#include "stages/keys/dedup_resident.hpp"
#include "stages/common/stage.hpp"

namespace qstage::stages::keys {

// What to de-duplicate.
struct DedupSource {
  std::string keys;                   // streamed-input name: a slot, or earlier_pass_input(k, dataset)
  std::optional<std::string> values;  // a float64 (n,) dataset summed per key, the same way named
  std::uint64_t rows = 0;             // n, at least 1
  std::uint32_t words = 1;            // key words, 1..4
  bool interleaved_value = false;     // keys is (n, words + 1): the last column is a float64's bits
  bool keys_1d = false;               // keys is (n,) (words 1): so is the merged `keys`
  bool index = false;                 // also the reverse index (finish_pass)
  std::uint64_t tile_rows = 1 << 16;  // the fixed pre-reduction unit: sums depend on it, nothing else does
  std::uint32_t buckets = 0;          // 0: chosen from the data and the device budget; set: the passes run
  std::uint32_t samples = 32;         // per tile
  bool has_value() const { return values.has_value() || interleaved_value; }
  kernels::RecordLayout record_layout() const { return {words, has_value(), index}; }
};

// Where the unique keys ended up: datasets of prior_pass_output(ctx, pass) (or, to stream them,
// earlier_pass_input(pass, name)), each `unique` rows in ascending key order.
struct DedupResult {
  int pass = 0;
  std::string keys = "keys";      // (unique, words) uint64, or (unique,) when keys_1d
  std::string counts = "counts";  // (unique,) uint64
  std::string values = "values";  // (unique,) float64, with a value
  std::uint64_t unique = 0;
};

// The sample, partition and merge passes as a sub-run: the step's run that owns it (keys.dedup's,
// sci.solve's) asks next() for its passes while !done(), hands each back to finished() once
// complete, and saves and loads its state with its own. Its passes are numbered in the owner's
// step (StepContext::passes_done).
class DedupRun {
 public:
  DedupRun(const StepContext& ctx, DedupSource source);
  const DedupSource& source() const { return source_; }

  bool done() const { return phase_ == Phase::done; }
  StepPass next() const;  // while !done()
  void finished(const StepPass& pass);

  // Before any pass: the sample, partition and merge as one unit of host work on resident data,
  // when it fits on every rank: ResidentChain where the chain and its input blocks fit half of what
  // the device budget has left (and the host budget the staging blocks), else HostChain (the
  // records in host memory, the device taking a block, then a bucket, at a time) where its arrays
  // fit half of what the host budget has left. With several ranks, where each could hold the chain
  // on its device, the unit is divided between them (each reads and reduces an equal share of the
  // rows, unique_over_ranks exchanges one bucket a rank and sends the index back), and the result
  // is gathered on every rank; else each runs the whole unit on its own device (HostChain) or
  // the passes run. Either way the output pass is spread as usual. It reads the source's
  // datasets once, block by block (the read of one overlapping the device's work on the last),
  // writes no file, and keeps the unique keys (and the index) in memory for finish_pass: done()
  // after it. False when neither fits, the source names its buckets or the passes have begun: they
  // run. Its result is not saved
  // (save() keeps the state before it), so a resumed step runs it again.
  bool run_resident(const h5::Dataset& keys, const h5::Dataset* values);
  bool resident() const { return resident_.has_value(); }
  bool resident_divided() const { return resident_ && divided_; }            // (between the ranks)
  bool resident_on_host() const { return resident_ && resident_->on_host; }  // (HostChain's)

  // Once done() by the passes (not run_resident).
  DedupResult result() const;
  std::uint64_t unique() const { return unique_; }  // (once done(), either way)
  // Records each of `ranks` ranks merged (the engine deals the non-empty buckets' batches round
  // robin): the load balance of the sample sort (seed 004's Table 1), once the partition is done.
  // On resident data: every record, on every rank.
  std::vector<std::uint64_t> merge_rows_per_rank(int ranks) const;
  std::uint64_t buckets() const { return resident_ ? resident_->buckets : bucket_rows_.size(); }
  std::uint32_t row_buckets() const { return row_buckets_; }

  // With source().index: the pass over the input rows that writes `index` (uint64, (rows,),
  // chunks of tile_rows: each row's position in the unique keys) and, with `copy_unique`, also
  // the unique keys/counts/values, as appended outputs of the same names (keys.dedup's output
  // pass, which must hold them all). Without the index, copy_unique must be set.
  StepPass finish_pass(bool copy_unique) const;

  // The lowest of the owner's earlier passes its later passes and finish_pass still read (the
  // source's pass while sampling and partitioning, then the partition's buckets, then the merge's
  // output and, with the index, the partition's `local`); `none` when it reads none of them.
  int first_live_pass(int none) const;

  void save(Packer& out) const;
  void load(Unpacker& in);

 private:
  enum class Phase : std::uint8_t { sample, partition, merge, done };
  StepPass resident_finish_pass(bool copy_unique) const;
  const StepContext& ctx_;
  DedupSource source_;
  Phase phase_ = Phase::sample;
  // What the passes found: the sample's splitters and row buckets, the partition's buckets, the
  // merge's unique keys (and each merge batch's first), and the pass numbers in the owner's step.
  int partition_pass_ = -1, merge_pass_ = -1;
  std::uint32_t buckets_ = 0, row_buckets_ = 0;
  std::vector<std::uint64_t> splitters_;
  std::uint64_t rows_per_row_bucket_ = 0;
  std::vector<std::uint64_t> bucket_rows_;
  std::uint64_t unique_ = 0;
  std::vector<std::uint64_t> unique_prefix_, pair_rows_;
  std::optional<ResidentChain::Unique> resident_;  // run_resident's unique keys, counts, values and index
  bool divided_ = false;                           // (run_resident's unit divided between the ranks)
  // The divided unit: true once resident_ holds the whole result on every rank; false on every
  // rank (nothing kept) where some rank's share or the gathered result does not fit.
  using ReadRows = std::function<void(std::uint64_t first, std::uint64_t rows, std::uint64_t block, char* keys,
                                      char* values, Stream& stream)>;
  bool run_divided(const ReadRows& read, std::uint64_t block, std::uint64_t device_left);
};

}  // namespace qstage::stages::keys
