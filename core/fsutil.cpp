#include "core/fsutil.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.hpp"

namespace qstage::fsutil {
namespace {

std::atomic<int> deferred_depth{0};

[[noreturn]] void fail(std::string_view what, const fs::path& path) {
  throw RuntimeFailure(fmt::format("{} '{}': {}", what, path.string(), std::strerror(errno)));
}

// Opens `path` and runs `call` (fsync, syncfs) on it; throws naming `what` on failure.
void call_on_fd_of(const fs::path& path, int flags, int (*call)(int), std::string_view what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail(fmt::format("cannot open for {}", what), path);
  if (call(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    fail(fmt::format("{} failed for", what), path);
  }
  ::close(fd);
}

void fsync_fd_of(const fs::path& path, int flags, Sync sync = Sync::as_process) {
  if (sync == Sync::always || !durability_deferred()) call_on_fd_of(path, flags, ::fsync, "fsync");
}

void fsync_dir(const fs::path& dir, Sync sync) {
  fsync_fd_of(dir.empty() ? fs::path(".") : dir, O_RDONLY | O_DIRECTORY, sync);
}

}  // namespace

void fsync_file(const fs::path& path) { fsync_fd_of(path, O_RDONLY); }

void fsync_dir(const fs::path& dir) { fsync_dir(dir, Sync::as_process); }

void commit_rename(const fs::path& from, const fs::path& to) {
  fsync_file(from);
  if (::rename(from.c_str(), to.c_str()) != 0) fail(fmt::format("cannot rename '{}' to", from.string()), to);
  fsync_dir(to.parent_path());
}

DeferredDurability::DeferredDurability() { deferred_depth += 1; }
DeferredDurability::~DeferredDurability() { deferred_depth -= 1; }
DurableNow::DurableNow() : deferred_(deferred_depth.exchange(0)) {}
DurableNow::~DurableNow() { deferred_depth += deferred_; }
bool durability_deferred() { return deferred_depth.load() > 0; }

void sync_tree(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return;
  auto sync = [](const fs::path& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return;  // (gone while we walked)
      fail("cannot open for fsync", path);
    }
    if (::fsync(fd) != 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      fail("fsync failed for", path);
    }
    ::close(fd);
  };
  // Files first, then their directories (their entries name the files), the root last.
  std::vector<fs::path> dirs;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    const auto status = it->symlink_status(type_ec);
    if (type_ec) continue;
    if (fs::is_directory(status)) dirs.push_back(it->path());
    else if (fs::is_regular_file(status)) sync(it->path(), O_RDONLY);
  }
  for (auto d = dirs.rbegin(); d != dirs.rend(); ++d) sync(*d, O_RDONLY | O_DIRECTORY);
  sync(root, O_RDONLY | O_DIRECTORY);
}

fs::path temp_path(const fs::path& path) { return fs::path(path.string() + ".tmp"); }

void write_file_atomic(const fs::path& path, std::string_view content, Sync sync) {
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
  if ((sync == Sync::always || !durability_deferred()) && ::fsync(fd) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    fail("fsync failed for", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(fmt::format("cannot rename '{}' to", tmp.string()), path);
  fsync_dir(path.parent_path(), sync);
}

BackgroundWrites::~BackgroundWrites() {
  try {
    wait();
  } catch (...) {
  }
}

void BackgroundWrites::write(fs::path path, std::string content) {
  wait();
  last_ = std::async(std::launch::async, [path = std::move(path), content = std::move(content)] {
    write_file_atomic(path, content, Sync::always);
  });
}

void BackgroundWrites::wait() {
  if (!last_.valid()) return;
  std::future<void> last = std::move(last_);
  last.get();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace qstage::fsutil
