// The cpu backend: "device" memory is ordinary host memory charged to the device budget, copies
// are memcpy, and work runs on the calling thread (kernels use OpenMP, GEMMs OpenBLAS threads).
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/units.hpp"

namespace qstage::detail {
namespace {

class CpuStream final : public Stream {
 public:
  BackendKind kind() const override { return BackendKind::cpu; }
  void synchronize() override {}
  bool ready() override { return true; }
  void mark(int i) override { marks_[i] = std::chrono::steady_clock::now(); }
  double seconds_between(int from, int to) override {
    return std::chrono::duration<double>(marks_[to] - marks_[from]).count();
  }

 private:
  std::chrono::steady_clock::time_point marks_[kMarks]{};
};

// (Charged by the backend's pools, not here.)
Buffer aligned(std::size_t bytes, std::string_view what) {
  const std::size_t rounded = ((bytes + 63) / 64) * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p)
    throw RuntimeFailure(fmt::format("out of host memory allocating {} for {}", format_bytes(bytes), what));
  return Buffer(p, bytes, nullptr, [](void* q) { std::free(q); });
}

class CpuBackend final : public Backend {
 public:
  using Backend::Backend;
  BackendKind kind() const override { return BackendKind::cpu; }
  std::string description() const override {
    return fmt::format("CPU ({} threads, {})", omp_get_max_threads(), openblas_get_config());
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream&) override { copy(dst, src, bytes); }

 protected:
  Buffer allocate_device(std::size_t bytes, std::string_view what) override { return aligned(bytes, what); }
  Buffer allocate_host(std::size_t bytes, std::string_view what) override { return aligned(bytes, what); }
  std::unique_ptr<Stream> new_stream(bool) override { return std::make_unique<CpuStream>(); }
  void copy_to_device_impl(void* dst, const void* src, std::size_t bytes, Stream&) override { copy(dst, src, bytes); }
  void copy_to_host_impl(void* dst, const void* src, std::size_t bytes, Stream&) override { copy(dst, src, bytes); }

 private:
  // Large copies in parallel pieces: one thread's memcpy reaches only a fraction of memory bandwidth.
  static void copy(void* dst, const void* src, std::size_t bytes) {
    constexpr std::size_t piece = 4 << 20;
    const auto pieces = static_cast<std::int64_t>((bytes + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (std::int64_t i = 0; i < pieces; ++i) {
      const std::size_t off = static_cast<std::size_t>(i) * piece;
      std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(piece, bytes - off));
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::uint64_t device_limit, std::uint64_t host_limit) {
  return std::make_unique<CpuBackend>(device_limit, host_limit);
}

}  // namespace qstage::detail
