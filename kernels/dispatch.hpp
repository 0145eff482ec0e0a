#pragma once
// Runs a kernel's CUDA version on a cuda stream and its CPU twin otherwise. A macro rather than
// a function so builds without CUDA never reference the (absent) CUDA symbols.
#include <stdexcept>

#include "backend/backend.hpp"

#ifdef QSTAGE_HAVE_CUDA
#define QSTAGE_DISPATCH(stream, cpu_call, cuda_call)      \
  do {                                                    \
    if ((stream).kind() == ::qstage::BackendKind::cuda) { \
      cuda_call;                                          \
    } else {                                              \
      cpu_call;                                           \
    }                                                     \
  } while (0)
#else
#define QSTAGE_DISPATCH(stream, cpu_call, cuda_call)                              \
  do {                                                                            \
    if ((stream).kind() == ::qstage::BackendKind::cuda)                           \
      throw std::logic_error("a cuda stream reached a build without CUDA support"); \
    cpu_call;                                                                     \
  } while (0)
#endif
