#include "engine/checkpoint_pace.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace qstage::engine {

CheckpointPace::CheckpointPace(std::optional<double> interval, Clock::time_point start) : interval_(interval), last_(start) {}

double CheckpointPace::gap() const {
  if (!interval_ || *interval_ <= 0) return 0;
  return std::max(*interval_, kCommitCostFactor * last_cost_);
}

bool CheckpointPace::due(Clock::time_point now) const {
  return interval_ && std::chrono::duration<double>(now - last_).count() >= gap();
}

void CheckpointPace::committed(Clock::time_point began, Clock::time_point ended) {
  last_cost_ = std::max(0.0, std::chrono::duration<double>(ended - began).count());
  last_ = ended;
  if (!told_ && interval_ && *interval_ > 0 && gap() > *interval_) {
    told_ = true;
    spdlog::info("a checkpoint took {:.1f} s: the next ones come at least {:.0f} s apart (the interval is {:.0f} s), so that "
                 "writing them takes at most a tenth of the run",
                 last_cost_, gap(), *interval_);
  }
}

}  // namespace qstage::engine
