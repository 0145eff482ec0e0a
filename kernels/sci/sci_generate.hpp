#pragma once
// Selected CI's two kernels over batches of determinants (seed 004 §4.2), each beside its CPU twin:
//
// - generate: for each source determinant i with coefficient c_i, every single and double
//   excitation a with |H_ai c_i| > eps (heat-bath screening), written as Candidate{a, H_ai c_i}.
//   Order: sources in order, each source's excitations in list order (sci_math.hpp). The GPU runs
//   one block per source: a count launch, a scan of the counts, and a write launch whose blocks
//   compact their valid excitations by a block-wide prefix sum, so positions never depend on
//   timing (no atomics) and the GPU writes the CPU twin's bytes.
// - sigma: for each row j of a sorted determinant space S, (H x)_j = H_jj x_j + sum over the
//   determinants i in S connected to j of H_ji x_i, the column i found by binary search in S
//   (seed 004's just-in-time reverse index): a matrix-free product for Davidson. Each row is one
//   block's fixed-order sum (the CPU sums in list order; the two agree to rounding).
// - couplings: sigma's matrix within S, stored: for each row j, the columns i and elements H_ji
//   sigma finds, in the order its backend sums them (cpu: list order; cuda: by the thread lane
//   that sums them, each lane's in list order, with each lane's end). A product from them
//   (sci_sigma_stored) gives sigma's bits for the cost of reading them, so Davidson's products
//   within an iteration need no enumeration and no search (seed 004's resident Hamiltonian).
//   Built by two launches over the same rows: count (entries per row), then, at offsets the
//   caller scanned from the counts, write. The GPU enumerates each row's excitations and searches
//   S for them; the CPU finds the row's partners through S's strings and sorts them into list
//   order (sci_space_pairs.hpp): the same entries, at a small part of the cost on the host.
#include <cstdint>

#include "backend/backend.hpp"
#include "kernels/sci/sci_math.hpp"

namespace qstage::kernels {

// The semistochastic PT2's sources (Sharma, Holmes, Jeanmairet, Alavi and Umrigar, JCTC 13, 1595
// (2017)): determinants sampled with probability p_i, each drawn w_i times in its batch b_i, with
// scale_i = w_i / p_i and fold_i = w_i (N - 1) / p_i - w_i^2 / p_i^2 (N draws a batch). Each valid
// excitation a of source i (|H_ai| |c_i| > eps; v = H_ai c_i) gives, in `out`,
//   {a, 3 b_i,     scale_i v}                      (summed per a: the batch's A),
//   {a, 3 b_i + 1, scale_i v}  if |H_ai| |c_i| > eps_large (the deterministic part's: A_large),
// and otherwise, in `diagonal_out`,
//   {a, 3 b_i + 2, fold_i v^2}                     (B - B_large: the diagonal terms that differ).
// Per batch, sum over a of (A^2 - A_large^2 + (B - B_large)) / (E - H_aa), over N (N - 1), is an
// unbiased estimate of PT2 at eps less PT2 at eps_large. The diagonal terms are linear in the
// records, so they are scored as they are, without de-duplication.
struct SciSampled {
  const std::uint64_t* batch = nullptr;  // per source; null: not sampled (Candidate records)
  const double* scale = nullptr;         // per source
  const double* fold = nullptr;          // per source
  double eps_large = 0;
  sci::TaggedCandidate* out = nullptr;           // room for 2 records per candidate
  sci::TaggedCandidate* diagonal_out = nullptr;  // room for 1 record per candidate
  std::uint64_t* diagonal_count = nullptr;       // one u64: how many diagonal_out holds
};

// Whether source c's excitation with element H_ai passes eps_large (the generation's own test, as
// the deterministic part at eps_large made it).
QSTAGE_HD bool sampled_large(const SciSampled& s, double element, double c) {
  return (element < 0 ? -element : element) * (c < 0 ? -c : c) > s.eps_large;
}

// Source i's records for its excitation to t with element H_ti (both twins write these; large:
// sampled_large's answer, which the caller needed to place them): one or two at a_out, none or
// one at diagonal_out.
QSTAGE_HD void write_sampled(const SciSampled& s, std::uint64_t i, const sci::Det& t, double element, double c, bool large,
                             sci::TaggedCandidate* a_out, sci::TaggedCandidate* diagonal_out) {
  const double v = element * c, scaled = v * s.scale[i];
  const std::uint64_t tag = 3 * s.batch[i];
  a_out[0] = sci::TaggedCandidate{t.alpha, t.beta, tag, scaled};
  if (large) a_out[1] = sci::TaggedCandidate{t.alpha, t.beta, tag + 1, scaled};
  else diagonal_out[0] = sci::TaggedCandidate{t.alpha, t.beta, tag + 2, s.fold[i] * (v * v)};
}

struct SciGenerate {
  sci::HamiltonianView h;  // device memory on cuda
  int nalpha = 0, nbeta = 0;
  const sci::Det* sources = nullptr;
  const double* coefficients = nullptr;
  std::uint64_t n = 0;
  double eps = 0;
  sci::Candidate* out = nullptr;    // room for every candidate (max_candidates_per_source * n)
  std::uint64_t* count = nullptr;   // one u64: how many were written
  // 2 n values (per-source counts, then offsets), 4 n sampled; after the call workspace[n + i] is
  // where source i's records begin in out (cuda: required; cpu: optional, written where given).
  std::uint64_t* workspace = nullptr;
  void* scan_workspace = nullptr;      // kSciScanWorkspaceBytes (the scan's temporary storage)
  SciSampled sampled;                  // sampled.batch set: TaggedCandidates in sampled.out and diagonal_out
};

// The scan's temporary storage for any batch up to 2^34 sources (checked at run time).
constexpr std::uint64_t kSciScanWorkspaceBytes = 4u << 20;
void sci_generate(Stream& stream, const SciGenerate& args);
void sci_generate_cpu(const SciGenerate& args);

struct SciSigma {
  sci::HamiltonianView h;
  int nalpha = 0, nbeta = 0;
  const sci::Det* space = nullptr;  // the sorted space S
  std::uint64_t space_size = 0;
  const double* x = nullptr;        // space_size values
  std::uint64_t first = 0, n = 0;   // the rows S[first, first + n)
  double* sigma = nullptr;          // n values: (H x) of those rows
  double* diagonal = nullptr;       // n values: H_jj
};

void sci_sigma(Stream& stream, const SciSigma& args);
void sci_sigma_cpu(const SciSigma& args);

// Lanes of a row in the cuda layout: lane_ends holds this many values a row (the cpu needs none).
constexpr std::uint32_t kSciLanes = 256;
std::uint64_t sci_lane_ends_per_row(BackendKind kind);

struct SciCouplings {
  sci::HamiltonianView h;
  int nalpha = 0, nbeta = 0;
  const sci::Det* space = nullptr;  // the sorted space S (fewer than 2^32 determinants)
  std::uint64_t space_size = 0;
  sci::SpaceFilter filter;          // cuda (optional): S's filter, which the lookups in S go through
  std::uint64_t first = 0, n = 0;   // the rows S[first, first + n)
  std::uint64_t* counts = nullptr;  // count: n values, each row's entries
  // cuda: sci_lane_ends_per_row values a row, each lane's end within the row (count writes
  // them, write reads them); cpu: unused.
  std::uint32_t* lane_ends = nullptr;
  const std::uint64_t* offsets = nullptr;  // write: n values, where each row's entries start
  std::uint32_t* columns = nullptr;         // write: the entries' columns i and elements H_ji
  double* elements = nullptr;
  double* diagonal = nullptr;               // write: n values, H_jj
  // write, cpu (optional): each entry's place in the excitation lists, which
  // sci::CouplingsUpdate (sci_space_pairs.hpp) needs to grow the rows with the space; cuda: null.
  std::uint32_t* places = nullptr;
  // cuda (optional): the rows grown from those of a space S0 that S holds (the cpu grows its rows
  // through sci::CouplingsUpdate instead). Rows of the added determinants are enumerated. A row
  // that was S0's is grown one of two ways, the same entries, in the same places, as from nothing:
  // - inserted, when `gained_start` is given (sci_couplings_gained) and the row gained at most
  //   `inserted_per_row` partners: its stored entries are copied, renumbered, and each gained
  //   partner that its lists hold is placed in its lane by its virtual excitation (`order`'s
  //   list_key). A row no added determinant reaches is a copy. Cost: its entries, not its walk.
  // - walked: its excitations in its lanes' order as the enumeration does, searching only the
  //   added determinants (an excitation that reaches S0 is the lane's next stored entry,
  //   compared, not searched).
  struct Growth {
    const std::uint32_t* previous_row = nullptr;  // n values: the row's index in S0, or kSciAdded
    const sci::Det* added = nullptr;               // S \ S0, sorted
    std::uint64_t added_size = 0;
    const std::uint32_t* added_index = nullptr;    // added_size values: each one's index in S
    const std::uint32_t* renumbered = nullptr;     // S0's rows' indices in S
    const std::uint64_t* offsets = nullptr;        // S0's rows: offsets, lane ends, columns, elements
    const std::uint32_t* lane_ends = nullptr;
    const std::uint32_t* columns = nullptr;
    const double* elements = nullptr;              // (inserted rows only)
    const std::uint64_t* gained_start = nullptr;   // size(S) + 1 values: each row's gained partners
    const std::uint32_t* gained = nullptr;         //   (their indices in S, in no order)
    sci::ListOrderView order;                       // (inserted rows only; device tables)
    std::uint32_t inserted_per_row = 512;           // at most kSciInsertedPerRow (tests lower it)
  } growth;
};
inline constexpr std::uint32_t kSciAdded = 0xffffffffu;
inline constexpr std::uint32_t kSciInsertedPerRow = 512;  // (shared memory of the kernels)
void sci_couplings_count(Stream& stream, const SciCouplings& args);
void sci_couplings_write(Stream& stream, const SciCouplings& args);
void sci_couplings_count_cpu(const SciCouplings& args);
void sci_couplings_write_cpu(const SciCouplings& args);

// The filter of a sorted space of n determinants (sci::SpaceFilter) into `words`, which hold
// `bits` bits (sci_space_filter_bits(n)).
std::uint64_t sci_space_filter_bits(std::uint64_t n);
void sci_space_filter(Stream& stream, const sci::Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits);
void sci_space_filter_cpu(const sci::Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits);

// cuda: the partners S0's rows gain with the added determinants (SciCouplings::Growth, rows over
// the whole space: first 0, n = size(S)). A row j of S0 may gain an added k only if k's lists
// reach j by a double (the lists of a double hold the same nonzero integral both ways) or k is
// one electron from j (every single move of k is looked up: a single's element may round to
// zero one way only). Count: `counts` (size(S) values) gets each row's; write: at `start`
// (their exclusive scan, size(S) + 1 values), each row's in no particular order, `fill`
// (size(S) values, zero) as scratch.
void sci_couplings_gained_count(Stream& stream, const SciCouplings& args, std::uint32_t* counts);
void sci_couplings_gained_write(Stream& stream, const SciCouplings& args, const std::uint64_t* start,
                                std::uint32_t* fill, std::uint32_t* partners);

// sigma from stored couplings (of every row of S): the rows S[first, first + n), of up to
// kSciSigmaVectors vectors at once (several Davidson products from one read of H; each vector's
// sums as if it were alone: the same bits).
constexpr int kSciSigmaVectors = 8;
struct SciStoredSigma {
  const std::uint64_t* offsets = nullptr;    // size(S) + 1 values: each row's first entry, then the total
  const std::uint32_t* lane_ends = nullptr;  // cuda
  const std::uint32_t* columns = nullptr;
  const double* elements = nullptr;
  const double* diagonal = nullptr;          // size(S) values
  const double* x = nullptr;                 // size(S) values
  std::uint64_t first = 0, n = 0;
  double* sigma = nullptr;                   // n values
  double* diagonal_out = nullptr;            // n values
  int vectors = 1;                           // x and sigma hold this many, x_stride and sigma_stride
  std::uint64_t x_stride = 0, sigma_stride = 0;  // values apart (1 vector: unused)
};
void sci_sigma_stored(Stream& stream, const SciStoredSigma& args);
void sci_sigma_stored_cpu(const SciStoredSigma& args);

namespace detail {
void sci_generate_cuda(void* cuda_stream, const SciGenerate& args);
void sci_sigma_cuda(void* cuda_stream, const SciSigma& args);
void sci_couplings_count_cuda(void* cuda_stream, const SciCouplings& args);
void sci_couplings_write_cuda(void* cuda_stream, const SciCouplings& args);
void sci_space_filter_cuda(void* cuda_stream, const sci::Det* space, std::uint64_t n, std::uint32_t* words,
                           std::uint64_t bits);
void sci_couplings_gained_count_cuda(void* cuda_stream, const SciCouplings& args, std::uint32_t* counts);
void sci_couplings_gained_write_cuda(void* cuda_stream, const SciCouplings& args, const std::uint64_t* start,
                                     std::uint32_t* fill, std::uint32_t* partners);
void sci_sigma_stored_cuda(void* cuda_stream, const SciStoredSigma& args);
}  // namespace detail

}  // namespace qstage::kernels
