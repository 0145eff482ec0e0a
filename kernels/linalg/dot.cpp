#include "kernels/linalg/dot.hpp"

#include <complex>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

std::uint64_t dotc_tiles(const Dotc& a) { return (a.n + a.tile - 1) / a.tile; }

namespace {

template <typename Real>
void dotc_tiles_cpu(const Dotc& a) {
  const auto* x = static_cast<const std::complex<Real>*>(a.x);
  const auto* y = static_cast<const std::complex<Real>*>(a.y);
  const auto tiles = static_cast<std::int64_t>(dotc_tiles(a));
#pragma omp parallel for schedule(static)
  for (std::int64_t t = 0; t < tiles; ++t) {
    std::complex<double> s = 0;
    const std::uint64_t end = std::min(a.n, static_cast<std::uint64_t>(t + 1) * a.tile);
    for (std::uint64_t i = static_cast<std::uint64_t>(t) * a.tile; i < end; ++i)
      s += std::conj(std::complex<double>(x[i])) * std::complex<double>(y[i]);
    a.partials[2 * t] = s.real();
    a.partials[2 * t + 1] = s.imag();
  }
}

}  // namespace

void dotc_cpu(const Dotc& a) {
  if (a.dtype == DType::complex64) dotc_tiles_cpu<float>(a);
  else dotc_tiles_cpu<double>(a);
}

void dotc(Stream& stream, const Dotc& args) {
  QSTAGE_DISPATCH(stream, dotc_cpu(args), detail::dotc_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
