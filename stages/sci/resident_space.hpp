#pragma once
// What the Davidson products of one sci.solve iteration share on the device (seed 004: hot data
// stays on the device): the integrals and tables, the space, and, where it fits, H within the
// space stored. With it stored, a product reads it once (the cost of its bytes); without, each
// product enumerates every determinant's excitations and searches the space for them. Either way
// the products give the same bits (kernels/sci/sci_generate.hpp).
//
// H's rows are found one of two ways (RowSource), the same entries either way:
// - on the host (kernels/sci/sci_space_pairs.hpp: each determinant's partners through the space's
//   strings, in the enumeration's order), kept there in list order with each entry's place, so
//   that the next iteration's space, which holds this one, grows them instead of finding them
//   again. The cpu backend's products read those rows; on cuda they are laid out in the sigma
//   kernel's lanes and uploaded.
// - on the device (cuda only): every row's virtual excitations enumerated and searched in the
//   space; the next iteration's space grows them (its rows that were this one's are copied with
//   the partners they gain inserted, found through the added determinants' own excitations, or,
//   when much of the space is new, walk their excitations again searching only the added
//   determinants: SciCouplings::Growth). Its cost grows with the
//   excitations a row has, the host's with the partners it finds, so cuda enumerates only where
//   a row has few (rows_on_host).
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/sci/sci_math.hpp"
#include "stages/sci/excitation_tables.hpp"

namespace qstage::sci {

// Where a cuda run finds H's stored rows (the cpu backend finds them on the host in any case).
enum class RowSource { chosen, device_enumeration, host_strings };

class ResidentSpace {
 public:
  // Uploads the Hamiltonian and the space, then counts H's entries within the space and stores
  // them if that takes at most `stored_limit` device bytes (and, for rows found on the host on
  // cuda, they fit the host budget). Given the resident space of a space this one grew from (the
  // last iteration's), H grows from its rows, found the same way (on the host,
  // kernels::sci::CouplingsUpdate; on the device, SciCouplings::Growth): the same entries.
  ResidentSpace(Backend& backend, const Integrals& ints, const ExcitationTables& tables, int nalpha, int nbeta,
                const std::vector<kernels::sci::Det>& space, std::uint64_t stored_limit,
                std::unique_ptr<ResidentSpace> previous = nullptr, RowSource source = RowSource::chosen);
  // RowSource::chosen: whether `backend` finds a space's rows on the host, from the virtual
  // excitations of one of its determinants (`sample`: every row has about as many).
  static bool rows_on_host(BackendKind backend, const kernels::sci::HamiltonianView& host,
                           const kernels::sci::Det& sample);
  // The rows were found on the host, or enumerated on the device (each seeds the next space's).
  bool rows_found_on_host() const { return static_cast<bool>(rows_.offsets); }
  bool rows_enumerated_on_device() const { return stored_ && !rows_found_on_host() && columns_.data() != nullptr; }
  ~ResidentSpace();
  // Device bytes held (declare them as the products' resident bytes).
  std::uint64_t bytes() const { return bytes_; }
  bool stored() const { return stored_; }
  std::uint64_t entries() const { return entries_; }
  double build_seconds() const { return build_seconds_; }
  // Whether H was grown from a previous space's (and by how many new determinants).
  bool grown() const { return grown_; }
  std::uint64_t grown_by() const { return grown_by_; }
  // Whether the last space's rows were grown by inserting their gained partners (cuda).
  bool inserted() const { return inserted_; }
  // Whether a later space can grow its H from this one's (H stored).
  bool can_seed_growth() const { return stored_ && (rows_found_on_host() || rows_enumerated_on_device()); }
  // Frees what only the products need, keeping what growth reads (host rows; or, enumerated on
  // the device, the rows' offsets, lanes and columns there): between an iteration's last product
  // and the next iteration's first, the passes have the device.
  void keep_only_growth_seed();
  // (H x) and H_jj of the rows [first, first + n) of the space, enqueued on `stream`; x is a
  // device vector over the whole space, or `vectors` of them one after the other (at most
  // kernels::kSciSigmaVectors), whose products go one after the other into sigma (n values each):
  // with H stored, H is read once for all of them. Each product has the bits it has alone.
  void sigma(Stream& stream, const double* x, std::uint64_t first, std::uint64_t n, double* sigma,
             double* diagonal, int vectors = 1) const;

 private:
  // H's rows on the host, in list order with each entry's place; charged to the budget of the
  // memory they stand for (the device's on the cpu backend, the host's on cuda).
  // (Arrays left uninitialized: the parallel loops that fill them touch their pages first.)
  struct HostRows {
    std::unique_ptr<std::uint64_t[]> offsets;
    std::unique_ptr<std::uint32_t[]> columns, places;
    std::unique_ptr<double[]> elements, diagonal;
    BudgetHold charged;
    static std::uint64_t bytes(std::uint64_t rows, std::uint64_t entries) { return (2 * rows + 1) * 8 + entries * 16; }
  };
  bool store_from_host_strings(Backend& backend, Stream& stream, const kernels::sci::HamiltonianView& host,
                               std::uint64_t stored_limit, const ResidentSpace* previous);
  void store_by_device_enumeration(Backend& backend, Stream& stream, const kernels::sci::HamiltonianView& host,
                                   std::uint64_t stored_limit, const ResidentSpace* previous);
  std::uint64_t lane_layout_bytes(BackendKind backend, std::uint64_t entries) const;
  void upload_lanes(Backend& backend, Stream& stream, const kernels::sci::HamiltonianView& host);
  int nalpha_, nbeta_;
  std::uint64_t size_;
  std::unique_ptr<ResidentHamiltonian> hamiltonian_;
  std::vector<kernels::sci::Det> host_space_;
  Buffer space_;
  bool stored_ = false, grown_ = false, inserted_ = false;
  std::uint64_t entries_ = 0, bytes_ = 0, grown_by_ = 0;
  double build_seconds_ = 0;
  HostRows rows_;
  Buffer offsets_, lane_ends_, columns_, elements_, diagonal_;  // cuda: the rows in the sigma kernel's lanes
};

}  // namespace qstage::sci
