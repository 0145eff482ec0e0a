#pragma once
// The run directory and its manifest.
//
//   <run>/manifest.json      what ran: workflow, spec, and per step its key, state, output,
//                            checksums, timings (replaced atomically by rank 0)
//   <run>/spec.yaml          the spec text of the latest run
//   <run>/outputs/<id>.h5    committed step outputs (appear only when complete)
//   <run>/steps/<id>/        work in progress: journal.json and segment files
//   <run>/logs/rank-N.log    one log per rank
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace qstage::runner {

class Manifest {
 public:
  // Reads <run>/manifest.json; nullopt if the directory has none. InputError if unreadable.
  static std::optional<Manifest> load(const std::filesystem::path& run_dir);
  static Manifest create(std::string workflow);
  void save(const std::filesystem::path& run_dir);  // atomic

  std::string workflow() const { return data_.at("workflow").get<std::string>(); }
  nlohmann::json& data() { return data_; }
  const nlohmann::json& data() const { return data_; }
  // The record of a step (an empty object if the manifest has none).
  nlohmann::json& step(const std::string& id);
  const nlohmann::json* find_step(const std::string& id) const;

 private:
  nlohmann::json data_;
};

// Why the committed output of a step whose record says it is done cannot be trusted (empty: it
// can): it must open as HDF5, carry the record's step key, have the size recorded when it was
// committed, and each dataset the checksum attribute recorded for it. Reads metadata only;
// `qstage inspect --verify` recomputes the checksums from the data.
std::string output_problem(const std::filesystem::path& output, const nlohmann::json& record);

// Current UTC time as ISO 8601 ("2026-11-21T14:03:07Z").
std::string utc_now();

struct RunDir {
  std::filesystem::path root;
  std::filesystem::path manifest() const { return root / "manifest.json"; }
  std::filesystem::path spec() const { return root / "spec.yaml"; }
  std::filesystem::path output(const std::string& step) const { return root / "outputs" / (step + ".h5"); }
  std::filesystem::path work(const std::string& step) const { return root / "steps" / step; }
  std::filesystem::path logs() const { return root / "logs"; }
};

}  // namespace qstage::runner
