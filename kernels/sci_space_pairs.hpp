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
// row sorted by it holds the entries, and sums them, exactly as the enumeration does.
#include <cstdint>
#include <vector>

#include "kernels/sci_math.hpp"

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
  static constexpr std::uint32_t kNotListed = ~std::uint32_t{0};
  // `h` in host memory.
  explicit ListOrder(const HamiltonianView& h);
  // The excitation source -> target (one or two electrons apart).
  std::uint32_t key(const Det& source, const Det& target, int na, int nb) const;

 private:
  static constexpr std::uint16_t kAbsent = 0xffff;
  int norb_;
  std::vector<std::uint16_t> single_, opposite_, same_;  // entry per (list, target); kAbsent where cut
};

}  // namespace qstage::kernels::sci
