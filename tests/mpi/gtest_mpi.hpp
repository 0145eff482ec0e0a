#pragma once
// GoogleTest under mpirun: every rank runs every test; rank 0 prints the report, the others only
// their failures (one line each, so a failure on any rank shows), and all exit with one code.
#include <gtest/gtest.h>

#include <iostream>

#include "core/mpi.hpp"

namespace qstage::test {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::cerr << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
                << result.line_number() << ": " << result.summary() << "\n";
  }

 private:
  int rank_;
};

// The body of main(): MPI up, the tests on every rank, one exit code (failed if any rank failed).
inline int run_all_tests_on_every_rank(int argc, char** argv) {
  qstage::mpi::Session session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const qstage::mpi::Comm world;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (!world.root()) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0;
  return world.any(failed) ? 1 : 0;
}

}  // namespace qstage::test
