#include "kernels/looped_gemm.hpp"

#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {
void check(const LoopedGemm& g) {
  if (g.dtype != h5::DType::complex64 && g.dtype != h5::DType::complex128)
    throw std::invalid_argument("looped_gemm: complex64 or complex128 only");
  if (g.groups < 0 || g.groups > kMaxLoopGroups) throw std::invalid_argument("looped_gemm: too many loop groups");
}

template <typename Real>
void run_cpu(const LoopedGemm& g) {
  const auto total = static_cast<std::int64_t>(g.loops() * static_cast<std::uint64_t>(g.m * g.n));
#pragma omp parallel for schedule(static) if (total * g.k > (std::int64_t{1} << 16))
  for (std::int64_t e = 0; e < total; ++e) detail::looped_gemm_element<Real>(g, static_cast<std::uint64_t>(e));
}
}  // namespace

void looped_gemm_cpu(const LoopedGemm& g) {
  check(g);
  if (g.dtype == h5::DType::complex64) run_cpu<float>(g);
  else run_cpu<double>(g);
}

void looped_gemm(Stream& stream, const LoopedGemm& g) {
  check(g);
  QSTAGE_DISPATCH(stream, looped_gemm_cpu(g), detail::looped_gemm_cuda(stream.native(), g));
}

}  // namespace qstage::kernels
