#pragma once
// What the Davidson products of one sci.solve iteration share on the device (seed 004: hot data
// stays on the device): the integrals and tables, the space, and, where it fits, H within the
// space stored (kernels::sci_couplings). With it stored, a product reads it once (the cost of
// its bytes); without, each product enumerates every determinant's excitations and searches
// the space for them. Either way the products give the same bits (kernels/sci_generate.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/sci_math.hpp"
#include "stages/sci/excitation_tables.hpp"

namespace qstage::sci {

class ResidentSpace {
 public:
  // Uploads the Hamiltonian and the space, then counts H's entries within the space and stores
  // them if that takes at most `stored_limit` device bytes. On the host, given the resident space
  // of a space this one grew from (previous iteration's, H stored), H is grown from its rows
  // (kernels::sci::CouplingsUpdate: the same entries, for the cost of the new determinants).
  ResidentSpace(Backend& backend, const Integrals& ints, const ExcitationTables& tables, int nalpha, int nbeta,
                const std::vector<kernels::sci::Det>& space, std::uint64_t stored_limit,
                std::unique_ptr<ResidentSpace> previous = nullptr);
  // Whether H was grown from a previous space's (and from how many new determinants).
  bool grown() const { return grown_; }
  std::uint64_t grown_by() const { return grown_by_; }
  // Whether a later space can grow from this one: the host's, with H stored.
  bool can_seed_growth() const { return stored_ && places_.size() > 0; }
  // Device bytes held (declare them as the products' resident bytes).
  std::uint64_t bytes() const { return bytes_; }
  bool stored() const { return stored_; }
  std::uint64_t entries() const { return entries_; }
  double build_seconds() const { return build_seconds_; }
  // (H x) and H_jj of the rows [first, first + n) of the space, enqueued on `stream`; x is a
  // device vector over the whole space.
  void sigma(Stream& stream, const double* x, std::uint64_t first, std::uint64_t n, double* sigma,
             double* diagonal) const;

 private:
  void store(Backend& backend, Stream& stream, std::uint64_t stored_limit, const ResidentSpace* previous);
  int nalpha_, nbeta_;
  std::uint64_t size_;
  std::unique_ptr<ResidentHamiltonian> hamiltonian_;
  Buffer space_;
  bool stored_ = false, grown_ = false;
  std::uint64_t grown_by_ = 0;
  std::uint64_t entries_ = 0, bytes_ = 0;
  double build_seconds_ = 0;
  Buffer offsets_, lane_ends_, columns_, elements_, diagonal_;
  Buffer places_;  // host only: each entry's place in the excitation lists
};

}  // namespace qstage::sci
