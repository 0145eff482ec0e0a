#include "kernels/checksum.hpp"

#include <cstring>
#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

void checksum_cpu(const Checksum& a) {
  std::uint64_t sum = 0;
  if (a.word_bytes == 4) {
    const auto* w = static_cast<const std::uint32_t*>(a.data);
    const auto n = static_cast<std::int64_t>(a.bytes / 4);
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) sum += qsum_term(w[i], a.first_word + static_cast<std::uint64_t>(i));
  } else {
    const auto* w = static_cast<const std::uint8_t*>(a.data);
    const auto n = static_cast<std::int64_t>(a.bytes);
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) sum += qsum_term(w[i], a.first_word + static_cast<std::uint64_t>(i));
  }
  *a.result = sum;
}

void checksum(Stream& stream, const Checksum& args) {
  if (args.word_bytes != 4 && args.word_bytes != 1) throw std::invalid_argument("checksum: word_bytes must be 1 or 4");
  QSTAGE_DISPATCH(stream, checksum_cpu(args), detail::checksum_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
