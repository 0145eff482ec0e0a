#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <stdexcept>

#include "backend/cuda_check.hpp"
#include "kernels/block_tree.cuh"
#include "kernels/sci/sci_generate.hpp"

namespace qstage::kernels::detail {
namespace {

using sci::Candidate;
using sci::Det;
using sci::HamiltonianView;

constexpr int kThreads = 256;
using BlockScan = cub::BlockScan<unsigned, kThreads>;

// One source determinant's lists, laid out in shared memory by the whole block: the occupied
// orbitals and each list's cut end (an inclusive prefix sum over the cut lengths), so virtual
// excitation v is entry v - end[l-1] of the first list l with end[l] > v.
struct SharedSource {
  int occ_a[64], occ_b[64];
  typename BlockScan::TempStorage scan;
};

__device__ unsigned lay_out_lists(const HamiltonianView& h, int na, int nb, const Det& d, double abs_c, double eps,
                                  SharedSource& s, unsigned* end) {
  if (threadIdx.x == 0) {
    sci::occupied(d.alpha, s.occ_a);
    sci::occupied(d.beta, s.occ_b);
  }
  __syncthreads();
  const unsigned lists = sci::list_count(na, nb);
  for (unsigned l = threadIdx.x; l < lists; l += kThreads)
    end[l] = sci::cut_length(h, sci::list_at(l, na, nb, s.occ_a, s.occ_b), abs_c, eps);
  __syncthreads();
  // Inclusive prefix: each thread sums a contiguous chunk; a block scan of the chunk sums.
  const unsigned per = (lists + kThreads - 1) / kThreads;
  const unsigned b0 = min(lists, threadIdx.x * per), b1 = min(lists, b0 + per);
  unsigned sum = 0;
  for (unsigned k = b0; k < b1; ++k) sum += end[k];
  unsigned run;
  BlockScan(s.scan).ExclusiveSum(sum, run);
  __syncthreads();
  for (unsigned k = b0; k < b1; ++k) {
    run += end[k];
    end[k] = run;
  }
  __syncthreads();
  return lists ? end[lists - 1] : 0;
}

// Virtual excitation v of the laid-out source: false if it is not a valid excitation.
__device__ bool excitation_at(const HamiltonianView& h, int na, int nb, const Det& d, double abs_c, double eps,
                              const SharedSource& s, const unsigned* end, unsigned lists, unsigned v, Det* t, double* e) {
  unsigned lo = 0, hi = lists;
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (end[mid] <= v) lo = mid + 1;
    else hi = mid;
  }
  const unsigned start = lo ? end[lo - 1] : 0;
  return sci::list_entry(h, d, sci::list_at(lo, na, nb, s.occ_a, s.occ_b), v - start, abs_c, eps, t, e);
}

// Count (Write = false: counts[i]) or write (Write = true: at offsets[i]) each source's records,
// compacted in virtual-excitation order by a block-wide prefix sum. A valid excitation makes one
// record in out; sampled (kernels::SciSampled), one or two in sampled.out and none or one in
// sampled.diagonal_out (counts and offsets of those: diagonal_counts, diagonal_offsets). The scan
// runs over both counts packed in one word (out's in the low 16 bits, diagonal_out's in the high:
// a block of 256 threads makes at most 512 of either).
template <bool Write>
__global__ void __launch_bounds__(kThreads) generate_kernel(HamiltonianView h, int na, int nb, const Det* sources,
                                                            const double* coefficients, std::uint64_t n, double eps,
                                                            const std::uint64_t* offsets, std::uint64_t* counts,
                                                            const std::uint64_t* diagonal_offsets,
                                                            std::uint64_t* diagonal_counts, Candidate* out,
                                                            SciSampled sampled) {
  __shared__ SharedSource s;
  extern __shared__ unsigned end[];
  const unsigned lists = sci::list_count(na, nb);
  for (std::uint64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const Det d = sources[i];
    const double c = coefficients[i], abs_c = fabs(c);
    const unsigned total = lay_out_lists(h, na, nb, d, abs_c, eps, s, end);
    std::uint64_t written = 0, diagonal_written = 0;
    for (unsigned base = 0; base < total; base += kThreads) {
      const unsigned v = base + threadIdx.x;
      Det t;
      double e = 0;
      const bool valid = v < total && excitation_at(h, na, nb, d, abs_c, eps, s, end, lists, v, &t, &e);
      const bool large = valid && sampled.batch && sampled_large(sampled, e, c);
      const unsigned mine = !valid ? 0u : !sampled.batch ? 1u : large ? 2u : (1u | 1u << 16);
      unsigned pos, all;
      BlockScan(s.scan).ExclusiveSum(mine, pos, all);
      if (Write && valid) {
        if (sampled.batch)
          write_sampled(sampled, i, t, e, c, large, sampled.out + offsets[i] + written + (pos & 0xffffu),
                        sampled.diagonal_out + diagonal_offsets[i] + diagonal_written + (pos >> 16));
        else out[offsets[i] + written + pos] = Candidate{t.alpha, t.beta, e * c};
      }
      written += all & 0xffffu;
      diagonal_written += all >> 16;
      __syncthreads();
    }
    if (!Write && threadIdx.x == 0) {
      counts[i] = written;
      if (sampled.batch) diagonal_counts[i] = diagonal_written;
    }
    __syncthreads();
  }
}

__global__ void total_kernel(const std::uint64_t* offsets, const std::uint64_t* counts, std::uint64_t n,
                             std::uint64_t* total) {
  *total = n ? offsets[n - 1] + counts[n - 1] : 0;
}

// (H x)_j: one block per row, partial sums per thread combined in a fixed tree.
__global__ void __launch_bounds__(kThreads) sigma_kernel(HamiltonianView h, int na, int nb, const Det* space,
                                                         std::uint64_t size, const double* x, std::uint64_t first,
                                                         std::uint64_t n, double* sigma, double* diagonal) {
  __shared__ SharedSource s;
  __shared__ double partial[kThreads];
  extern __shared__ unsigned end[];
  const unsigned lists = sci::list_count(na, nb);
  for (std::uint64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const Det d = space[first + r];
    const unsigned total = lay_out_lists(h, na, nb, d, 1.0, 0.0, s, end);
    double acc = 0;
    for (unsigned v = threadIdx.x; v < total; v += kThreads) {
      Det t;
      double e;
      if (excitation_at(h, na, nb, d, 1.0, 0.0, s, end, lists, v, &t, &e)) {
        const std::uint64_t i = sci::find_sorted(space, size, t);
        if (i < size) acc += e * x[i];
      }
    }
    partial[threadIdx.x] = acc;
    block_tree<kThreads>([&](unsigned to, unsigned from) { partial[to] += partial[from]; });
    if (threadIdx.x == 0) {
      const double diag = sci::diagonal(h, d);
      sigma[r] = diag * x[first + r] + partial[0];
      diagonal[r] = diag;
    }
    __syncthreads();
  }
}

static_assert(kThreads == static_cast<int>(kSciLanes), "a row's lanes are the sigma kernel's threads");

// A row's entries as sigma_kernel's threads find them: thread t, excitations t, t + kThreads, ...
template <typename Visit>
__device__ void for_each_lane_coupling(const HamiltonianView& h, int na, int nb, const Det* space, std::uint64_t size,
                                       const sci::SpaceFilter& filter, const Det& d, SharedSource& s, unsigned* end,
                                       Visit&& visit) {
  const unsigned lists = sci::list_count(na, nb);
  const unsigned total = lay_out_lists(h, na, nb, d, 1.0, 0.0, s, end);
  for (unsigned v = threadIdx.x; v < total; v += kThreads) {
    Det t;
    double e;
    if (excitation_at(h, na, nb, d, 1.0, 0.0, s, end, lists, v, &t, &e)) {
      const std::uint64_t i = sci::find_filtered(space, size, filter, t);
      if (i < size) visit(i, e);
    }
  }
}

// A grown row's entries as sigma_kernel's threads find them (SciCouplings::Growth): the lane's
// stored entries of the row it was (S0's row `before`), renumbered, and the excitations that reach
// an added determinant, in the lane's excitation order.
template <typename Visit>
__device__ void for_each_grown_lane_coupling(const HamiltonianView& h, int na, int nb, const Det* space,
                                             const SciCouplings::Growth& g, std::uint32_t before, const Det& d,
                                             SharedSource& s, unsigned* end, Visit&& visit) {
  const unsigned lists = sci::list_count(na, nb);
  const unsigned total = lay_out_lists(h, na, nb, d, 1.0, 0.0, s, end);
  const std::uint64_t row = g.offsets[before], lanes = static_cast<std::uint64_t>(before) * kThreads;
  std::uint64_t next = row + (threadIdx.x ? g.lane_ends[lanes + threadIdx.x - 1] : 0);
  const std::uint64_t stop = row + g.lane_ends[lanes + threadIdx.x];
  // The lane's next stored entry: its column in S and its determinant (an excitation into S0 is
  // that one, compared rather than searched).
  std::uint32_t want_at = 0;
  Det want{};
  const auto load_next = [&] {
    if (next >= stop) return;
    want_at = g.renumbered[g.columns[next]];
    want = space[want_at];
  };
  load_next();
  for (unsigned v = threadIdx.x; v < total; v += kThreads) {
    Det t;
    double e;
    if (!excitation_at(h, na, nb, d, 1.0, 0.0, s, end, lists, v, &t, &e)) continue;
    if (next < stop && want == t) {
      visit(want_at, e);
      ++next;
      load_next();
      continue;
    }
    const std::uint64_t k = sci::find_sorted(g.added, g.added_size, t);
    if (k < g.added_size) visit(g.added_index[k], e);
  }
}

// Row r's entries, found from nothing or grown (SciCouplings::Growth).
template <typename Visit>
__device__ void for_each_row_coupling(const SciCouplings& a, std::uint64_t r, SharedSource& s, unsigned* end,
                                      Visit&& visit) {
  const Det d = a.space[a.first + r];
  const std::uint32_t before = a.growth.previous_row ? a.growth.previous_row[r] : kSciAdded;
  if (before == kSciAdded) for_each_lane_coupling(a.h, a.nalpha, a.nbeta, a.space, a.space_size, a.filter, d, s, end, visit);
  else for_each_grown_lane_coupling(a.h, a.nalpha, a.nbeta, a.space, a.growth, before, d, s, end, visit);
}

// ---------------------------------------------------------------- growth by insertion
// A gained partner of an inserted row (SciCouplings::Growth): its virtual excitation in the row's
// lists, its column in S and its element.
struct Gained {
  unsigned v;
  std::uint32_t column;
  double element;
};

// Whether row r (S0's row `before`, or kSciAdded) is grown by insertion, and its gained partners.
__device__ bool inserted_row(const SciCouplings& a, std::uint64_t r, std::uint32_t before, std::uint64_t* b,
                             std::uint64_t* e) {
  if (before == kSciAdded || !a.growth.gained_start) return false;
  *b = a.growth.gained_start[a.first + r];
  *e = a.growth.gained_start[a.first + r + 1];
  return *e - *b <= min(a.growth.inserted_per_row, kSciInsertedPerRow);
}

// Row d's gained partners [b, e) that its lists hold (at eps 0: as the enumeration, a single of
// zero element dropped), each with its place and element as the enumeration finds them, into
// `out`, compacted in the partners' order. Lays out d's lists first (kept for place_of); returns
// how many.
__device__ unsigned gather_gained(const SciCouplings& a, const Det& d, std::uint64_t b, std::uint64_t e,
                                  SharedSource& s, unsigned* end, Gained* out) {
  lay_out_lists(a.h, a.nalpha, a.nbeta, d, 1.0, 0.0, s, end);
  unsigned count = 0;
  for (std::uint64_t base = b; base < e; base += kThreads) {
    const std::uint64_t at = base + threadIdx.x;
    Gained g{};
    bool valid = false;
    if (at < e) {
      g.column = a.growth.gained[at];
      const std::uint32_t key = sci::list_key(a.growth.order, d, a.space[g.column], a.nalpha, a.nbeta);
      if (key != sci::kNotListed) {
        const unsigned list = key >> 16, entry = key & 0xffffu;
        Det t;
        valid = sci::list_entry(a.h, d, sci::list_at(list, a.nalpha, a.nbeta, s.occ_a, s.occ_b), entry, 1.0, 0.0, &t,
                                &g.element);
        g.v = (list ? end[list - 1] : 0) + entry;
      }
    }
    unsigned pos, all;
    BlockScan(s.scan).ExclusiveSum(valid ? 1u : 0u, pos, all);
    if (valid) out[count + pos] = g;
    count += all;
    __syncthreads();
  }
  return count;
}

// The virtual excitation at which d's laid-out lists reach space[column] (a stored entry: listed).
__device__ unsigned place_of(const SciCouplings& a, const Det& d, std::uint32_t column, const unsigned* end) {
  const std::uint32_t key = sci::list_key(a.growth.order, d, a.space[column], a.nalpha, a.nbeta);
  const unsigned list = key >> 16;
  return (list ? end[list - 1] : 0) + (key & 0xffffu);
}

// The next of this lane's gained entries after place `last` (any, when !started): its index, or m.
__device__ unsigned next_gained(const Gained* gained, unsigned m, bool started, unsigned last) {
  unsigned best = m;
  for (unsigned i = 0; i < m; ++i) {
    const unsigned v = gained[i].v;
    if (v % kThreads == threadIdx.x && (!started || v > last) && (best == m || v < gained[best].v)) best = i;
  }
  return best;
}

// Per row: each lane's entries, their inclusive prefix over the lanes (lane_ends) and the total.
__global__ void __launch_bounds__(kThreads) couplings_count_kernel(SciCouplings a) {
  __shared__ SharedSource s;
  __shared__ Gained gained[kSciInsertedPerRow];
  extern __shared__ unsigned end[];
  for (std::uint64_t r = blockIdx.x; r < a.n; r += gridDim.x) {
    const std::uint32_t before = a.growth.previous_row ? a.growth.previous_row[r] : kSciAdded;
    std::uint64_t gb = 0, ge = 0;
    unsigned mine = 0;
    if (inserted_row(a, r, before, &gb, &ge)) {
      const unsigned m = ge > gb ? gather_gained(a, a.space[a.first + r], gb, ge, s, end, gained) : 0;
      const std::uint64_t lanes = static_cast<std::uint64_t>(before) * kThreads;
      mine = a.growth.lane_ends[lanes + threadIdx.x] - (threadIdx.x ? a.growth.lane_ends[lanes + threadIdx.x - 1] : 0);
      for (unsigned i = 0; i < m; ++i) mine += gained[i].v % kThreads == threadIdx.x;
    } else {
      for_each_row_coupling(a, r, s, end, [&](std::uint64_t, double) { ++mine; });
    }
    __syncthreads();  // (lay_out_lists' scan storage is reused)
    unsigned upto, all;
    BlockScan(s.scan).InclusiveSum(mine, upto, all);
    a.lane_ends[r * kThreads + threadIdx.x] = upto;
    if (threadIdx.x == 0) a.counts[r] = all;
    __syncthreads();
  }
}

// Per row: each lane's entries at its place (lane t after lane t - 1), in the order it finds them;
// an inserted row's lane merges its stored entries (renumbered) with its gained ones by place.
__global__ void __launch_bounds__(kThreads) couplings_write_kernel(SciCouplings a) {
  __shared__ SharedSource s;
  __shared__ Gained gained[kSciInsertedPerRow];
  extern __shared__ unsigned end[];
  const SciCouplings::Growth& g = a.growth;
  for (std::uint64_t r = blockIdx.x; r < a.n; r += gridDim.x) {
    std::uint64_t at = a.offsets[r] + (threadIdx.x ? a.lane_ends[r * kThreads + threadIdx.x - 1] : 0);
    const Det d = a.space[a.first + r];
    const std::uint32_t before = g.previous_row ? g.previous_row[r] : kSciAdded;
    std::uint64_t gb = 0, ge = 0;
    if (inserted_row(a, r, before, &gb, &ge)) {
      const unsigned m = ge > gb ? gather_gained(a, d, gb, ge, s, end, gained) : 0;
      const std::uint64_t row = g.offsets[before], lanes = static_cast<std::uint64_t>(before) * kThreads;
      std::uint64_t k = row + (threadIdx.x ? g.lane_ends[lanes + threadIdx.x - 1] : 0);
      const std::uint64_t stop = row + g.lane_ends[lanes + threadIdx.x];
      bool started = false;
      unsigned last = 0;
      for (unsigned next; (next = next_gained(gained, m, started, last)) < m;) {
        const unsigned v = gained[next].v;
        for (; k < stop; ++k, ++at) {
          const std::uint32_t column = g.renumbered[g.columns[k]];
          if (place_of(a, d, column, end) > v) break;
          a.columns[at] = column;
          a.elements[at] = g.elements[k];
        }
        a.columns[at] = gained[next].column;
        a.elements[at] = gained[next].element;
        ++at;
        started = true;
        last = v;
      }
      for (; k < stop; ++k, ++at) {
        a.columns[at] = g.renumbered[g.columns[k]];
        a.elements[at] = g.elements[k];
      }
    } else {
      for_each_row_coupling(a, r, s, end, [&](std::uint64_t i, double e) {
        a.columns[at] = static_cast<std::uint32_t>(i);
        a.elements[at] = e;
        ++at;
      });
    }
    if (threadIdx.x == 0) a.diagonal[r] = sci::diagonal(a.h, d);
    __syncthreads();
  }
}

// The rows of S0 that each added determinant k may be a new partner of (sci_couplings_gained):
// counted (Write = false) or written at their rows' starts.
template <bool Write>
__global__ void __launch_bounds__(kThreads) gained_kernel(SciCouplings a, std::uint32_t* counts,
                                                          const std::uint64_t* start, std::uint32_t* fill,
                                                          std::uint32_t* partners) {
  __shared__ SharedSource s;
  extern __shared__ unsigned end[];
  const SciCouplings::Growth& g = a.growth;
  const int n = a.h.norb;
  for (std::uint64_t q = blockIdx.x; q < g.added_size; q += gridDim.x) {
    const Det d = g.added[q];
    const std::uint32_t k = g.added_index[q];
    const auto gain = [&](std::uint64_t j) {
      if (Write) partners[start[j] + atomicAdd(&fill[j], 1u)] = k;
      else atomicAdd(&counts[j], 1u);
    };
    // The doubles of k's lists that reach S0 (a row of S0 lists k by the same integral).
    for_each_lane_coupling(a.h, a.nalpha, a.nbeta, a.space, a.space_size, a.filter, d, s, end, [&](std::uint64_t i, double) {
      const Det t = a.space[i];
      if (g.previous_row[i] != kSciAdded && sci::popcount(d.alpha ^ t.alpha) + sci::popcount(d.beta ^ t.beta) == 4)
        gain(i);
    });
    // Every single move of k that lands in S0.
    const unsigned moves = 2u * static_cast<unsigned>(n * n);
    for (unsigned m = threadIdx.x; m < moves; m += kThreads) {
      const bool alpha = m < static_cast<unsigned>(n * n);
      const int p = static_cast<int>(m % (n * n)) / n, r = static_cast<int>(m % n);
      const std::uint64_t same = alpha ? d.alpha : d.beta;
      if (!((same >> p) & 1) || ((same >> r) & 1)) continue;
      const std::uint64_t moved = same ^ sci::bit(p) ^ sci::bit(r);
      const std::uint64_t i =
          sci::find_filtered(a.space, a.space_size, a.filter, alpha ? Det{moved, d.beta} : Det{d.alpha, moved});
      if (i < a.space_size && g.previous_row[i] != kSciAdded) gain(i);
    }
    __syncthreads();
  }
}

unsigned grid_for(std::uint64_t n) { return static_cast<unsigned>(std::min<std::uint64_t>(n, 1u << 20)); }

// sigma_kernel's arithmetic from stored entries: each thread its lane's terms in order, the
// same tree, the same last step, so the same bits; for V vectors, each entry read once and each
// vector summed on its own (V a template parameter: one vector's loop is the plain one).
template <int V>
__global__ void __launch_bounds__(kThreads) sigma_stored_kernel(const std::uint64_t* offsets,
                                                                const std::uint32_t* lane_ends,
                                                                const std::uint32_t* columns, const double* elements,
                                                                const double* diagonal, const double* x,
                                                                std::uint64_t first, std::uint64_t n, double* sigma,
                                                                double* diagonal_out, std::uint64_t x_stride,
                                                                std::uint64_t sigma_stride) {
  __shared__ double partial[kThreads];
  for (std::uint64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const std::uint64_t j = first + r;
    const std::uint64_t row = offsets[j];
    const std::uint64_t b = row + (threadIdx.x ? lane_ends[j * kThreads + threadIdx.x - 1] : 0),
                        e = row + lane_ends[j * kThreads + threadIdx.x];
    double acc[V] = {};
    for (std::uint64_t k = b; k < e; ++k) {
      const double element = elements[k];
      const std::uint32_t column = columns[k];
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += element * x[v * x_stride + column];
    }
    const double diag = diagonal[j];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      partial[threadIdx.x] = acc[v];
      block_tree<kThreads>([&](unsigned to, unsigned from) { partial[to] += partial[from]; });
      if (threadIdx.x == 0) sigma[v * sigma_stride + r] = diag * x[v * x_stride + j] + partial[0];
      __syncthreads();
    }
    if (threadIdx.x == 0) diagonal_out[r] = diag;
  }
}

template <int V>
void launch_sigma_stored(cudaStream_t stream, const SciStoredSigma& a) {
  sigma_stored_kernel<V><<<grid_for(a.n), kThreads, 0, stream>>>(a.offsets, a.lane_ends, a.columns, a.elements,
                                                                  a.diagonal, a.x, a.first, a.n, a.sigma,
                                                                  a.diagonal_out, a.x_stride, a.sigma_stride);
}


std::size_t list_bytes(int na, int nb) { return sci::list_count(na, nb) * sizeof(unsigned); }

}  // namespace

void sci_generate_cuda(void* cuda_stream, const SciGenerate& a) {
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  const bool sampled = a.sampled.batch != nullptr;
  std::uint64_t* counts = a.workspace;
  std::uint64_t* offsets = counts + a.n;
  std::uint64_t* diagonal_counts = sampled ? offsets + a.n : nullptr;
  std::uint64_t* diagonal_offsets = sampled ? diagonal_counts + a.n : nullptr;
  void* temp = a.scan_workspace;
  std::size_t temp_bytes = 0;
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, counts, offsets, static_cast<std::int64_t>(a.n)));
  if (temp_bytes > kSciScanWorkspaceBytes)
    throw std::logic_error("sci_generate: the scan needs more than kSciScanWorkspaceBytes");
  temp_bytes = kSciScanWorkspaceBytes;
  if (a.n == 0) {
    QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.count, 0, sizeof(std::uint64_t), stream));
    if (sampled) QSTAGE_CUDA_CHECK(cudaMemsetAsync(a.sampled.diagonal_count, 0, sizeof(std::uint64_t), stream));
    return;
  }
  const std::size_t shared = list_bytes(a.nalpha, a.nbeta);
  generate_kernel<false><<<grid_for(a.n), kThreads, shared, stream>>>(a.h, a.nalpha, a.nbeta, a.sources, a.coefficients,
                                                                        a.n, a.eps, nullptr, counts, nullptr,
                                                                        diagonal_counts, nullptr, a.sampled);
  QSTAGE_CUDA_CHECK_LAUNCH();
  QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, counts, offsets, static_cast<std::int64_t>(a.n), stream));
  if (sampled)
    QSTAGE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, diagonal_counts, diagonal_offsets,
                                                    static_cast<std::int64_t>(a.n), stream));
  generate_kernel<true><<<grid_for(a.n), kThreads, shared, stream>>>(a.h, a.nalpha, a.nbeta, a.sources, a.coefficients,
                                                                       a.n, a.eps, offsets, nullptr, diagonal_offsets,
                                                                       nullptr, a.out, a.sampled);
  QSTAGE_CUDA_CHECK_LAUNCH();
  total_kernel<<<1, 1, 0, stream>>>(offsets, counts, a.n, a.count);
  QSTAGE_CUDA_CHECK_LAUNCH();
  if (sampled) {
    total_kernel<<<1, 1, 0, stream>>>(diagonal_offsets, diagonal_counts, a.n, a.sampled.diagonal_count);
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}

void sci_sigma_cuda(void* cuda_stream, const SciSigma& a) {
  if (a.n == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  sigma_kernel<<<grid_for(a.n), kThreads, list_bytes(a.nalpha, a.nbeta), stream>>>(
      a.h, a.nalpha, a.nbeta, a.space, a.space_size, a.x, a.first, a.n, a.sigma, a.diagonal);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sci_couplings_count_cuda(void* cuda_stream, const SciCouplings& a) {
  if (a.n == 0) return;
  couplings_count_kernel<<<grid_for(a.n), kThreads, list_bytes(a.nalpha, a.nbeta), static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sci_couplings_write_cuda(void* cuda_stream, const SciCouplings& a) {
  if (a.n == 0) return;
  couplings_write_kernel<<<grid_for(a.n), kThreads, list_bytes(a.nalpha, a.nbeta), static_cast<cudaStream_t>(cuda_stream)>>>(a);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

__global__ void space_filter_kernel(const Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits) {
  const sci::SpaceFilter f{words, bits - 1};
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t b = sci::filter_bit(f, space[i]);
    atomicOr(&words[b >> 5], 1u << (b & 31));
  }
}

void sci_space_filter_cuda(void* cuda_stream, const Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits) {
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(words, 0, bits / 8, static_cast<cudaStream_t>(cuda_stream)));
  if (n == 0) return;
  space_filter_kernel<<<grid_for((n + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(cuda_stream)>>>(
      space, n, words, bits);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

static void check_gained(const SciCouplings& a) {
  if (!a.growth.previous_row || a.first != 0 || a.n != a.space_size)
    throw std::logic_error("sci_couplings_gained: needs a growth over the whole space");
}

void sci_couplings_gained_count_cuda(void* cuda_stream, const SciCouplings& a, std::uint32_t* counts) {
  check_gained(a);
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(counts, 0, a.space_size * 4, stream));
  if (a.growth.added_size == 0) return;
  gained_kernel<false><<<grid_for(a.growth.added_size), kThreads, list_bytes(a.nalpha, a.nbeta), stream>>>(
      a, counts, nullptr, nullptr, nullptr);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sci_couplings_gained_write_cuda(void* cuda_stream, const SciCouplings& a, const std::uint64_t* start,
                                     std::uint32_t* fill, std::uint32_t* partners) {
  check_gained(a);
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(fill, 0, a.space_size * 4, stream));
  if (a.growth.added_size == 0) return;
  gained_kernel<true><<<grid_for(a.growth.added_size), kThreads, list_bytes(a.nalpha, a.nbeta), stream>>>(
      a, nullptr, start, fill, partners);
  QSTAGE_CUDA_CHECK_LAUNCH();
}

void sci_sigma_stored_cuda(void* cuda_stream, const SciStoredSigma& a) {
  if (a.n == 0) return;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  switch (a.vectors) {
    case 1: launch_sigma_stored<1>(stream, a); break;
    case 2: launch_sigma_stored<2>(stream, a); break;
    case 3: launch_sigma_stored<3>(stream, a); break;
    case 4: launch_sigma_stored<4>(stream, a); break;
    case 5: launch_sigma_stored<5>(stream, a); break;
    case 6: launch_sigma_stored<6>(stream, a); break;
    case 7: launch_sigma_stored<7>(stream, a); break;
    case 8: launch_sigma_stored<8>(stream, a); break;
    default: throw std::logic_error("sci_sigma_stored: 1 to kSciSigmaVectors vectors");
  }
  QSTAGE_CUDA_CHECK_LAUNCH();
}

}  // namespace qstage::kernels::detail
