#include "stages/sci/resident_space.hpp"

#include <chrono>
#include <limits>
#include <memory>
#include <optional>

#include "kernels/sci/sci_generate.hpp"
#include "kernels/sci/sci_space_pairs.hpp"

namespace qstage::sci {

using kernels::sci::Det;

namespace {

// `bytes` from the host into a new device buffer `to` (8 bytes at least), enqueued on `stream`.
void upload(Backend& backend, Stream& stream, Buffer& to, const void* from, std::uint64_t bytes, const char* what) {
  to = backend.alloc_device(std::max<std::uint64_t>(bytes, 8), what);
  backend.copy_to_device(to.data(), from, bytes, stream);
}

}  // namespace

ResidentSpace::ResidentSpace(Backend& backend, const Integrals& ints, const ExcitationTables& tables, int nalpha,
                             int nbeta, const std::vector<Det>& space, std::uint64_t stored_limit,
                             std::unique_ptr<ResidentSpace> previous, RowSource source)
    : nalpha_(nalpha), nbeta_(nbeta), size_(space.size()) {
  const auto started = std::chrono::steady_clock::now();
  auto stream = backend.make_stream();
  hamiltonian_ = std::make_unique<ResidentHamiltonian>(backend, *stream, ints, tables);
  space_ = backend.alloc_device(std::max<std::uint64_t>(size_, 1) * sizeof(Det), "selected-CI space");
  backend.copy_to_device(space_.data(), space.data(), size_ * sizeof(Det), *stream);
  bytes_ = ResidentHamiltonian::bytes(ints, tables) + space_.size();
  // (columns are 32-bit; a space of 2^32 determinants or more enumerates)
  if (size_ > 0 && size_ < std::numeric_limits<std::uint32_t>::max()) {
    const kernels::sci::HamiltonianView host = host_view(ints, tables);
    const bool on_host = backend.kind() == BackendKind::cpu || source == RowSource::host_strings ||
                         (source == RowSource::chosen && rows_on_host(backend.kind(), host, space.front()));
    bool enumerate = !on_host;
    host_space_ = space;
    if (on_host) {
      const bool host_full =
          !store_from_host_strings(backend, *stream, host, stored_limit,
                                   previous && previous->can_seed_growth() && previous->rows_found_on_host() ? previous.get()
                                                                                                          : nullptr);
      enumerate = host_full && backend.kind() == BackendKind::cuda && source != RowSource::host_strings;
    }
    if (enumerate)
      store_by_device_enumeration(backend, *stream, host, stored_limit,
                                  previous && previous->can_seed_growth() && previous->rows_enumerated_on_device()
                                      ? previous.get()
                                      : nullptr);
  }
  stream->synchronize();
  build_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// The device enumerates all of a row's virtual excitations, every iteration; the host finds the
// row's partners through the space's strings and grows the last iteration's rows. Measured on one
// H200 against its host's 16 cores (whole sci.solve runs): N2/cc-pVDZ at eps_var 2e-4 (a
// determinant has 2.0e4 virtual excitations) 4.2 s enumerating on the device, 6.6 s on the host;
// Cr2/SV at 5e-4 (1.8e5) 57 s on the device, 34 s on the host. The limit sits between, in log
// scale (H2O and C2 in cc-pVDZ: 0.7e4 and 1.5e4).
bool ResidentSpace::rows_on_host(BackendKind backend, const kernels::sci::HamiltonianView& host, const Det& sample) {
  if (backend == BackendKind::cpu) return true;
  constexpr std::uint32_t kDeviceEnumerationLimit = 1u << 16;
  std::vector<std::uint32_t> starts;
  kernels::sci::ListOrder(host).list_starts(sample, starts);
  return starts.back() > kDeviceEnumerationLimit;
}

void ResidentSpace::keep_only_growth_seed() {
  hamiltonian_.reset();
  space_.reset(), diagonal_.reset();
  // (rows enumerated on the device grow there: their offsets, lanes, columns and elements stay)
  if (rows_found_on_host()) offsets_.reset(), lane_ends_.reset(), columns_.reset(), elements_.reset();
}

ResidentSpace::~ResidentSpace() = default;

// False when the rows would fit the device's share but not the host budget (cuda).
bool ResidentSpace::store_from_host_strings(Backend& backend, Stream& stream, const kernels::sci::HamiltonianView& host,
                                            std::uint64_t stored_limit, const ResidentSpace* previous) {
  const bool cuda = backend.kind() == BackendKind::cuda;
  // Device bytes: on cuda the lane layout, on the cpu the host rows themselves.
  const auto device_bytes = [&](std::uint64_t entries) {
    return cuda ? lane_layout_bytes(backend.kind(), entries) : HostRows::bytes(size_, entries);
  };
  if (device_bytes(0) > stored_limit) return true;
  std::optional<kernels::sci::CouplingsUpdate> update;
  kernels::sci::CouplingsUpdate::Stored before;
  if (previous) {
    update.emplace(host, nalpha_, nbeta_, previous->host_space_.data(), previous->size_, host_space_.data(), size_);
    if (!update->contains_previous()) update.reset();
    const HostRows& r = previous->rows_;
    before = {r.offsets.get(), r.columns.get(), r.places.get(), r.elements.get(), r.diagonal.get()};
  }
  kernels::SciCouplings c;
  c.h = host;
  c.nalpha = nalpha_;
  c.nbeta = nbeta_;
  c.space = host_space_.data();
  c.space_size = size_;
  c.first = 0;
  c.n = size_;
  std::vector<std::uint64_t> counts(size_);
  c.counts = counts.data();
  if (update) update->count(before, c.counts);
  else kernels::sci_couplings_count_cpu(c);
  std::uint64_t total = 0;
  for (const std::uint64_t k : counts) total += k;
  if (device_bytes(total) > stored_limit) return true;
  const std::uint64_t host_bytes = HostRows::bytes(size_, total);
  if (cuda && host_bytes > backend.host_budget().left()) return false;
  rows_.charged = cuda ? backend.hold_host(host_bytes, "selected-CI stored H: rows on the host")
                       : backend.hold_device(host_bytes, "selected-CI stored H: rows");
  rows_.offsets = std::make_unique_for_overwrite<std::uint64_t[]>(size_ + 1);
  rows_.offsets[0] = 0;
  for (std::uint64_t j = 0; j < size_; ++j) rows_.offsets[j + 1] = rows_.offsets[j] + counts[j];
  counts = {};
  rows_.columns = std::make_unique_for_overwrite<std::uint32_t[]>(std::max<std::uint64_t>(total, 1));
  rows_.places = std::make_unique_for_overwrite<std::uint32_t[]>(std::max<std::uint64_t>(total, 1));
  rows_.elements = std::make_unique_for_overwrite<double[]>(std::max<std::uint64_t>(total, 1));
  rows_.diagonal = std::make_unique_for_overwrite<double[]>(size_);
  c.offsets = rows_.offsets.get();
  c.columns = rows_.columns.get();
  c.elements = rows_.elements.get();
  c.places = rows_.places.get();
  c.diagonal = rows_.diagonal.get();
  if (update) {
    update->write(before, c.offsets, c.columns, c.elements, c.places, c.diagonal);
    grown_ = true;
    grown_by_ = update->new_determinants();
  } else {
    kernels::sci_couplings_write_cpu(c);
  }
  if (cuda) upload_lanes(backend, stream, host);
  stored_ = true;
  entries_ = total;
  bytes_ += device_bytes(total);
  return true;
}

// Every row's virtual excitations enumerated on the device and searched in the space: counted,
// scanned on the host, written at their lanes' places (kernels/sci/sci_generate.hpp). Given the last
// iteration's rows (enumerated on the device, and this space holds that one's), those rows grow
// instead: their walk searches only the added determinants (SciCouplings::Growth).
void ResidentSpace::store_by_device_enumeration(Backend& backend, Stream& stream,
                                                const kernels::sci::HamiltonianView& host, std::uint64_t stored_limit,
                                                const ResidentSpace* previous) {
  const std::uint64_t lanes = kernels::sci_lane_ends_per_row(backend.kind());
  if (lane_layout_bytes(backend.kind(), 0) > stored_limit) return;
  Buffer offsets = backend.alloc_device((size_ + 1) * 8, "selected-CI stored H: row offsets");
  Buffer lane_ends = backend.alloc_device(std::max<std::uint64_t>(size_ * lanes * 4, 4), "selected-CI stored H: lane ends");
  kernels::SciCouplings c;
  c.h = hamiltonian_->view();
  c.nalpha = nalpha_;
  c.nbeta = nbeta_;
  c.space = space_.as<Det>();
  c.space_size = size_;
  c.first = 0;
  c.n = size_;
  // The space's filter: a row's lookups of excitations outside the space mostly end at one read.
  const std::uint64_t filter_bits = kernels::sci_space_filter_bits(size_);
  Buffer filter = backend.alloc_device(filter_bits / 8, "selected-CI stored H: the space's filter");
  kernels::sci_space_filter(stream, space_.as<Det>(), size_, filter.as<std::uint32_t>(), filter_bits);
  c.filter = {filter.as<std::uint32_t>(), filter_bits - 1};
  // Growth: the map from the last space, and (insertion) the partners its rows gain.
  Buffer previous_row, added, added_index, renumbered, single, opposite, same, gained_start, gained;
  if (previous) {
    const std::vector<Det>& before = previous->host_space_;
    std::vector<std::uint32_t> row_before(size_), now(before.size()), added_at;
    std::vector<Det> added_dets;
    std::uint64_t k = 0;
    for (std::uint64_t j = 0; j < size_; ++j) {
      if (k < before.size() && before[k] == host_space_[j]) {
        row_before[j] = static_cast<std::uint32_t>(k);
        now[k++] = static_cast<std::uint32_t>(j);
      } else {
        row_before[j] = kernels::kSciAdded;
        added_dets.push_back(host_space_[j]);
        added_at.push_back(static_cast<std::uint32_t>(j));
      }
    }
    if (k == before.size()) {  // (this space holds the last one's)
      upload(backend, stream, previous_row, row_before.data(), size_ * 4, "selected-CI stored H growth: rows before");
      upload(backend, stream, added, added_dets.data(), added_dets.size() * sizeof(Det),
             "selected-CI stored H growth: added determinants");
      upload(backend, stream, added_index, added_at.data(), added_at.size() * 4, "selected-CI stored H growth: added rows");
      upload(backend, stream, renumbered, now.data(), now.size() * 4, "selected-CI stored H growth: rows renumbered");
      kernels::SciCouplings::Growth& g = c.growth;
      g.previous_row = previous_row.as<std::uint32_t>();
      g.added = added.as<Det>();
      g.added_size = added_dets.size();
      g.added_index = added_index.as<std::uint32_t>();
      g.renumbered = renumbered.as<std::uint32_t>();
      g.offsets = previous->offsets_.as<std::uint64_t>();
      g.lane_ends = previous->lane_ends_.as<std::uint32_t>();
      g.columns = previous->columns_.as<std::uint32_t>();
      g.elements = previous->elements_.as<double>();
      grown_by_ = added_dets.size();
      // Inserting walks an added row four times (twice to find the rows it reaches, then count
      // and write) and copies an old row; walking grown rows walks every row twice. Insertion
      // pays while at most half of the space is new (C2/cc-pVDZ at eps_var 5e-5 on one H200,
      // 315,496 determinants added to 503,227: 1.08 s walked, 0.86 s inserted).
      if (2 * added_dets.size() <= size_) {
        const kernels::sci::ListOrder order(host);
        upload(backend, stream, single, order.single_table().data(), order.single_table().size() * 2,
               "selected-CI stored H growth: list order (singles)");
        upload(backend, stream, opposite, order.opposite_table().data(), order.opposite_table().size() * 2,
               "selected-CI stored H growth: list order (opposite-spin doubles)");
        upload(backend, stream, same, order.same_table().data(), order.same_table().size() * 2,
               "selected-CI stored H growth: list order (same-spin doubles)");
        g.order = {host.norb, single.as<std::uint16_t>(), opposite.as<std::uint16_t>(), same.as<std::uint16_t>()};
        Buffer counts = backend.alloc_device(size_ * 4, "selected-CI stored H growth: gained partners a row");
        kernels::sci_couplings_gained_count(stream, c, counts.as<std::uint32_t>());
        std::vector<std::uint32_t> gained_counts(size_);
        std::vector<std::uint64_t> start(size_ + 1, 0);
        backend.copy_to_host(gained_counts.data(), counts.data(), size_ * 4, stream);
        stream.synchronize();
        for (std::uint64_t j = 0; j < size_; ++j) start[j + 1] = start[j] + gained_counts[j];
        upload(backend, stream, gained_start, start.data(), (size_ + 1) * 8, "selected-CI stored H growth: gained starts");
        gained = backend.alloc_device(std::max<std::uint64_t>(start[size_], 1) * 4, "selected-CI stored H growth: gained");
        kernels::sci_couplings_gained_write(stream, c, gained_start.as<std::uint64_t>(), counts.as<std::uint32_t>(),
                                            gained.as<std::uint32_t>());
        g.gained_start = gained_start.as<std::uint64_t>();
        g.gained = gained.as<std::uint32_t>();
        stream.synchronize();  // (the host vectors above go with this scope)
      }
      stream.synchronize();  // (the host vectors above go with this scope)
    }
  }
  c.counts = offsets.as<std::uint64_t>();
  c.lane_ends = lane_ends.as<std::uint32_t>();
  kernels::sci_couplings_count(stream, c);
  // Each row's first entry: an exclusive scan of the counts, on the host (their total decides).
  std::vector<std::uint64_t> at(size_ + 1, 0);
  backend.copy_to_host(at.data(), offsets.data(), size_ * 8, stream);
  stream.synchronize();
  std::uint64_t total = 0;
  for (std::uint64_t j = 0; j <= size_; ++j) {
    const std::uint64_t count = j < size_ ? at[j] : 0;
    at[j] = total;
    total += count;
  }
  if (lane_layout_bytes(backend.kind(), total) > stored_limit) return;
  backend.copy_to_device(offsets.data(), at.data(), (size_ + 1) * 8, stream);
  columns_ = backend.alloc_device(std::max<std::uint64_t>(total * 4, 4), "selected-CI stored H: columns");
  elements_ = backend.alloc_device(std::max<std::uint64_t>(total * 8, 8), "selected-CI stored H: elements");
  diagonal_ = backend.alloc_device(size_ * 8, "selected-CI stored H: diagonal");
  c.offsets = offsets.as<std::uint64_t>();
  c.columns = columns_.as<std::uint32_t>();
  c.elements = elements_.as<double>();
  c.diagonal = diagonal_.as<double>();
  kernels::sci_couplings_write(stream, c);
  stream.synchronize();  // (the host scan above goes with this scope)
  offsets_ = std::move(offsets);
  lane_ends_ = std::move(lane_ends);
  stored_ = true;
  grown_ = c.growth.previous_row != nullptr;
  inserted_ = c.growth.gained != nullptr;
  entries_ = total;
  bytes_ += offsets_.size() + lane_ends_.size() + columns_.size() + elements_.size() + diagonal_.size();
}

// The device bytes of the rows in the sigma kernel's layout: offsets, each lane's end and the
// diagonal, then a column and an element an entry.
std::uint64_t ResidentSpace::lane_layout_bytes(BackendKind backend, std::uint64_t entries) const {
  const std::uint64_t lanes = kernels::sci_lane_ends_per_row(backend);
  return (size_ + 1) * 8 + size_ * lanes * 4 + size_ * 8 + entries * 12;
}

// The host rows in the CUDA sigma kernel's lanes, uploaded.
void ResidentSpace::upload_lanes(Backend& backend, Stream& stream, const kernels::sci::HamiltonianView& host) {
  const std::uint64_t lanes = kernels::sci_lane_ends_per_row(backend.kind()), total = rows_.offsets[size_];
  auto lane_ends = std::make_unique_for_overwrite<std::uint32_t[]>(size_ * lanes);
  auto columns = std::make_unique_for_overwrite<std::uint32_t[]>(std::max<std::uint64_t>(total, 1));
  auto elements = std::make_unique_for_overwrite<double[]>(std::max<std::uint64_t>(total, 1));
  const kernels::sci::ListOrder order(host);
  kernels::sci::lane_layout(order, host_space_.data(), size_, rows_.offsets.get(), rows_.columns.get(),
                            rows_.elements.get(), rows_.places.get(), static_cast<std::uint32_t>(lanes), lane_ends.get(),
                            columns.get(), elements.get());
  upload(backend, stream, offsets_, rows_.offsets.get(), (size_ + 1) * 8, "selected-CI stored H: row offsets");
  upload(backend, stream, lane_ends_, lane_ends.get(), size_ * lanes * 4, "selected-CI stored H: lane ends");
  upload(backend, stream, columns_, columns.get(), total * 4, "selected-CI stored H: columns");
  upload(backend, stream, elements_, elements.get(), total * 8, "selected-CI stored H: elements");
  upload(backend, stream, diagonal_, rows_.diagonal.get(), size_ * 8, "selected-CI stored H: diagonal");
  stream.synchronize();  // (the host vectors above go with this scope)
}

void ResidentSpace::sigma(Stream& stream, const double* x, std::uint64_t first, std::uint64_t n, double* sigma,
                          double* diagonal, int vectors) const {
  if (vectors < 1 || vectors > kernels::kSciSigmaVectors)
    throw std::logic_error("ResidentSpace::sigma: 1 to kSciSigmaVectors vectors at once");
  if (stored_) {
    const bool cuda = stream.kind() == BackendKind::cuda;
    kernels::SciStoredSigma s{cuda ? offsets_.as<std::uint64_t>() : rows_.offsets.get(),
                              cuda ? lane_ends_.as<std::uint32_t>() : nullptr,
                              cuda ? columns_.as<std::uint32_t>() : rows_.columns.get(),
                              cuda ? elements_.as<double>() : rows_.elements.get(),
                              cuda ? diagonal_.as<double>() : rows_.diagonal.get(),
                              x,
                              first,
                              n,
                              sigma,
                              diagonal,
                              vectors,
                              size_,
                              n};
    kernels::sci_sigma_stored(stream, s);
    return;
  }
  for (int v = 0; v < vectors; ++v) {  // (enumerating: one vector at a time)
    kernels::SciSigma s{hamiltonian_->view(), nalpha_, nbeta_, space_.as<Det>(), size_, x + v * size_, first, n, sigma + v * n, diagonal};
    kernels::sci_sigma(stream, s);
  }
}

}  // namespace qstage::sci
