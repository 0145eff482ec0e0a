#include "kernels/tensor/random.hpp"

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

void random_fill_cpu(const RandomFill& a) {
  const std::uint64_t key = splitmix64(a.seed);
  const auto n = static_cast<std::int64_t>(a.components);
  const bool single = a.dtype == DType::float32 || a.dtype == DType::complex64;
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
  QSTAGE_DISPATCH(stream, random_fill_cpu(args), detail::random_fill_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
