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
  // them if that takes at most `stored_limit` device bytes.
  ResidentSpace(Backend& backend, const Integrals& ints, const ExcitationTables& tables, int nalpha, int nbeta,
                const std::vector<kernels::sci::Det>& space, std::uint64_t stored_limit);
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
  void store(Backend& backend, Stream& stream, std::uint64_t stored_limit);
  int nalpha_, nbeta_;
  std::uint64_t size_;
  std::unique_ptr<ResidentHamiltonian> hamiltonian_;
  Buffer space_;
  bool stored_ = false;
  std::uint64_t entries_ = 0, bytes_ = 0;
  double build_seconds_ = 0;
  Buffer offsets_, lane_ends_, columns_, elements_, diagonal_;
};

}  // namespace qstage::sci
