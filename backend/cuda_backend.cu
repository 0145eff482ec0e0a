// The cuda backend: one GPU per rank (local rank modulo the GPUs on the host), device memory
// from cudaMalloc, pinned host memory from cudaHostAlloc (large buffers: registered huge pages),
// one cudaStream_t and one cuBLAS handle (with a budgeted workspace) per Stream.
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "backend/cuda_check.hpp"

namespace qstage::detail {

void throw_cuda_error(const char* call, const char* file, int line, const char* text) {
  throw RuntimeFailure(fmt::format("CUDA call {} failed at {}:{}: {}", call, file, line, text));
}

namespace {

// cuBLAS's workspace per BLAS stream. NVIDIA recommends 32 MiB on Hopper for split-K kernels;
// the large GEMMs qstage streams need none, and qstage_bench measures GEMM rates with this size.
constexpr std::size_t kCublasWorkspace = 8u << 20;

class CudaStream final : public Stream {
 public:
  // Without BLAS the stream has no cuBLAS handle (blas_handle() returns nullptr).
  explicit CudaStream(bool with_blas) {
    QSTAGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (with_blas) {
      QSTAGE_CUDA_CHECK(cublasCreate(&blas_));
      QSTAGE_CUDA_CHECK(cublasSetStream(blas_, stream_));
    }
    for (auto& e : marks_) QSTAGE_CUDA_CHECK(cudaEventCreate(&e));
  }
  // The cuBLAS handle's workspace (set before the stream is used for BLAS; an empty Buffer
  // while the stream is idle in the pool, which then runs nothing).
  void set_workspace(Buffer workspace) {
    if (workspace.data()) QSTAGE_CUDA_CHECK(cublasSetWorkspace(blas_, workspace.data(), workspace.size()));
    workspace_ = std::move(workspace);
  }
  ~CudaStream() override {
    for (auto& e : marks_) cudaEventDestroy(e);
    if (blas_) cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  BackendKind kind() const override { return BackendKind::cuda; }
  void synchronize() override { QSTAGE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  bool ready() override {
    cudaError_t rc = cudaStreamQuery(stream_);
    if (rc == cudaErrorNotReady) return false;
    QSTAGE_CUDA_CHECK(rc);
    return true;
  }
  void mark(int i) override { QSTAGE_CUDA_CHECK(cudaEventRecord(marks_[i], stream_)); }
  double seconds_between(int from, int to) override {
    float ms = 0;
    QSTAGE_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[from], marks_[to]));
    return ms * 1e-3;
  }
  Point record() override {
    cudaEvent_t e{};
    QSTAGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    QSTAGE_CUDA_CHECK(cudaEventRecord(e, stream_));
    return Point(static_cast<void*>(e), [](void* x) { cudaEventDestroy(static_cast<cudaEvent_t>(x)); });
  }
  void wait(const Point& point) override {
    if (point) QSTAGE_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(point.get()), 0));
  }
  void* native() override { return stream_; }
  void* blas_handle() override { return blas_; }

 private:
  Buffer workspace_;
  cudaStream_t stream_{};
  cublasHandle_t blas_ = nullptr;
  cudaEvent_t marks_[kMarks]{};
};

// Large pinned buffers (the out-of-core host arena) come from anonymous memory advised to use
// transparent huge pages, first touched by several threads (the kernel zeroes the pages on
// those faults, in parallel), then registered. On an H200 host, 2.2 GiB took 0.11 s this way
// with 16 threads, 0.37 s registered untouched and 0.83 s with cudaHostAlloc (0.05 s against
// 0.19 s to free), with the same 55 GB/s of copies.
constexpr std::size_t kHugePinnedBytes = 64u << 20;

void touch_pages_in_parallel(char* p, std::size_t bytes) {
  constexpr std::size_t kPage = 4096;
  const std::size_t threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 16);
  const std::size_t share = (bytes / kPage + threads - 1) / threads * kPage;
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t)
    workers.emplace_back([=] {
      for (std::size_t o = t * share; o < std::min(bytes, (t + 1) * share); o += kPage) p[o] = 0;
    });
  for (auto& w : workers) w.join();
}

// nullptr where the kernel or the driver refuses (the caller then uses cudaHostAlloc).
void* pinned_huge_pages(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without transparent huge pages, 4 KiB pages
  touch_pages_in_parallel(static_cast<char*>(p), bytes);
  if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
    cudaGetLastError();
    munmap(p, bytes);
    return nullptr;
  }
  return p;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::uint64_t device_limit, std::uint64_t host_limit, int device)
      : Backend(device_limit, host_limit), device_(device) {
    QSTAGE_CUDA_CHECK(cudaSetDevice(device_));
    QSTAGE_CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
    QSTAGE_CUDA_CHECK(cudaGetDeviceCount(&count_));
  }
  BackendKind kind() const override { return BackendKind::cuda; }
  std::string description() const override {
    return fmt::format("{} (GPU {} of {}, sm_{}{}, {})", props_.name, device_, count_, props_.major, props_.minor,
                       format_bytes(static_cast<double>(props_.totalGlobalMem)));
  }
  std::uint64_t blas_stream_bytes() const override { return kCublasWorkspace; }
  void bind_thread() override { QSTAGE_CUDA_CHECK(cudaSetDevice(device_)); }
  int cuda_device() const override { return device_; }
  std::string pci_bus_id() const override {
    char id[32] = {};
    QSTAGE_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof(id), device_));
    return id;
  }

 protected:
  // (Charged by the backend's pools, not here.)
  Buffer allocate_device(std::size_t bytes, std::string_view what) override {
    void* p = nullptr;
    cudaError_t rc = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw RuntimeFailure(fmt::format("cudaMalloc of {} for {} failed: {} (lower --device-memory?)",
                                       format_bytes(bytes), what, cudaGetErrorString(rc)));
    }
    return Buffer(p, bytes, nullptr, [](void* q) { cudaFree(q); });
  }
  Buffer allocate_host(std::size_t bytes, std::string_view what) override {
    if (bytes >= kHugePinnedBytes)
      if (void* p = pinned_huge_pages(bytes)) return Buffer(p, bytes, nullptr, [bytes](void* q) {
          cudaHostUnregister(q);
          munmap(q, bytes);
        });
    void* p = nullptr;
    cudaError_t rc = cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocDefault);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      throw RuntimeFailure(fmt::format("cudaHostAlloc of {} for {} failed: {}", format_bytes(bytes), what,
                                       cudaGetErrorString(rc)));
    }
    return Buffer(p, bytes, nullptr, [](void* q) { cudaFreeHost(q); });
  }
  std::unique_ptr<Stream> new_stream(bool with_blas) override { return std::make_unique<CudaStream>(with_blas); }
  // A BLAS stream's workspace is its user's: taken from the device pool as the stream is lent,
  // given back with it (an idle stream holds no budgeted memory).
  void lend_stream(Stream& s, bool with_blas) override {
    if (with_blas) static_cast<CudaStream&>(s).set_workspace(alloc_device(kCublasWorkspace, "cuBLAS workspace"));
  }
  void keep_stream(Stream& s, bool with_blas) override {
    if (with_blas) static_cast<CudaStream&>(s).set_workspace(Buffer());
  }
  void quiesce() override { QSTAGE_CUDA_CHECK(cudaDeviceSynchronize()); }
  void copy_to_device_impl(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s.native())));
  }
  void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s.native())));
  }
  void copy_to_host_impl(void* dst, const void* src, std::size_t bytes, Stream& s) override {
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s.native())));
  }

 private:
  int device_ = 0, count_ = 0;
  cudaDeviceProp props_{};
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(std::uint64_t device_limit, std::uint64_t host_limit, int local_rank,
                                           int gpu_sharing) {
  const int gpus = cuda_device_count(), device = local_rank % gpus;
  QSTAGE_CUDA_CHECK(cudaSetDevice(device));
  if (device_limit == 0) {
    // Default: 90% of what is free now (the CUDA context and other processes keep the rest),
    // shared by the ranks on this GPU (every rank sees the whole of it free at start).
    std::size_t free = 0, total = 0;
    QSTAGE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    device_limit = free / 10 * 9 / static_cast<std::uint64_t>(std::max(gpu_sharing, 1));
  }
  return std::make_unique<CudaBackend>(device_limit, host_limit, device);
}

}  // namespace qstage::detail
