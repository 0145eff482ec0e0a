#pragma once
// Wall-clock seconds for logs and metrics: since the start, or since the last lap.
#include <chrono>

namespace qstage {

class Stopwatch {
 public:
  using clock = std::chrono::steady_clock;
  Stopwatch() : start_(clock::now()), lap_(start_) {}
  // Seconds since the start.
  double seconds() const { return std::chrono::duration<double>(clock::now() - start_).count(); }
  // Seconds since the last lap (or the start), and a new lap from now.
  double lap() {
    const clock::time_point now = clock::now();
    const double s = std::chrono::duration<double>(now - lap_).count();
    lap_ = now;
    return s;
  }

 private:
  clock::time_point start_, lap_;
};

}  // namespace qstage
