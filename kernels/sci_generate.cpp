#include "kernels/sci_generate.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/sci_space_pairs.hpp"

namespace qstage::kernels {

namespace {

// Walks source i's valid excitations in list order.
template <typename Visit>
void for_each_excitation(const sci::HamiltonianView& h, int na, int nb, const sci::Det& d, double c, double eps,
                         Visit&& visit) {
  int occ_a[64], occ_b[64];
  sci::occupied(d.alpha, occ_a);
  sci::occupied(d.beta, occ_b);
  const double abs_c = std::fabs(c);
  const std::uint32_t lists = sci::list_count(na, nb);
  for (std::uint32_t l = 0; l < lists; ++l) {
    const sci::ListRef ref = sci::list_at(l, na, nb, occ_a, occ_b);
    const std::uint32_t cut = sci::cut_length(h, ref, abs_c, eps);
    for (std::uint32_t k = 0; k < cut; ++k) {
      sci::Det target;
      double element;
      if (sci::list_entry(h, d, ref, k, abs_c, eps, &target, &element)) visit(target, element);
    }
  }
}

}  // namespace

void sci_generate_cpu(const SciGenerate& a) {
  const auto n = static_cast<std::int64_t>(a.n);
  const SciSampled& sampled = a.sampled;
  // Per source: its records in out (sampled: in sampled.out) and, sampled, in diagonal_out.
  std::vector<std::uint64_t> offset(a.n + 1, 0), diagonal_offset(sampled.batch ? a.n + 1 : 0, 0);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t i = 0; i < n; ++i) {
    const double c = a.coefficients[i];
    std::uint64_t count = 0, diagonal = 0;
    for_each_excitation(a.h, a.nalpha, a.nbeta, a.sources[i], c, a.eps, [&](const sci::Det&, double element) {
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
      for_each_excitation(a.h, a.nalpha, a.nbeta, a.sources[i], c, a.eps, [&](const sci::Det& t, double element) {
        const bool large = sampled_large(sampled, element, c);
        write_sampled(sampled, static_cast<std::uint64_t>(i), t, element, c, large, out, diagonal);
        out += large ? 2 : 1;
        diagonal += large ? 0 : 1;
      });
      continue;
    }
    sci::Candidate* out = a.out + offset[i];
    for_each_excitation(a.h, a.nalpha, a.nbeta, a.sources[i], c, a.eps, [&](const sci::Det& t, double element) {
      *out++ = sci::Candidate{t.alpha, t.beta, element * c};
    });
  }
  *a.count = offset[a.n];
  if (sampled.batch) *sampled.diagonal_count = diagonal_offset[a.n];
}

void sci_sigma_cpu(const SciSigma& a) {
  const auto n = static_cast<std::int64_t>(a.n);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint64_t j = a.first + static_cast<std::uint64_t>(r);
    const sci::Det d = a.space[j];
    const double diag = sci::diagonal(a.h, d);
    double s = 0;
    for_each_excitation(a.h, a.nalpha, a.nbeta, d, 1.0, 0.0, [&](const sci::Det& t, double element) {
      const std::uint64_t i = sci::find_sorted(a.space, a.space_size, t);
      if (i < a.space_size) s += element * a.x[i];
    });
    a.sigma[r] = diag * a.x[j] + s;
    a.diagonal[r] = diag;
  }
}

// A row's entries, in the order sci_sigma_cpu sums them (list order): the row's partners in the
// space (SpacePairs), placed in that order (ListOrder), each element as list_entry computes it.
class RowCouplings {
 public:
  RowCouplings(const SciCouplings& a, const sci::SpacePairs& pairs, const sci::ListOrder& order)
      : a_(a), pairs_(pairs), order_(order) {}
  // The row's entries in list order, each as visit(column, element).
  template <typename Visit>
  void visit(std::uint64_t r, Visit&& visit) {
    place(r);
    std::sort(keyed_.begin(), keyed_.end());
    for (const std::uint64_t keyed : keyed_) {
      sci::Det target;
      double element;
      if (!entry(keyed, &target, &element)) continue;
      const std::uint32_t i = static_cast<std::uint32_t>(keyed);
      if (!(target == a_.space[i])) throw std::logic_error("sci couplings: an excitation list entry is not the partner found");
      visit(i, element);
    }
  }
  // How many entries visit() gives: the listed partners less the singles whose element is zero
  // (a double's list holds only nonzero integrals; a single's bound can be above a zero element).
  std::uint64_t count(std::uint64_t r) {
    place(r);
    const std::uint32_t singles = static_cast<std::uint32_t>(a_.nalpha + a_.nbeta);
    std::uint64_t count = 0;
    for (const std::uint64_t keyed : keyed_) {
      sci::Det target;
      double element;
      count += (keyed >> 48) >= singles || entry(keyed, &target, &element);
    }
    return count;
  }

 private:
  // keyed_: the row's listed partners as (place << 32 | column), unsorted.
  void place(std::uint64_t r) {
    d_ = a_.space[a_.first + r];
    sci::occupied(d_.alpha, occ_a_);
    sci::occupied(d_.beta, occ_b_);
    partners_.clear();
    pairs_.coupled(a_.first + r, partners_);
    keyed_.clear();
    for (const std::uint32_t i : partners_) {
      const std::uint32_t key = order_.key(d_, a_.space[i], a_.nalpha, a_.nbeta);
      if (key != sci::ListOrder::kNotListed) keyed_.push_back(std::uint64_t{key} << 32 | i);
    }
  }
  bool entry(std::uint64_t keyed, sci::Det* target, double* element) const {
    const sci::ListRef ref = sci::list_at(static_cast<std::uint32_t>(keyed >> 48), a_.nalpha, a_.nbeta, occ_a_, occ_b_);
    return sci::list_entry(a_.h, d_, ref, static_cast<std::uint32_t>(keyed >> 32) & 0xffff, 1.0, 0.0, target, element);
  }
  const SciCouplings& a_;
  const sci::SpacePairs& pairs_;
  const sci::ListOrder& order_;
  sci::Det d_;
  int occ_a_[64], occ_b_[64];
  std::vector<std::uint32_t> partners_;
  std::vector<std::uint64_t> keyed_;
};

// Each thread its own row scratch; the first exception (there should be none) is rethrown.
template <typename Row>
void for_each_row(const SciCouplings& a, Row&& row) {
  const auto n = static_cast<std::int64_t>(a.n);
  const sci::SpacePairs pairs(a.space, a.space_size);
  const sci::ListOrder order(a.h);
  std::exception_ptr failure;
#pragma omp parallel
  {
    RowCouplings rows(a, pairs, order);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t r = 0; r < n; ++r) {
      try {
        row(rows, static_cast<std::uint64_t>(r));
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

void sci_couplings_count_cpu(const SciCouplings& a) {
  for_each_row(a, [&](RowCouplings& rows, std::uint64_t r) {
    a.counts[r] = rows.count(r);
  });
}

void sci_couplings_write_cpu(const SciCouplings& a) {
  for_each_row(a, [&](RowCouplings& rows, std::uint64_t r) {
    std::uint64_t at = a.offsets[r];
    rows.visit(r, [&](std::uint64_t i, double element) {
      a.columns[at] = static_cast<std::uint32_t>(i);
      a.elements[at] = element;
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
    double s = 0;
    for (std::uint64_t k = a.offsets[j]; k < a.offsets[j + 1]; ++k) s += a.elements[k] * a.x[a.columns[k]];
    a.sigma[r] = diag * a.x[j] + s;
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
