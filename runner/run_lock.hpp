#pragma once
// One run at a time in a run directory: rank 0 holds an exclusive lock on <run>/run.lock for as
// long as the run lasts. The lock is an open-file-description lock (fcntl F_OFD_SETLK), so the
// kernel releases it when the process dies however it dies (SIGKILL, OOM killer, node reboot of
// an NFS client), and a requeued duplicate job finds the original alive instead of killing it.
#include <filesystem>
#include <optional>
#include <string>

namespace qstage::runner {

class RunDirLock {
 public:
  // Takes the lock of `run_dir` (which must exist), or returns nullopt and sets `holder` to who
  // holds it ("pid 123 on host n17 since 2026-12-02T01:00:00Z"). Where the file system has no
  // locks (some parallel file systems), a warning is logged and the run goes on unlocked.
  static std::optional<RunDirLock> acquire(const std::filesystem::path& run_dir, std::string& holder);
  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();  // releases the lock (closes the file; the file stays)

  static constexpr const char* kFile = "run.lock";

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace qstage::runner
