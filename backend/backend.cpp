#include "backend/backend.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "backend/memory_pool.hpp"
#include "core/affinity.hpp"
#include "core/error.hpp"
#include "core/units.hpp"

namespace qstage {

std::string_view backend_name(BackendKind kind) { return kind == BackendKind::cuda ? "cuda" : "cpu"; }

void MemoryBudget::charge(std::uint64_t bytes, std::string_view what) {
  std::lock_guard lock(mutex_);
  const std::uint64_t held = in_use_.load() + idle_.load() + bytes;
  if (held > limit_)
    throw BudgetExceeded(fmt::format("{} memory budget exceeded by {}: {} needs {}, {} of {} already in use", name_,
                                     what, format_bytes(static_cast<double>(held - limit_)), format_bytes(bytes),
                                     format_bytes(static_cast<double>(in_use_.load() + idle_.load())),
                                     format_bytes(static_cast<double>(limit_))),
                         name_);
  in_use_ += bytes;
  note_peak();
}

void MemoryBudget::note_peak() {
  const std::uint64_t now = in_use_.load();
  if (now > peak_) peak_ = now;
  if (now > interval_peak_) interval_peak_ = now;
}

void MemoryBudget::use_to_idle(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  in_use_ -= bytes;
  idle_ += bytes;
}

void MemoryBudget::idle_to_use(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  idle_ -= bytes;
  in_use_ += bytes;
  note_peak();
}

void MemoryBudget::idle_to_none(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  idle_ -= bytes;
}

std::uint64_t MemoryBudget::take_interval_peak() {
  std::lock_guard lock(mutex_);
  const std::uint64_t peak = interval_peak_.load();
  interval_peak_ = in_use_.load();
  return peak;
}

void MemoryBudget::release(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  in_use_ -= bytes;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    budget_ = o.budget_;
    free_ = std::move(o.free_);
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.budget_ = nullptr;
  }
  return *this;
}

void Buffer::reset() {
  if (data_ && free_) free_(data_);
  if (budget_) budget_->release(bytes_);
  data_ = nullptr;
  bytes_ = 0;
  budget_ = nullptr;
}

Backend::Backend(std::uint64_t device_limit, std::uint64_t host_limit)
    : device_budget_("device", device_limit), host_budget_("host", host_limit) {}

Backend::~Backend() = default;

void Backend::make_pools() {
  std::call_once(pools_made_, [this] {
    device_pool_ = std::make_unique<detail::MemoryPool>(
        device_budget_, [this](std::size_t bytes, std::string_view what) { return allocate_device(bytes, what); },
        [this] { quiesce(); });
    host_pool_ = std::make_unique<detail::MemoryPool>(
        host_budget_, [this](std::size_t bytes, std::string_view what) { return allocate_host(bytes, what); },
        [this] { quiesce(); });
    stream_pool_ = std::make_unique<detail::StreamPool>(
        [this](bool blas) { return new_stream(blas); }, [this](Stream& s, bool blas) { lend_stream(s, blas); },
        [this](Stream& s, bool blas) { keep_stream(s, blas); });
  });
}

detail::MemoryPool& Backend::device_pool() {
  make_pools();
  return *device_pool_;
}

detail::MemoryPool& Backend::host_pool() {
  make_pools();
  return *host_pool_;
}

detail::StreamPool& Backend::stream_pool() {
  make_pools();
  return *stream_pool_;
}

Buffer Backend::alloc_device(std::size_t bytes, std::string_view what) { return device_pool().take(bytes, what); }
Buffer Backend::alloc_host(std::size_t bytes, std::string_view what) { return host_pool().take(bytes, what); }

void Backend::charge_device(std::size_t bytes, std::string_view what) {
  device_pool().make_room(bytes);
  device_budget_.charge(bytes, what);
}

void Backend::charge_host(std::size_t bytes, std::string_view what) {
  host_pool().make_room(bytes);
  host_budget_.charge(bytes, what);
}
BudgetHold Backend::hold_device(std::size_t bytes, std::string_view what) {
  charge_device(bytes, what);
  return BudgetHold(device_budget_, bytes);
}

BudgetHold Backend::hold_host(std::size_t bytes, std::string_view what) {
  charge_host(bytes, what);
  return BudgetHold(host_budget_, bytes);
}
std::unique_ptr<Stream> Backend::make_stream(bool with_blas) { return stream_pool().take(with_blas); }

void Backend::release_idle() {
  stream_pool().release_idle();
  device_pool().release_idle();
  host_pool().release_idle();
}

Backend::PoolCounts Backend::pool_counts() const {
  PoolCounts c;
  if (device_pool_) {
    const auto d = device_pool_->counters(), h = host_pool_->counters();
    c = {d.taken, d.reused, h.taken, h.reused};
  }
  return c;
}

bool cuda_available() {
#ifdef QSTAGE_HAVE_CUDA
  return detail::cuda_device_count() > 0;
#else
  return false;
#endif
}

namespace {

// The memory this process may use: the host's RAM, or less where its cgroup says so (a SLURM job
// on a shared node gets its --mem, not the node's RAM: budgets from the node's would be killed for
// memory by the job's limit, without a word).
std::uint64_t usable_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const std::uint64_t ram =
      pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : (8ull << 30);
  return std::min(ram, affinity::cgroup_memory_limit().value_or(ram));
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  // Host default: a quarter of RAM (usable_memory) for one or two ranks on the host, half of it shared evenly by
  // more (eight ranks that each took a quarter were killed for memory on a 512 GiB host); the cpu
  // "device" default: the same share.
  const std::uint64_t share = usable_memory() / static_cast<std::uint64_t>(std::max(4, 2 * o.local_size));
  const std::uint64_t host = o.host_memory ? o.host_memory : share;
  if (o.device == "cpu") return detail::make_cpu_backend(o.device_memory ? o.device_memory : share, host);
  if (o.device != "auto" && o.device != "cuda")
    throw InputError(fmt::format("--device: unknown device '{}'; expected auto, cuda or cpu", o.device));
#ifdef QSTAGE_HAVE_CUDA
  if (detail::cuda_device_count() > 0) return detail::make_cuda_backend(o.device_memory, host, o.local_rank, o.gpu_sharing);
  if (o.device == "cuda") throw InputError("--device cuda: no CUDA GPU is visible to this process; use --device cpu");
#else
  if (o.device == "cuda")
    throw InputError("--device cuda: this qstage was built without CUDA (-DQSTAGE_CUDA=OFF or no nvcc); use --device cpu");
#endif
  return detail::make_cpu_backend(o.device_memory ? o.device_memory : share, host);
}

}  // namespace qstage
