#include "core/fsutil.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace qstage::fsutil {
namespace {

[[noreturn]] void fail(std::string_view what, const fs::path& path) {
  throw RuntimeFailure(fmt::format("{} '{}': {}", what, path.string(), std::strerror(errno)));
}

void fsync_fd_of(const fs::path& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail("cannot open for fsync", path);
  if (::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    fail("fsync failed for", path);
  }
  ::close(fd);
}

}  // namespace

void fsync_file(const fs::path& path) { fsync_fd_of(path, O_RDONLY); }

void fsync_dir(const fs::path& dir) { fsync_fd_of(dir.empty() ? fs::path(".") : dir, O_RDONLY | O_DIRECTORY); }

void commit_rename(const fs::path& from, const fs::path& to) {
  fsync_file(from);
  if (::rename(from.c_str(), to.c_str()) != 0) fail(fmt::format("cannot rename '{}' to", from.string()), to);
  fsync_dir(to.parent_path());
}

fs::path temp_path(const fs::path& path) { return fs::path(path.string() + ".tmp"); }

void write_file_atomic(const fs::path& path, std::string_view content) {
  const fs::path tmp = temp_path(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", tmp);
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      errno = saved;
      fail("cannot write", tmp);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    fail("fsync failed for", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(fmt::format("cannot rename '{}' to", tmp.string()), path);
  fsync_dir(path.parent_path());
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace qstage::fsutil
