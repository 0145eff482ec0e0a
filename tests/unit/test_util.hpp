#pragma once
// Small helpers for the unit tests.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace qstage::test {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("qstage-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

inline void write_text(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// True when a GPU can run the tests' CUDA paths; otherwise the test prints why it skips.
bool gpu_available();

}  // namespace qstage::test
