#pragma once
// Progress of a long step, on rank 0: periodic lines that read well in a SLURM log file
// ("applied tensor.matmul  41.2%  1.65 GB/4.00 GB  820 MB/s  ETA 3.0s"), or a live bar that
// redraws in place when stderr is a terminal.
#include <chrono>
#include <functional>
#include <string>

namespace qstage::runner {

class ProgressReporter {
 public:
  // `unit`: what a row is ("slices", "amplitudes"); progress counts rows in it. Empty: bytes
  // (bytes_per_row each).
  ProgressReporter(std::string label, std::uint64_t total_rows, std::uint64_t bytes_per_row, std::string unit,
                   double flops_total, double interval_seconds, std::function<void(const std::string& json)> save);
  // Rows [0, rows_done) are done (including rows committed by earlier runs).
  void update(std::uint64_t rows_done);
  void finish();

 private:
  std::string line(std::uint64_t rows_done) const;
  std::string label_, unit_;
  std::uint64_t total_, bytes_per_row_, first_ = 0;
  bool started_ = false, tty_ = false, drawn_ = false;
  double flops_, interval_;
  std::function<void(const std::string&)> save_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace qstage::runner
