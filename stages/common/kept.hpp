#pragma once
// What a step of this process wrote, for the later steps that read it. A workflow's tn.path,
// tn.plan and tn.contract read the network its tn.build step wrote, and tn.contract the plan of
// its tn.plan step; reading them back (one HDF5 dataset per tensor of an 800-gate circuit, a plan
// as JSON text) cost 20-60 ms a step on the GPU hosts, where the contraction takes 25 ms.
//
// An entry is keyed by the step key the runner stamps on every output (kStepKeyAttribute): the
// stage, its parameters and its inputs' hashes, so a key names what its file holds. One entry
// per kind, the last one kept; a reader takes it only if the file it opens carries that key.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "io/h5.hpp"

namespace qstage::stages {

inline constexpr char kStepKeyAttribute[] = "qstage.step_key";

// The step key a step's output carries ("" if none: a file not written by a step).
inline std::string step_key_of(const h5::File& file) {
  return file.has_attribute(kStepKeyAttribute) ? file.string_attribute(kStepKeyAttribute) : std::string();
}

template <typename T>
class Kept {
 public:
  // (shared, never copied: a plan's JSON is some 10^4 values)
  void keep(const std::string& step_key, std::shared_ptr<const T> value) {
    if (step_key.empty()) return;
    const std::lock_guard lock(mutex_);
    entry_.emplace(step_key, std::move(value));
  }
  // The value kept for the step key `file` carries; null if none.
  std::shared_ptr<const T> find(const h5::File& file) const {
    const std::string key = step_key_of(file);
    const std::lock_guard lock(mutex_);
    return key.empty() || !entry_ || entry_->first != key ? nullptr : entry_->second;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<std::pair<std::string, std::shared_ptr<const T>>> entry_;
};

}  // namespace qstage::stages
