#pragma once
// Davidson's vector arithmetic (stages/sci/davidson.cpp) on either backend, with one set of bits.
//
// Every dot product has one fixed shape: blocks of kFixedSumBlock entries, each block summed in
// eight lanes (entry i of a block in lane i % 8, each lane in entry order, the lanes then added
// pairwise), and the blocks' sums added in block order by fold. Every other step is entry by
// entry. So the bits depend on the vectors only: not on the threads, and not on the backend (the
// CUDA file is compiled without fused multiply-adds, CMakeLists.txt: every product and sum rounds
// as on the host).
//
// A dot product writes one partial sum a block into the workspace; fold adds them into its sums.
// Nothing here synchronizes: a scalar one step needs from another (Gram-Schmidt's coefficient, a
// norm) is read where the earlier step wrote it, in the memory of the stream's backend.
#include <cstdint>

#include "backend/backend.hpp"
#include "core/hd.hpp"

namespace qstage::kernels {

constexpr std::uint64_t kFixedSumBlock = 4096;
QSTAGE_HD std::uint64_t fixed_sum_blocks(std::uint64_t n) { return (n + kFixedSumBlock - 1) / kFixedSumBlock; }

// sums[k] = a_k . b_k for k < count, where a_k = a + k * a_step (a step of 0: the same vector
// each time) and b_k likewise. partials: count * fixed_sum_blocks(n) doubles.
struct FixedDots {
  const double* a = nullptr;
  std::uint64_t a_step = 0;
  const double* b = nullptr;
  std::uint64_t b_step = 0;
  int count = 0;
  std::uint64_t n = 0;
  double* partials = nullptr;
  double* sums = nullptr;
};

// One step of modified Gram-Schmidt swept together with the next dot product: t -= (*d) b (none
// when b is null), then *sum = c . t over the updated t (c may be t itself: its norm).
struct SubtractThenDot {
  double* t = nullptr;
  const double* b = nullptr;
  const double* d = nullptr;
  const double* c = nullptr;
  std::uint64_t n = 0;
  double* partials = nullptr;  // fixed_sum_blocks(n) doubles
  double* sum = nullptr;
};

// t *= 1 / sqrt(*square): a vector scaled to unit length by its squared norm.
struct ScaleToUnit {
  double* t = nullptr;
  const double* square = nullptr;
  std::uint64_t n = 0;
};

// A Ritz vector and its residual from the basis and its products (m vectors each, `stride`
// entries apart): x = sum_j y_j basis_j and ax = sum_j y_j products_j (j in order, entry by
// entry), r = ax - theta x, *sum = r . r.
struct RitzVector {
  const double* basis = nullptr;
  const double* products = nullptr;
  std::uint64_t stride = 0;
  const double* y = nullptr;  // m coefficients
  int m = 0;
  double theta = 0;
  std::uint64_t n = 0;
  double* x = nullptr;
  double* ax = nullptr;
  double* r = nullptr;
  double* partials = nullptr;  // fixed_sum_blocks(n) doubles
  double* sum = nullptr;
};

// The diagonal preconditioner: t_i /= theta - diagonal_i, the divisor kept at least 1e-4 from zero.
struct Precondition {
  double* t = nullptr;
  const double* diagonal = nullptr;
  double theta = 0;
  std::uint64_t n = 0;
};

void fixed_dots(Stream& stream, const FixedDots& args);
void fixed_dots_cpu(const FixedDots& args);
void subtract_then_dot(Stream& stream, const SubtractThenDot& args);
void subtract_then_dot_cpu(const SubtractThenDot& args);
void scale_to_unit(Stream& stream, const ScaleToUnit& args);
void scale_to_unit_cpu(const ScaleToUnit& args);
void ritz_vector(Stream& stream, const RitzVector& args);
void ritz_vector_cpu(const RitzVector& args);
void precondition(Stream& stream, const Precondition& args);
void precondition_cpu(const Precondition& args);

namespace detail {
void fixed_dots_cuda(void* cuda_stream, const FixedDots& args);
void subtract_then_dot_cuda(void* cuda_stream, const SubtractThenDot& args);
void scale_to_unit_cuda(void* cuda_stream, const ScaleToUnit& args);
void ritz_vector_cuda(void* cuda_stream, const RitzVector& args);
void precondition_cuda(void* cuda_stream, const Precondition& args);
}  // namespace detail

}  // namespace qstage::kernels
