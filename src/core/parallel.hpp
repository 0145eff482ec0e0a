#pragma once
// A loop over independent items on the OpenMP threads that lets exceptions out: an exception
// escaping an OpenMP region ends the program, so each item's is caught and the first one is
// rethrown after the loop (the other items still run).
#include <cstdint>
#include <exception>
#include <mutex>

namespace qstage {

template <typename Body>
void parallel_for(std::int64_t count, Body&& body) {
  std::exception_ptr failure;
  std::mutex failure_mutex;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < count; ++i) {
    try {
      body(i);
    } catch (...) {
      const std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace qstage
