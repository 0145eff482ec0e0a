#include "runner/run_lock.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "runner/manifest.hpp"

namespace qstage::runner {

namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[256];
  ssize_t n = 0;
  off_t at = 0;
  while ((n = pread(fd, buf, sizeof buf, at)) > 0) {
    text.append(buf, static_cast<size_t>(n));
    at += n;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

std::optional<RunDirLock> RunDirLock::acquire(const std::filesystem::path& run_dir, std::string& holder) {
  const std::filesystem::path path = run_dir / kFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw InputError(fmt::format("cannot create '{}': {}; expected a writable run directory", path.string(),
                                 std::strerror(errno)));
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    const int err = errno;
    if (err == EAGAIN || err == EACCES) {
      holder = read_all(fd);
      if (holder.empty()) holder = "another qstage process";
      ::close(fd);
      return std::nullopt;
    }
    spdlog::warn("cannot lock {} ({}): this file system has no locks; make sure no other qstage runs in this "
                 "directory",
                 path.string(), std::strerror(err));
    return RunDirLock(fd);
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string who = fmt::format("pid {} on host {} since {}\n", getpid(), host, utc_now());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    spdlog::debug("could not record the lock's holder in {}", path.string());
  return RunDirLock(fd);
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace qstage::runner
