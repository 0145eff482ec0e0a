#pragma once
// A step's committed progress: <run>/steps/<id>/journal.json plus the segment files it lists.
//
// The journal is the only source of truth inside a step. It is replaced atomically (temporary
// name, fsync, rename, fsync directory) after the segment files it names are durable, so after
// a kill at any instant it names only complete segments. Files it does not name (a *.tmp being
// written, a segment renamed just before the kill) are deleted on resume, never read.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/mpi.hpp"
#include "engine/pass.hpp"

namespace qstage::engine {

struct Segment {
  std::string file;  // name inside the work directory
  RowRange rows;     // pass rows
  std::vector<RowRange> output_rows;  // per output: its rows in this segment (appended outputs' own)
  // Per output in segments: the qsum64 of its rows here, at their places in the output (what the
  // segment must hold; checked before a resumed run trusts it). Empty in journals of older runs.
  std::vector<std::uint64_t> checksums = {};
};

// The chunk spool of a compressed output (OutputDecl::codec): its file in the work directory and
// its committed state (h5::ChunkSpool::State, serialized).
struct SpoolRecord {
  std::string output, file, state;
};

struct Journal {
  std::string key;                  // the step key this progress belongs to
  std::uint64_t rows = 0;           // the pass's rows and tile size when it started
  std::uint64_t tile_rows = 0;
  std::uint64_t committed_rows = 0; // rows [0, committed_rows) are done and durable
  std::vector<Segment> segments;
  std::vector<std::uint64_t> checksums;  // qsum64 per output over the committed rows
  std::string reduction;            // Reduction::save() after folding the committed tiles (on disk: a side file)
  std::vector<SpoolRecord> spools;  // one per compressed output, once committed
  // Per output: appended outputs' rows per committed batch, in batch order (else empty).
  std::vector<std::vector<std::uint64_t>> appended;
  // Per output: exchanged outputs' committed rows per bucket (else empty).
  std::vector<std::vector<std::uint64_t>> buckets;
  int attempts = 0;                 // runs that worked on this step
  double wall_seconds = 0;          // summed over attempts, up to the last commit
  double compute_seconds = 0;

  nlohmann::json to_json() const;
  static Journal from_json(const nlohmann::json& j);
};

// The hash a state file (a journal, a step's run-state header) records of itself, in its member
// "hash": XXH3-128 of its JSON without that member. Checked when it is read back.
std::string self_hash(nlohmann::json j);

// Why a journal's progress cannot be trusted as it stands, found by checking it against itself
// and against the segment files it names (empty: it can). `spec` is the pass it belongs to.
std::string journal_problem(const Journal& journal, const PassSpec& spec);
// The first segment whose files do not hold the rows its journal recorded (a segment file cut
// short, or bytes changed), with why; nullopt if every segment does. Reads every segment.
struct BadSegment {
  std::size_t index = 0;
  std::string why;
};
std::optional<BadSegment> first_bad_segment(const Journal& journal, const PassSpec& spec, const std::filesystem::path& dir);

// The work directory of one step.
class StepWork {
 public:
  StepWork(std::filesystem::path dir, std::string key, const mpi::Comm& comm);
  const std::filesystem::path& dir() const { return dir_; }
  // Collective. Rank 0 reads the journal if it belongs to this key and pass shape; otherwise
  // (first run, parameters changed, different tiling) it clears the directory. Stray files are
  // removed. Every rank receives the journal.
  Journal load(const PassSpec& spec);
  // Rank 0: replaces the journal atomically; the reduction's state goes to a binary side file
  // (reduction-<committed rows>.bin) that the journal names with its size and hash.
  void save(const Journal& journal) const;
  // Rank 0: the directory is no longer needed (the output is committed).
  void remove() const;
  // The file of an exchanged output's bucket (its rows that reached the owner), in the directory.
  static std::string bucket_file(std::size_t output, std::size_t bucket);
  // A new segment's final and temporary paths.
  std::filesystem::path segment_path(std::size_t index) const;
  // A stage of several passes: the folder of its pass `index` (before the output pass), inside
  // the step's directory, and the file of the state between passes. The output pass's load
  // keeps both; they go with the directory when the step is done.
  static std::string pass_folder(int index);
  static constexpr const char* kRunState = "run-state.bin";  // the step run's committed state
  // Last reported progress of a running step, for `qstage status` (rank 0, best effort).
  void save_progress(const nlohmann::json& progress) const;

 private:
  std::string read_reduction(const nlohmann::json& journal) const;  // the side file's bytes, checked
  std::string verify(const nlohmann::json& text, Journal& journal, const PassSpec& spec) const;
  std::filesystem::path dir_;
  std::string key_;
  const mpi::Comm& comm_;
};

}  // namespace qstage::engine
