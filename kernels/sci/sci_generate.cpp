#include "kernels/sci/sci_generate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/sci/sci_space_pairs.hpp"

namespace qstage::kernels {

namespace {

// The largest screening magnitude of each kind of list (the lists' first entries): a source
// whose |c| times it does not pass eps has no excitation of that kind, and its lists of that kind
// are not looked at (most sources, at a selection's eps: Cr2's 24-electron determinants have
// 1,176 lists each).
struct KindBounds {
  double single = 0, opposite = 0, same = 0;
  explicit KindBounds(const sci::HamiltonianView& h) {
    const auto first = [](const std::uint32_t* length, const double* magnitude, std::uint64_t lists, std::uint32_t width,
                          bool absolute) {
      double m = 0;
      for (std::uint64_t l = 0; l < lists; ++l)
        if (length[l] > 0) m = std::max(m, absolute ? std::fabs(magnitude[l * width]) : magnitude[l * width]);
      return m;
    };
    const auto n = static_cast<std::uint64_t>(h.norb);
    single = first(h.single_length, h.single_bound, n, h.single_width, false);
    opposite = first(h.opposite_length, h.opposite_value, n * n, h.opposite_width, true);
    same = first(h.same_length, h.same_value, n * (n - 1) / 2, h.same_width, true);
  }
};

// Walks source d's valid excitations in list order (sci_math.hpp: singles of each occupied alpha
// orbital, then beta; opposite-spin pairs, alpha outer; same-spin pairs by pair index, alpha then
// beta), the lists of a kind that cannot pass skipped.
template <typename Visit>
void for_each_excitation(const sci::HamiltonianView& h, const KindBounds& bounds, const sci::Det& d, double c, double eps,
                         Visit&& visit) {
  int occ_a[64], occ_b[64];
  const int na = sci::occupied(d.alpha, occ_a), nb = sci::occupied(d.beta, occ_b);
  const double abs_c = std::fabs(c);
  const auto walk = [&](const sci::ListRef& ref) {
    const std::uint32_t cut = sci::cut_length(h, ref, abs_c, eps);
    for (std::uint32_t k = 0; k < cut; ++k) {
      sci::Det target;
      double element;
      if (sci::list_entry(h, d, ref, k, abs_c, eps, &target, &element)) visit(target, element);
    }
  };
  if (bounds.single * abs_c > eps) {
    for (int i = 0; i < na; ++i) walk({sci::ListKind::single_alpha, occ_a[i], 0});
    for (int i = 0; i < nb; ++i) walk({sci::ListKind::single_beta, occ_b[i], 0});
  }
  if (bounds.opposite * abs_c > eps)
    for (int i = 0; i < na; ++i)
      for (int j = 0; j < nb; ++j) walk({sci::ListKind::opposite, occ_a[i], occ_b[j]});
  if (bounds.same * abs_c > eps) {
    for (int j = 1; j < na; ++j)
      for (int i = 0; i < j; ++i) walk({sci::ListKind::same_alpha, occ_a[i], occ_a[j]});
    for (int j = 1; j < nb; ++j)
      for (int i = 0; i < j; ++i) walk({sci::ListKind::same_beta, occ_b[i], occ_b[j]});
  }
}

}  // namespace

void sci_generate_cpu(const SciGenerate& a) {
  const auto n = static_cast<std::int64_t>(a.n);
  const KindBounds bounds(a.h);
  const SciSampled& sampled = a.sampled;
  // Per source: its records in out (sampled: in sampled.out) and, sampled, in diagonal_out.
  std::vector<std::uint64_t> offset(a.n + 1, 0), diagonal_offset(sampled.batch ? a.n + 1 : 0, 0);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t i = 0; i < n; ++i) {
    const double c = a.coefficients[i];
    std::uint64_t count = 0, diagonal = 0;
    for_each_excitation(a.h, bounds, a.sources[i], c, a.eps, [&](const sci::Det&, double element) {
      if (!sampled.batch) return void(++count);
      const bool large = sampled_large(sampled, element, c);
      count += large ? 2 : 1;
      diagonal += large ? 0 : 1;
    });
    offset[i + 1] = count;
    if (sampled.batch) diagonal_offset[i + 1] = diagonal;
  }
  for (std::uint64_t i = 0; i < a.n; ++i) offset[i + 1] += offset[i];
  for (std::uint64_t i = 0; sampled.batch && i < a.n; ++i) diagonal_offset[i + 1] += diagonal_offset[i];
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t i = 0; i < n; ++i) {
    const double c = a.coefficients[i];
    if (sampled.batch) {
      sci::TaggedCandidate* out = sampled.out + offset[i];
      sci::TaggedCandidate* diagonal = sampled.diagonal_out + diagonal_offset[i];
      for_each_excitation(a.h, bounds, a.sources[i], c, a.eps, [&](const sci::Det& t, double element) {
        const bool large = sampled_large(sampled, element, c);
        write_sampled(sampled, static_cast<std::uint64_t>(i), t, element, c, large, out, diagonal);
        out += large ? 2 : 1;
        diagonal += large ? 0 : 1;
      });
      continue;
    }
    sci::Candidate* out = a.out + offset[i];
    for_each_excitation(a.h, bounds, a.sources[i], c, a.eps, [&](const sci::Det& t, double element) {
      *out++ = sci::Candidate{t.alpha, t.beta, element * c};
    });
  }
  *a.count = offset[a.n];
  if (a.workspace) std::copy(offset.begin(), offset.end() - 1, a.workspace + a.n);  // (as the GPU's scan leaves them)
  if (sampled.batch) *sampled.diagonal_count = diagonal_offset[a.n];
}

void sci_sigma_cpu(const SciSigma& a) {
  const auto n = static_cast<std::int64_t>(a.n);
  const KindBounds bounds(a.h);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint64_t j = a.first + static_cast<std::uint64_t>(r);
    const sci::Det d = a.space[j];
    const double diag = sci::diagonal(a.h, d);
    double s = 0;
    for_each_excitation(a.h, bounds, d, 1.0, 0.0, [&](const sci::Det& t, double element) {
      const std::uint64_t i = sci::find_sorted(a.space, a.space_size, t);
      if (i < a.space_size) s += element * a.x[i];
    });
    a.sigma[r] = diag * a.x[j] + s;
    a.diagonal[r] = diag;
  }
}

// A row's entries, in the order sci_sigma_cpu sums them (list order): the row's partners in the
// space (SpacePairs), placed in that order (ListOrder), each element as list_entry computes it.
template <typename Row>
void for_each_coupling_row(const SciCouplings& a, Row&& row) {
  const sci::SpacePairs pairs(a.space, a.space_size);
  const sci::ListOrder order(a.h);
  sci::for_each_coupling_row(a.h, a.nalpha, a.nbeta, a.space, order, a.n, [&](sci::CouplingRow& scratch, std::uint64_t r) {
    thread_local std::vector<std::uint32_t> partners;
    partners.clear();
    pairs.coupled(a.first + r, partners);
    scratch.load(a.first + r, partners.data(), partners.size());
    row(scratch, r);
  });
}

// (the cpu grows its rows through sci::CouplingsUpdate, with each entry's place)
static void refuse_growth(const SciCouplings& a) {
  if (a.growth.previous_row) throw std::logic_error("sci_couplings: rows grown by the lanes' walk are cuda's");
}

[[noreturn]] static void refuse_gained() {
  throw std::logic_error("sci_couplings_gained: rows grown by insertion are cuda's");
}

void sci_couplings_count_cpu(const SciCouplings& a) {
  refuse_growth(a);
  for_each_coupling_row(a, [&](sci::CouplingRow& row, std::uint64_t r) { a.counts[r] = row.count(); });
}

void sci_couplings_write_cpu(const SciCouplings& a) {
  refuse_growth(a);
  for_each_coupling_row(a, [&](sci::CouplingRow& row, std::uint64_t r) {
    std::uint64_t at = a.offsets[r];
    row.visit([&](std::uint32_t i, double element, std::uint32_t place) {
      a.columns[at] = i;
      a.elements[at] = element;
      if (a.places) a.places[at] = place;
      ++at;
    });
    a.diagonal[r] = sci::diagonal(a.h, a.space[a.first + r]);
  });
}

// sci_sigma_cpu's sum, term by term, from the stored entries.
void sci_sigma_stored_cpu(const SciStoredSigma& a) {
  const auto n = static_cast<std::int64_t>(a.n);
#pragma omp parallel for schedule(dynamic, 64)
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint64_t j = a.first + static_cast<std::uint64_t>(r);
    const double diag = a.diagonal[j];
    for (int v = 0; v < a.vectors; ++v) {  // (the row's entries stay in cache from the first vector)
      const double* x = a.x + static_cast<std::uint64_t>(v) * a.x_stride;
      double s = 0;
      for (std::uint64_t k = a.offsets[j]; k < a.offsets[j + 1]; ++k) s += a.elements[k] * x[a.columns[k]];
      a.sigma[static_cast<std::uint64_t>(v) * a.sigma_stride + static_cast<std::uint64_t>(r)] = diag * x[j] + s;
    }
    a.diagonal_out[r] = diag;
  }
}

std::uint64_t sci_lane_ends_per_row(BackendKind kind) { return kind == BackendKind::cuda ? kSciLanes : 0; }

void sci_couplings_count(Stream& stream, const SciCouplings& args) {
  QSTAGE_DISPATCH(stream, sci_couplings_count_cpu(args), detail::sci_couplings_count_cuda(stream.native(), args));
}

void sci_couplings_write(Stream& stream, const SciCouplings& args) {
  QSTAGE_DISPATCH(stream, sci_couplings_write_cpu(args), detail::sci_couplings_write_cuda(stream.native(), args));
}

// 32 bits a determinant or more (a power of two): about one in 32 lookups outside the space searches.
std::uint64_t sci_space_filter_bits(std::uint64_t n) { return std::bit_ceil(std::max<std::uint64_t>(32 * n, 1024)); }

void sci_space_filter_cpu(const sci::Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits) {
  const sci::SpaceFilter f{words, bits - 1};
  std::fill(words, words + bits / 32, 0u);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t b = sci::filter_bit(f, space[i]);
    words[b >> 5] |= 1u << (b & 31);
  }
}

void sci_space_filter(Stream& stream, const sci::Det* space, std::uint64_t n, std::uint32_t* words, std::uint64_t bits) {
  QSTAGE_DISPATCH(stream, sci_space_filter_cpu(space, n, words, bits),
                  detail::sci_space_filter_cuda(stream.native(), space, n, words, bits));
}

void sci_couplings_gained_count(Stream& stream, const SciCouplings& args, std::uint32_t* counts) {
  QSTAGE_DISPATCH(stream, refuse_gained(), detail::sci_couplings_gained_count_cuda(stream.native(), args, counts));
}

void sci_couplings_gained_write(Stream& stream, const SciCouplings& args, const std::uint64_t* start,
                                std::uint32_t* fill, std::uint32_t* partners) {
  QSTAGE_DISPATCH(stream, refuse_gained(),
                  detail::sci_couplings_gained_write_cuda(stream.native(), args, start, fill, partners));
}

void sci_sigma_stored(Stream& stream, const SciStoredSigma& args) {
  QSTAGE_DISPATCH(stream, sci_sigma_stored_cpu(args), detail::sci_sigma_stored_cuda(stream.native(), args));
}

void sci_generate(Stream& stream, const SciGenerate& args) {
  QSTAGE_DISPATCH(stream, sci_generate_cpu(args), detail::sci_generate_cuda(stream.native(), args));
}

void sci_sigma(Stream& stream, const SciSigma& args) {
  QSTAGE_DISPATCH(stream, sci_sigma_cpu(args), detail::sci_sigma_cuda(stream.native(), args));
}

}  // namespace qstage::kernels
