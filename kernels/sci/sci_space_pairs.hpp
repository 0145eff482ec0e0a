#pragma once
// Host-side help for storing H within a selected-CI space (the CPU twin of kernels::sci_couplings):
// which determinants of the space couple, found through the space's strings, and where each
// coupling falls in the excitation-list order that sci_sigma sums in.
//
// Enumerating a determinant's excitations and looking each up in the space costs every possible
// excitation (some 30,000 for 14 electrons in 28 orbitals) to find the few hundred that are in the
// space. SpacePairs instead indexes the space's distinct alpha and beta strings and, per string,
// the strings of the space one or two electrons away (through the strings with one or two
// electrons removed, as Dice builds its Hamiltonian: Sharma, Holmes, Jeanmairet, Alavi, Umrigar,
// JCTC 13, 1595 (2017), appendix). A determinant (a, b)'s partners are then (a, b') with b' near b,
// (a', b) with a' near a, and (a', b') with a', b' one electron away: work in proportion to what
// is found. ListOrder maps each partner to its place in the excitation lists (sci_math.hpp), so a
// row sorted by it holds the entries, and sums them, exactly as the enumeration does (CouplingRow).
// CouplingsUpdate grows stored rows with a space: rows of determinants already there keep their
// entries and gain the new determinants' (merged by place), the new determinants' rows are found
// in full; the same entries, bit for bit, as a build from nothing.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <vector>

#include "kernels/sci/sci_math.hpp"

namespace qstage::kernels::sci {

class SpacePairs {
 public:
  // `space`: sorted, distinct, fewer than 2^32 determinants; it must outlive this object.
  SpacePairs(const Det* space, std::uint64_t n);
  // Appends to `out` the index of every determinant of the space that differs from space[j] by
  // one or two electrons (each once, in no particular order).
  void coupled(std::uint64_t j, std::vector<std::uint32_t>& out) const;

 private:
  // Distinct strings of one spin, ascending, with the strings one (singles) and two (doubles)
  // electrons away, as compressed rows of string indices.
  struct Strings {
    std::vector<std::uint64_t> value;
    std::vector<std::uint32_t> singles_start, singles, doubles_start, doubles;
    void link(int removed, std::vector<std::uint32_t>& start, std::vector<std::uint32_t>& out) const;
  };
  // The index in the space of (alpha string a, beta) or n_ when absent (a's determinants are a
  // contiguous run, sorted by beta).
  std::uint64_t find(std::uint32_t a, std::uint64_t beta) const;
  const Det* space_;
  std::uint64_t n_;
  Strings alpha_, beta_;
  std::vector<std::uint32_t> alpha_first_;          // per alpha string: its run in the space, and the end
  std::vector<std::uint32_t> det_alpha_, det_beta_;  // per determinant: its strings' indices
  std::vector<std::uint32_t> by_beta_start_, by_beta_;  // per beta string: its determinants, ascending
};

// The place of an excitation in a source's excitation lists: (list << 16) | entry, the order in
// which for_each_excitation visits it at eps = 0, or kNotListed when the lists leave it out (an
// integral of zero).
class ListOrder {
 public:
  static constexpr std::uint32_t kNotListed = sci::kNotListed;
  // `h` in host memory.
  explicit ListOrder(const HamiltonianView& h);
  // The excitation source -> target (one or two electrons apart): list_key (sci_math.hpp).
  std::uint32_t key(const Det& source, const Det& target, int na, int nb) const;
  // The tables, in host memory (a device copy has these sizes).
  ListOrderView view() const { return {norb_, single_.data(), opposite_.data(), same_.data()}; }
  const std::vector<std::uint16_t>& single_table() const { return single_; }
  const std::vector<std::uint16_t>& opposite_table() const { return opposite_; }
  const std::vector<std::uint16_t>& same_table() const { return same_; }
  // Where each of source's lists starts among its excitations at eps = 0 (the concatenated cut
  // lists: sci_generate.cu's virtual excitations), in list order, then where the last ends (the
  // count of its virtual excitations).
  void list_starts(const Det& source, std::vector<std::uint32_t>& starts) const;

 private:
  int norb_;
  std::vector<std::uint16_t> single_, opposite_, same_;  // entry per (list, target); kListAbsent where cut
  std::vector<std::uint32_t> single_cut_, opposite_cut_, same_cut_;  // per list: its length at eps = 0
};

// Rows in list order (with each entry's place) laid out as the CUDA sigma kernel sums them
// (sci_generate.hpp, "couplings"): entry v of a row's virtual excitations goes to lane v % lanes,
// each lane's entries in order, lane after lane, with each lane's end (inclusive, within the row).
// The same offsets; rows [0, n).
void lane_layout(const ListOrder& order, const Det* space, std::uint64_t n, const std::uint64_t* offsets,
                 const std::uint32_t* columns, const double* elements, const std::uint32_t* places, std::uint32_t lanes,
                 std::uint32_t* lane_ends, std::uint32_t* lane_columns, double* lane_elements);

// One row of H within a space, as sci_sigma_cpu sums it: host scratch, one per thread.
class CouplingRow {
 public:
  CouplingRow(const HamiltonianView& h, int na, int nb, const Det* space, const ListOrder& order)
      : h_(h), na_(na), nb_(nb), space_(space), order_(order) {}
  // Row j, from candidate partners (any order; those not listed are dropped).
  void load(std::uint64_t j, const std::uint32_t* partners, std::size_t count);
  // How many entries visit() gives: the listed partners less the singles whose element is zero
  // (a double's list holds only nonzero integrals; a single's bound can exceed a zero element).
  std::uint64_t count() const;
  // The entries in list order, as visit(column, element, place).
  template <typename Visit>
  void visit(Visit&& visit);

 private:
  bool entry(std::uint64_t keyed, Det* target, double* element) const;
  const HamiltonianView& h_;
  int na_, nb_;
  const Det* space_;
  const ListOrder& order_;
  Det d_;
  int occ_a_[64], occ_b_[64];
  std::vector<std::uint64_t> keyed_;  // place << 32 | column
};

// H within `space` from H within `previous` (both sorted; every determinant of previous must be
// in space, else contains_previous() is false and nothing else may be called). Like the CPU twins
// of sci_couplings: count() first, then write() at offsets scanned from the counts. Rows [0, n).
class CouplingsUpdate {
 public:
  struct Stored {  // the previous space's stored rows, with each entry's place
    const std::uint64_t* offsets = nullptr;
    const std::uint32_t* columns = nullptr;
    const std::uint32_t* places = nullptr;
    const double* elements = nullptr;
    const double* diagonal = nullptr;
  };
  CouplingsUpdate(const HamiltonianView& h, int na, int nb, const Det* previous, std::uint64_t previous_size,
                  const Det* space, std::uint64_t size);
  bool contains_previous() const { return contains_previous_; }
  std::uint64_t new_determinants() const { return new_rows_.size(); }
  void count(const Stored& previous, std::uint64_t* counts) const;
  void write(const Stored& previous, const std::uint64_t* offsets, std::uint32_t* columns, double* elements,
             std::uint32_t* places, double* diagonal) const;

 private:
  const HamiltonianView& h_;
  int na_, nb_;
  const Det* space_;
  std::uint64_t size_;
  bool contains_previous_ = true;
  ListOrder order_;
  std::vector<std::int64_t> old_index_;   // per row: its index in previous, or -1 - its place in new_rows_
  std::vector<std::uint32_t> new_index_;  // per previous row: its row now
  std::vector<std::uint32_t> new_rows_;   // the new determinants' rows
  std::vector<std::uint32_t> partners_start_, partners_;  // per new row (in new_rows_ order): its partners
  std::vector<std::uint32_t> gained_start_, gained_;      // per row: the new partners of an old row
};

// row(scratch, r) for each r in [0, n) on OpenMP threads, each with its own CouplingRow; the
// first exception (there should be none) is rethrown.
template <typename Row>
void for_each_coupling_row(const HamiltonianView& h, int na, int nb, const Det* space, const ListOrder& order,
                           std::uint64_t n, Row&& row) {
  std::exception_ptr failure;
#pragma omp parallel
  {
    CouplingRow scratch(h, na, nb, space, order);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(n); ++r) {
      try {
        row(scratch, static_cast<std::uint64_t>(r));
      } catch (...) {
#pragma omp critical
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

template <typename Visit>
void CouplingRow::visit(Visit&& visit) {
  std::sort(keyed_.begin(), keyed_.end());
  for (const std::uint64_t keyed : keyed_) {
    Det target;
    double element;
    if (!entry(keyed, &target, &element)) continue;
    const auto i = static_cast<std::uint32_t>(keyed);
    if (!(target == space_[i])) throw std::logic_error("sci couplings: an excitation list entry is not the partner found");
    visit(i, element, static_cast<std::uint32_t>(keyed >> 32));
  }
}

}  // namespace qstage::kernels::sci
