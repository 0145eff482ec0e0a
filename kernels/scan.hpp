#pragma once
// Device-wide exclusive scan and stream compaction, on the cpu backend (kernels/scan.cpp) or
// the GPU (kernels/scan.cu, built on the decoupled look-back of kernels/scan.cuh). All sums are
// exact integer sums, so both give the same values on every run.
//
// Compaction keeps the items a bitmap flags, in order, and puts them back:
//   flags:  bitmap byte j, bit k (k < 8) flags item 8 j + k; counts[j] = its set bits
//           (flag_above, or popcounts of a bitmap at hand);
//   ranks:  exclusive_scan of the counts: ranks[j] = the flagged items before item 8 j
//           (scan bytes + 1 counts with a last 0, as popcounts leaves them, and
//           ranks[bytes] is the number flagged);
//   compact: kept[rank of item i] = x[i * stride] for every flagged i;
//   expand:  out[i * stride] = the kept value of a flagged i, else T{}.
// Pointers are device memory on cuda and host memory on cpu; calls are queued on `stream`.
#include <cmath>
#include <cstdint>

#include "backend/backend.hpp"
#include "kernels/common.hpp"

namespace qstage::kernels {

// Whether flag_above flags x: |x| > t, and NaN.
QSTAGE_HD bool flagged_above(float x, double t) { return !(std::fabs(static_cast<double>(x)) <= t); }

// The scratch words exclusive_scan needs for `items` counts (the look-back's ticket and tile words).
std::uint64_t scan_scratch_words(std::uint64_t items);

// offsets[i] = counts[0] + ... + counts[i - 1] for i < items; offsets[0] = 0. The sum of all
// counts must be below 2^62 (the look-back's tile words hold 62 bits of a sum). `scratch`:
// scan_scratch_words(items) words, which the call zeroes itself. counts and offsets must not
// overlap.
void exclusive_scan(Stream& stream, const std::uint64_t* counts, std::uint64_t items, std::uint64_t* offsets,
                    std::uint64_t* scratch);

// The bitmap ((n + 7) / 8 bytes) of the items x[i * stride] (i < n) that flagged_above(x, t),
// and counts[j] = the set bits of byte j (counts has bytes entries; the caller may add a last 0).
void flag_above(Stream& stream, const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap,
                std::uint64_t* counts);

// counts[j] = the set bits of bitmap byte j (j < bytes), and counts[bytes] = 0.
void popcounts(Stream& stream, const std::uint8_t* bitmap, std::uint64_t bytes, std::uint64_t* counts);

// Of items x[i * stride] (i < n), the flagged ones in order into kept; ranks: exclusive_scan of
// the bitmap's counts. T: float, std::uint8_t or std::uint64_t.
template <typename T>
void compact(Stream& stream, const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
             const std::uint64_t* ranks, T* kept);

// compact's inverse: out[i * stride] (i < n) = the kept value of item i if flagged, else T{}.
template <typename T>
void expand(Stream& stream, const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
            const std::uint64_t* ranks, T* out);

// The CPU twins.
namespace cpu {
void exclusive_scan(const std::uint64_t* counts, std::uint64_t items, std::uint64_t* offsets);
void flag_above(const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap, std::uint64_t* counts);
void popcounts(const std::uint8_t* bitmap, std::uint64_t bytes, std::uint64_t* counts);
template <typename T>
void compact(const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap, const std::uint64_t* ranks, T* kept);
template <typename T>
void expand(const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap, const std::uint64_t* ranks, T* out);
}  // namespace cpu

// The CUDA launches (kernels/scan.cu), on the cudaStream_t `cuda_stream`; the GPU codec calls
// them directly. Counts, offsets and ranks as the kernels address them.
namespace detail {
// The look-back scan's CTAs: 256 threads of 8 counts each, a tile of kScanTile counts.
constexpr int kScanThreads = 256, kScanPerThread = 8, kScanTile = kScanThreads * kScanPerThread;
void exclusive_scan_cuda(void* cuda_stream, const unsigned long long* counts, std::uint64_t items,
                         unsigned long long* offsets, unsigned long long* scratch);
void flag_above_cuda(void* cuda_stream, const float* x, std::uint64_t n, int stride, double t, std::uint8_t* bitmap,
                     unsigned long long* counts);
void popcounts_cuda(void* cuda_stream, const std::uint8_t* bitmap, std::uint64_t bytes, unsigned long long* counts);
template <typename T>
void compact_cuda(void* cuda_stream, const T* x, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                  const unsigned long long* ranks, T* kept);
template <typename T>
void expand_cuda(void* cuda_stream, const T* kept, std::uint64_t n, int stride, const std::uint8_t* bitmap,
                 const unsigned long long* ranks, T* out);
}  // namespace detail

}  // namespace qstage::kernels
