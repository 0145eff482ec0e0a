#pragma once
// When the next checkpoint of a step is due, for the row streamer's commits and a step run's
// alike: the run's interval (--checkpoint-interval) after the last commit, and never sooner than
// kCommitCostFactor times what the last commit took, so that checkpoints take at most a tenth of
// the run's time. (mps.tebd writes its whole state each time: gigabytes at chi 8192, where a
// two-minute interval would spend a large share of the run writing.) An interval of 0 (a commit
// at every chance) is taken as asked: no cap.
#include <chrono>
#include <optional>

namespace qstage::engine {

inline constexpr double kCommitCostFactor = 9;

class CheckpointPace {
 public:
  using Clock = std::chrono::steady_clock;
  // interval: seconds between commits; nullopt never (only on a stop request)
  explicit CheckpointPace(std::optional<double> interval, Clock::time_point start = Clock::now());
  // Whether a commit is due at `now`.
  bool due(Clock::time_point now = Clock::now()) const;
  // A commit that began at `began` (when due() said so) ended at `ended`. The first time the gap
  // grows past the interval, the log says so (info).
  void committed(Clock::time_point began, Clock::time_point ended = Clock::now());
  // Seconds from one commit to the next: the interval, or more where commits cost that much.
  double gap() const;
  double last_commit_seconds() const { return last_cost_; }

 private:
  std::optional<double> interval_;
  Clock::time_point last_;
  double last_cost_ = 0;
  bool told_ = false;
};

}  // namespace qstage::engine
