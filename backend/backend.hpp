#pragma once
// The compute backends behind one interface: `cpu` (OpenBLAS and OpenMP threads) and `cuda`
// (cuBLAS and the kernels in kernels/). A stage never sees which one it runs on: it gets device
// buffers, a Stream, and calls kernels::* functions that dispatch on the stream's kind.
//
// Every allocation is charged to a MemoryBudget (--device-memory, --host-memory), so budgets are
// enforced where memory is taken, and the peak is what qstage reports.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace qstage {

enum class BackendKind { cpu, cuda };
std::string_view backend_name(BackendKind kind);

// A byte budget with a running total and a high-water mark. Thread-safe.
// Memory is in use (charged by its user) or idle (kept by a backend's pool for the next user,
// backend/memory_pool.hpp): both count against the limit; the peak is of memory in use.
class MemoryBudget {
 public:
  MemoryBudget(std::string name, std::uint64_t limit) : name_(std::move(name)), limit_(limit) {}
  // Charges `bytes` for `what`; throws BudgetExceeded (the planner should have prevented it).
  void charge(std::uint64_t bytes, std::string_view what);
  void release(std::uint64_t bytes);
  // A pool's block changing hands: given back (in use -> idle), handed out again (idle -> in use),
  // or freed (idle -> gone).
  void use_to_idle(std::uint64_t bytes);
  void idle_to_use(std::uint64_t bytes);
  void idle_to_none(std::uint64_t bytes);
  std::uint64_t idle() const { return idle_.load(); }
  void reset_peak() { peak_ = in_use_.load(); }
  std::uint64_t limit() const { return limit_; }
  std::uint64_t in_use() const { return in_use_.load(); }
  // What a new charge may still take: the limit less what is in use (idle memory counts as left:
  // the pool frees it for a charge that needs it), 0 when none is.
  std::uint64_t left() const {
    const std::uint64_t used = in_use();
    return limit_ > used ? limit_ - used : 0;
  }
  std::uint64_t peak() const { return peak_.load(); }
  // The high-water mark since the last call (or the budget's start), restarted at what is in use
  // now: a stage reports its phases' peaks with it without disturbing peak(), the step's.
  std::uint64_t take_interval_peak();
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::uint64_t limit_;
  void note_peak();  // (mutex held)
  std::atomic<std::uint64_t> in_use_{0}, idle_{0}, peak_{0}, interval_peak_{0};
  std::mutex mutex_;
};

// A charge to a budget for memory its holder allocates itself (std::vectors, arrays, a library's
// allocator capped at it), released when the hold goes: Backend::hold_host and hold_device.
class BudgetHold {
 public:
  BudgetHold() = default;
  BudgetHold(MemoryBudget& budget, std::uint64_t bytes) : budget_(&budget), bytes_(bytes) {}
  BudgetHold(BudgetHold&& o) noexcept
      : budget_(std::exchange(o.budget_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  BudgetHold& operator=(BudgetHold&& o) noexcept {
    if (this != &o) {
      release();
      budget_ = std::exchange(o.budget_, nullptr), bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  BudgetHold(const BudgetHold&) = delete;
  BudgetHold& operator=(const BudgetHold&) = delete;
  ~BudgetHold() { release(); }
  std::uint64_t bytes() const { return bytes_; }

 private:
  void release() {
    if (budget_) budget_->release(bytes_);
    budget_ = nullptr, bytes_ = 0;
  }
  MemoryBudget* budget_ = nullptr;
  std::uint64_t bytes_ = 0;
};

// Memory owned by a backend (device memory, or pinned host memory), released on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, std::size_t bytes, MemoryBudget* budget, std::function<void(void*)> free)
      : data_(data), bytes_(bytes), budget_(budget), free_(std::move(free)) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void reset();
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryBudget* budget_ = nullptr;
  std::function<void(void*)> free_;
};

// An ordered queue of device work. On `cpu` every call runs at once on the calling thread;
// on `cuda` it is a cudaStream_t with its own cuBLAS handle, and calls are asynchronous.
class Stream {
 public:
  static constexpr int kMarks = 8;
  virtual ~Stream() = default;
  virtual BackendKind kind() const = 0;
  virtual void synchronize() = 0;
  // True if all work enqueued so far has finished (never blocks).
  virtual bool ready() = 0;
  // Records timing mark i (0 <= i < kMarks) at this point of the queue.
  virtual void mark(int i) = 0;
  // Seconds between two marks; valid once the work after both marks has finished.
  virtual double seconds_between(int from, int to) = 0;
  // Ordering across streams: record() marks the work enqueued so far, and wait(point) makes work
  // enqueued later on this stream wait for it. On cpu every call has already run: no-ops.
  using Point = std::shared_ptr<void>;
  virtual Point record() { return nullptr; }
  virtual void wait(const Point& point) {}
  // Native handles for kernels (nullptr on cpu): cudaStream_t and cublasHandle_t.
  virtual void* native() { return nullptr; }
  virtual void* blas_handle() { return nullptr; }
};

namespace detail {
class MemoryPool;
class StreamPool;
}  // namespace detail

class Backend {
 public:
  Backend(std::uint64_t device_limit, std::uint64_t host_limit);
  virtual ~Backend();
  virtual BackendKind kind() const = 0;
  // One line saying what runs the work, e.g. "NVIDIA H100 80GB HBM3 (GPU 0 of 1, sm_90)".
  virtual std::string description() const = 0;
  // Device memory, and host memory for streaming (pinned on cuda, so copies overlap with
  // compute), from the backend's pools (backend/memory_pool.hpp): what an earlier pass gave back
  // is handed out again, charged to the budget like new memory.
  Buffer alloc_device(std::size_t bytes, std::string_view what);
  Buffer alloc_host(std::size_t bytes, std::string_view what);
  // Charges memory its user allocates itself (ordinary host memory standing for the device's on
  // cpu, or for host memory on cuda) to a budget, the pool's idle memory freed first as alloc_*
  // frees it; the user gives it back with the budget's release(). Throws BudgetExceeded.
  void charge_device(std::size_t bytes, std::string_view what);
  void charge_host(std::size_t bytes, std::string_view what);
  // The same, given back when the returned hold goes.
  [[nodiscard]] BudgetHold hold_device(std::size_t bytes, std::string_view what);
  [[nodiscard]] BudgetHold hold_host(std::size_t bytes, std::string_view what);
  // A stream; with_blas also gives it a BLAS handle (and, on cuda, a budgeted cuBLAS workspace).
  // Pooled like memory.
  std::unique_ptr<Stream> make_stream(bool with_blas = false);
  // Frees the pools' idle memory and streams (the runner, before each step: a step's passes
  // share what the pools keep, steps do not).
  void release_idle();
  // How many device and host allocations the pools served, and how many from idle memory.
  struct PoolCounts {
    std::uint64_t device_taken = 0, device_reused = 0, host_taken = 0, host_reused = 0;
  };
  PoolCounts pool_counts() const;
  // Copies between host and device memory, queued on `stream`; each counts its bytes (what
  // crossed the bus: a stage or pass reports it against the bus's rate).
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream& stream) {
    bytes_to_device_ += bytes;
    copy_to_device_impl(dst, src, bytes, stream);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream& stream) {
    bytes_to_host_ += bytes;
    copy_to_host_impl(dst, src, bytes, stream);
  }
  std::uint64_t bytes_to_device() const { return bytes_to_device_.load(); }
  std::uint64_t bytes_to_host() const { return bytes_to_host_.load(); }
  virtual void copy_on_device(void* dst, const void* src, std::size_t bytes, Stream& stream) = 0;
  // Device memory a Stream made with_blas takes from the device budget (cuBLAS workspace on cuda).
  virtual std::uint64_t blas_stream_bytes() const { return 0; }
  // Makes this backend's device current on the calling thread (CUDA's current device is per thread).
  virtual void bind_thread() {}
  // The CUDA device number of the backend's GPU (what libraries that bring their own CUDA code,
  // LibTorch say, are told to use); -1 for the CPU.
  virtual int cuda_device() const { return -1; }
  // The PCI bus id of the backend's device ("0000:3B:00.0"); empty for the CPU.
  virtual std::string pci_bus_id() const { return {}; }
  MemoryBudget& device_budget() { return device_budget_; }
  MemoryBudget& host_budget() { return host_budget_; }

 protected:
  // The driver's allocations: Buffers charged to no budget (the pools charge them) that free
  // themselves without the backend (a pool may outlive it). Throw RuntimeFailure when the driver
  // refuses.
  virtual Buffer allocate_device(std::size_t bytes, std::string_view what) = 0;
  virtual Buffer allocate_host(std::size_t bytes, std::string_view what) = 0;
  virtual std::unique_ptr<Stream> new_stream(bool with_blas) = 0;
  // Runs on a stream as the pool lends it out and as it comes back (cuda: a BLAS stream's workspace).
  virtual void lend_stream(Stream& stream, bool with_blas) {}
  virtual void keep_stream(Stream& stream, bool with_blas) {}
  // Waits until the device has finished the work queued so far (before reused memory is handed out).
  virtual void quiesce() {}
  virtual void copy_to_device_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) = 0;
  virtual void copy_to_host_impl(void* dst, const void* src, std::size_t bytes, Stream& stream) = 0;
  MemoryBudget device_budget_, host_budget_;

 private:
  std::atomic<std::uint64_t> bytes_to_device_{0}, bytes_to_host_{0};
  // Made on first use (the raw allocations are virtual: not callable from the constructor).
  detail::MemoryPool& device_pool();
  detail::MemoryPool& host_pool();
  detail::StreamPool& stream_pool();
  std::once_flag pools_made_;
  std::unique_ptr<detail::MemoryPool> device_pool_, host_pool_;
  std::unique_ptr<detail::StreamPool> stream_pool_;
  void make_pools();
};

struct BackendOptions {
  std::string device = "auto";   // auto | cuda | cpu
  std::uint64_t device_memory = 0;  // 0: the default for the backend
  std::uint64_t host_memory = 0;    // 0: the default
  int local_rank = 0;               // picks the GPU: local_rank % number of GPUs
  int local_size = 1;               // ranks on this host: the default host budget is a share of it
  int gpu_sharing = 1;              // ranks using this rank's GPU: its default device budget is a share of it
  bool bind = true;                 // bind the rank to the cores and memory nearest its GPU (core/affinity.hpp)
};

// Builds the backend the options ask for. `auto` picks cuda when this build has it and a GPU is
// visible. Throws InputError for `cuda` without a GPU or CUDA support.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

// True if this build includes the CUDA backend and at least one GPU is visible.
bool cuda_available();

namespace detail {
std::unique_ptr<Backend> make_cpu_backend(std::uint64_t device_limit, std::uint64_t host_limit);
#ifdef QSTAGE_HAVE_CUDA
// device_limit 0: 90 % of the GPU's free memory, split evenly between the `gpu_sharing` ranks using it.
std::unique_ptr<Backend> make_cuda_backend(std::uint64_t device_limit, std::uint64_t host_limit, int local_rank,
                                           int gpu_sharing);
int cuda_device_count();
#endif
}  // namespace detail

}  // namespace qstage
