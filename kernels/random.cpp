#include "kernels/random.hpp"

#include <stdexcept>

namespace qstage::kernels {

void random_fill_cpu(const RandomFill& a) {
  const std::uint64_t key = splitmix64(a.seed);
  const auto n = static_cast<std::int64_t>(a.components);
  const bool single = a.dtype == h5::DType::float32 || a.dtype == h5::DType::complex64;
  if (single) {
    auto* out = static_cast<float*>(a.out);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) out[i] = random_float(random_bits(key, a.first_component + i));
  } else {
    auto* out = static_cast<double*>(a.out);
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) out[i] = random_double(random_bits(key, a.first_component + i));
  }
}

void random_fill(Stream& stream, const RandomFill& args) {
  if (stream.kind() == BackendKind::cuda) {
#ifdef QSTAGE_HAVE_CUDA
    detail::random_fill_cuda(stream.native(), args);
    return;
#else
    throw std::logic_error("random_fill: cuda stream in a build without CUDA");
#endif
  }
  random_fill_cpu(args);
}

}  // namespace qstage::kernels
