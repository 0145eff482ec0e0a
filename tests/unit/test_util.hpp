#pragma once
// Small helpers for the unit tests.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"

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

#define REQUIRE_GPU()                                                                           \
  if (!::qstage::test::gpu_available()) GTEST_SKIP() << "GPU test skipped: no CUDA GPU visible " \
                                                        "(this build or machine has none)"

// A cuda backend and stream for GPU tests, with device copies in and out.
struct GpuRun {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Stream> stream;
  explicit GpuRun(std::uint64_t device_bytes = 1ull << 30)
      : backend(make_backend({"cuda", device_bytes, 1ull << 30, 0})), stream(backend->make_stream(/*with_blas=*/true)) {}
  Buffer upload(const void* data, std::size_t bytes) {
    Buffer b = backend->alloc_device(bytes, "test");
    backend->copy_to_device(b.data(), data, bytes, *stream);
    return b;
  }
  template <typename T>
  std::vector<T> download(const Buffer& b, std::size_t count) {
    std::vector<T> out(count);
    backend->copy_to_host(out.data(), b.data(), count * sizeof(T), *stream);
    stream->synchronize();
    return out;
  }
};

}  // namespace qstage::test
