// kernels/scan.hpp: the CPU twins and the dispatch to kernels/scan.cu.
#include "kernels/scan.hpp"

#include <bit>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {

auto* ull(std::uint64_t* p) { return reinterpret_cast<unsigned long long*>(p); }
auto* ull(const std::uint64_t* p) { return reinterpret_cast<const unsigned long long*>(p); }

// The rank of item i among the flagged ones, if it is flagged.
bool rank_of(std::uint64_t i, const std::uint8_t* bitmap, const std::uint64_t* ranks, std::uint64_t& rank) {
  const unsigned byte = bitmap[i / 8], bit = static_cast<unsigned>(i % 8);
  rank = ranks[i / 8] + static_cast<std::uint64_t>(std::popcount(byte & ((1u << bit) - 1u)));
  return (byte >> bit) & 1u;
}

}  // namespace

std::uint64_t scan_scratch_words(std::uint64_t items) { return 1 + (items + detail::kScanTile - 1) / detail::kScanTile; }

namespace cpu {

void exclusive_scan(const std::uint64_t* counts, std::uint64_t items, std::uint64_t* offsets) {
  std::uint64_t sum = 0;
  for (std::uint64_t i = 0; i < items; ++i) {
    offsets[i] = sum;
    sum += counts[i];
  }
}

void flag_above(const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap, std::uint64_t* counts) {
  const auto bytes = static_cast<std::int64_t>((n + 7) / 8);
#pragma omp parallel for schedule(static)
  for (std::int64_t j = 0; j < bytes; ++j) {
    unsigned byte = 0;
    for (unsigned k = 0; k < 8; ++k) {
      const std::uint64_t i = 8 * static_cast<std::uint64_t>(j) + k;
      if (i < n && flagged_above(x[i * stride], t)) byte |= 1u << k;
    }
    bitmap[j] = static_cast<std::uint8_t>(byte);
    counts[j] = static_cast<std::uint64_t>(std::popcount(byte));
  }
}

void popcounts(const std::uint8_t* bitmap, std::uint64_t bytes, std::uint64_t* counts) {
  for (std::uint64_t j = 0; j < bytes; ++j) counts[j] = static_cast<std::uint64_t>(std::popcount(bitmap[j]));
  counts[bytes] = 0;
}

template <typename T>
void compact(const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap, const std::uint64_t* ranks, T* kept) {
  std::uint64_t rank = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    if (rank_of(i, bitmap, ranks, rank)) kept[rank] = x[i * stride];
}

template <typename T>
void expand(const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap, const std::uint64_t* ranks, T* out) {
  std::uint64_t rank = 0;
  for (std::uint64_t i = 0; i < n; ++i) out[i * stride] = rank_of(i, bitmap, ranks, rank) ? kept[rank] : T{};
}

}  // namespace cpu

void exclusive_scan(Stream& stream, const std::uint64_t* counts, std::uint64_t items, std::uint64_t* offsets,
                    std::uint64_t* scratch) {
  QSTAGE_DISPATCH(stream, cpu::exclusive_scan(counts, items, offsets),
                  detail::exclusive_scan_cuda(stream.native(), ull(counts), items, ull(offsets), ull(scratch)));
}

void flag_above(Stream& stream, const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap,
                std::uint64_t* counts) {
  QSTAGE_DISPATCH(stream, cpu::flag_above(x, n, stride, t, bitmap, counts),
                  detail::flag_above_cuda(stream.native(), x, n, stride, t, bitmap, ull(counts)));
}

void popcounts(Stream& stream, const std::uint8_t* bitmap, std::uint64_t bytes, std::uint64_t* counts) {
  QSTAGE_DISPATCH(stream, cpu::popcounts(bitmap, bytes, counts),
                  detail::popcounts_cuda(stream.native(), bitmap, bytes, ull(counts)));
}

template <typename T>
void compact(Stream& stream, const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
             const std::uint64_t* ranks, T* kept) {
  QSTAGE_DISPATCH(stream, cpu::compact(x, n, stride, bitmap, ranks, kept),
                  detail::compact_cuda(stream.native(), x, n, stride, bitmap, ull(ranks), kept));
}

template <typename T>
void expand(Stream& stream, const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
            const std::uint64_t* ranks, T* out) {
  QSTAGE_DISPATCH(stream, cpu::expand(kept, n, stride, bitmap, ranks, out),
                  detail::expand_cuda(stream.native(), kept, n, stride, bitmap, ull(ranks), out));
}

#define QSTAGE_SCAN_TYPE(T)                                                                                        \
  template void compact<T>(Stream&, const T*, std::uint64_t, int, const std::uint8_t*, const std::uint64_t*, T*); \
  template void expand<T>(Stream&, const T*, std::uint64_t, int, const std::uint8_t*, const std::uint64_t*, T*);  \
  template void cpu::compact<T>(const T*, std::uint64_t, int, const std::uint8_t*, const std::uint64_t*, T*);     \
  template void cpu::expand<T>(const T*, std::uint64_t, int, const std::uint8_t*, const std::uint64_t*, T*);
QSTAGE_SCAN_TYPE(float)
QSTAGE_SCAN_TYPE(std::uint8_t)
QSTAGE_SCAN_TYPE(std::uint64_t)
#undef QSTAGE_SCAN_TYPE

}  // namespace qstage::kernels
