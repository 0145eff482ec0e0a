#include "backend/backend.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "core/error.hpp"
#include "core/units.hpp"

namespace qstage {

std::string_view backend_name(BackendKind kind) { return kind == BackendKind::cuda ? "cuda" : "cpu"; }

void MemoryBudget::charge(std::uint64_t bytes, std::string_view what) {
  std::lock_guard lock(mutex_);
  const std::uint64_t now = in_use_.load() + bytes;
  if (now > limit_)
    throw BudgetExceeded(fmt::format("{} memory budget exceeded by {}: {} needs {}, {} of {} already in use", name_,
                                     what, format_bytes(static_cast<double>(now - limit_)), format_bytes(bytes),
                                     format_bytes(static_cast<double>(in_use_.load())),
                                     format_bytes(static_cast<double>(limit_))),
                         name_);
  in_use_ = now;
  if (now > peak_) peak_ = now;
  if (now > interval_peak_) interval_peak_ = now;
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

bool cuda_available() {
#ifdef QSTAGE_HAVE_CUDA
  return detail::cuda_device_count() > 0;
#else
  return false;
#endif
}

namespace {

std::uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : (8ull << 30);
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  // Host default: a quarter of RAM for one or two ranks on the host, half of it shared evenly by
  // more (eight ranks that each took a quarter were killed for memory on a 512 GiB host); the cpu
  // "device" default: the same share.
  const std::uint64_t share = physical_memory() / static_cast<std::uint64_t>(std::max(4, 2 * o.local_size));
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
