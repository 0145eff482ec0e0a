#pragma once
// Durable file operations: the commit protocol of every checkpoint and output
// (write under a temporary name, fsync, rename into place, fsync the directory).
#include <filesystem>
#include <future>
#include <string>
#include <string_view>

namespace qstage::fsutil {

namespace fs = std::filesystem;

// Flushes a file's data and metadata to stable storage. Throws RuntimeFailure.
void fsync_file(const fs::path& path);

// Flushes a directory entry table (needed after create/rename/unlink to make them durable).
void fsync_dir(const fs::path& dir);

// Renames `from` to `to` atomically and makes the rename durable (fsyncs `from` first).
void commit_rename(const fs::path& from, const fs::path& to);

// How a write waits for the disk: as the process's durability says (DeferredDurability below),
// or always (a commit point's state, written on a thread of its own while the run goes on).
enum class Sync { as_process, always };

// Replaces `path` with `content` atomically: readers see the old or the new file, never a mix,
// also after a crash at any instant.
void write_file_atomic(const fs::path& path, std::string_view content, Sync sync = Sync::as_process);

// Files replaced atomically and durably on a thread of their own, one at a time in the order
// given: a commit point's state, copied aside, is written while the run goes on. write() first
// waits for the write before it (one in flight: one copy held); wait() returns once everything
// given is on disk and throws what a write threw.
class BackgroundWrites {
 public:
  BackgroundWrites() = default;
  ~BackgroundWrites();  // waits; a failure is dropped here (it may run while an exception unwinds)
  BackgroundWrites(const BackgroundWrites&) = delete;
  BackgroundWrites& operator=(const BackgroundWrites&) = delete;
  void write(fs::path path, std::string content);
  void wait();

 private:
  std::future<void> last_;
};

// Durability at commits, not per pass. While a DeferredDurability is alive, the functions above
// write, rename and replace as always but do not wait for the disk (no fsync): a killed process
// loses nothing by it (its writes are in the kernel's page cache, which the resumed run reads),
// only an operating-system crash can. A commit point then calls sync_tree on the step's work
// directory (every write there durable) and writes the state that names those files under a
// DurableNow, which waits for the disk again. (Process-wide: the runner and the engine do their file work on one thread.)
class DeferredDurability {
 public:
  DeferredDurability();
  ~DeferredDurability();
  DeferredDurability(const DeferredDurability&) = delete;
  DeferredDurability& operator=(const DeferredDurability&) = delete;
};
class DurableNow {
 public:
  DurableNow();
  ~DurableNow();
  DurableNow(const DurableNow&) = delete;
  DurableNow& operator=(const DurableNow&) = delete;

 private:
  int deferred_;
};
bool durability_deferred();
// Makes every file and directory below `root` (and `root`) durable, whatever wrote them: what a
// commit point needs of a step's work directory. Unlike syncfs, it does not wait for the other
// writes on that file system (an input file just written, another job's output). An entry that
// goes while it walks is skipped. Throws RuntimeFailure.
void sync_tree(const fs::path& root);

// Reads a whole file; throws InputError naming it if it cannot be read.
std::string read_file(const fs::path& path);

// Path of the temporary sibling used while `path` is being written.
fs::path temp_path(const fs::path& path);

}  // namespace qstage::fsutil
