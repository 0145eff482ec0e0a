#pragma once
// Gather with permutation: out (row-major over `dims`) takes in[base + sum_j idx_j * stride_j].
// This stages a network's input tensor in its planned layout with its sliced modes fixed (the
// only transposes a plan has).
#include <cstdint>

#include "backend/backend.hpp"
#include "core/dtype.hpp"

namespace qstage::kernels {

constexpr int kMaxRank = 64;

struct GatherPermute {
  DType dtype = DType::complex64;  // any type; only its size matters
  const void* in = nullptr;                // device memory
  void* out = nullptr;                     // device memory
  int rank = 0;
  std::int64_t dims[kMaxRank] = {};        // out's extents, row-major
  std::int64_t strides[kMaxRank] = {};     // in's stride (elements) for each out dimension
  std::int64_t base = 0;                   // in's offset (elements) of the fixed (sliced) indices
};

// The same gather with fewer digits per element: extent-1 dimensions dropped, and neighbours
// merged where `in` holds them contiguously too (a packed step's copy of a 27-mode tensor often
// has only a few runs). Both backends call it; the bytes moved do not change.
GatherPermute merged(const GatherPermute& args);

void gather_permute(Stream& stream, const GatherPermute& args);
void gather_permute_cpu(const GatherPermute& args);

namespace detail {
void gather_permute_cuda(void* cuda_stream, const GatherPermute& args);
}

}  // namespace qstage::kernels
