#pragma once
// Error types and the exit codes they map to. Every user-facing failure is one of these,
// so the CLI can turn it into a one-line message and a documented exit code.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace qstage {

enum ExitCode : int {
  kExitDone = 0,      // all steps done
  kExitInternal = 1,  // a bug or an environment failure (I/O error, CUDA error, MPI error)
  kExitBadInput = 2,  // the spec, a file, a dataset or a parameter is wrong; nothing was changed
  kExitCheckFailed = 3,  // a check step (tensor.compare) found results outside its tolerance
  kExitStopped = 75,  // stopped early on SIGTERM/SIGINT after committing progress: resumable
};

// Bad input from the user (spec, file, dataset, parameter, budget). Exit code 2.
// The message names the thing that is wrong and what was expected.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A check step's results are outside its tolerance. Exit code 3; the step is not committed,
// the steps before it are.
class CheckFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A stop was requested (signal) and all progress up to the last batch boundary is committed.
class StopRequested : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input that only one rank meets, in the middle of work the other ranks do with it (they wait
// in a collective and cannot be told): exit code 2 like InputError, and under MPI the job is
// aborted with that code.
class RankInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An input's content is bad where only one rank can see it, while reading it: a corrupted
// compressed chunk.
class CorruptInput : public RankInputError {
 public:
  using RankInputError::RankInputError;
};

// The environment failed underneath us (file system, device, MPI). Exit code 1.
class RuntimeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A memory budget (--device-memory, --host-memory) could not take an allocation: a RuntimeFailure
// unless the caller can do the work in less memory (mps.tebd then runs its updates one at a time)
// or tell the user which budget the work needs (InputError).
class BudgetExceeded : public RuntimeFailure {
 public:
  // budget: the MemoryBudget that refused ("device" or "host"), empty where a caller's estimate did
  explicit BudgetExceeded(const std::string& what, std::string budget = {})
      : RuntimeFailure(what), budget_(std::move(budget)) {}
  const std::string& budget() const { return budget_; }

 private:
  std::string budget_;
};

}  // namespace qstage
