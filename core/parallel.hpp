#pragma once
// Exceptions out of OpenMP regions. An exception that escapes an OpenMP region ends the program
// (std::terminate: SIGABRT and a backtrace instead of the error's message and exit code), so
// every region whose iterations can throw (an InputError, a failed LAPACK call, std::bad_alloc)
// runs them through a FirstFailure, which keeps the first exception and rethrows it once the
// region is over (the other iterations still run).
#include <cstdint>
#include <exception>
#include <mutex>

namespace qstage {

class FirstFailure {
 public:
  // Inside the region: runs body(), keeping what it throws if nothing was kept before.
  template <typename Body>
  void run(Body&& body) noexcept {
    try {
      body();
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!first_) first_ = std::current_exception();
    }
  }
  // After the region: the first exception kept (null if none), or rethrow it.
  std::exception_ptr first() const { return first_; }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
};

// A loop over independent items on the OpenMP threads that lets exceptions out.
template <typename Body>
void parallel_for(std::int64_t count, Body&& body) {
  FirstFailure failure;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < count; ++i) failure.run([&] { body(i); });
  failure.rethrow();
}

// [0, n) in pieces of `piece` (the last shorter), body(begin, end) for each on the threads.
template <typename Body>
void parallel_for_pieces(std::uint64_t n, std::uint64_t piece, Body&& body) {
  parallel_for(static_cast<std::int64_t>((n + piece - 1) / piece), [&](std::int64_t i) {
    const std::uint64_t begin = static_cast<std::uint64_t>(i) * piece;
    body(begin, begin + piece < n ? begin + piece : n);
  });
}

}  // namespace qstage
