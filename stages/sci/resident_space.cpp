#include "stages/sci/resident_space.hpp"

#include <chrono>
#include <limits>
#include <optional>

#include "kernels/sci_generate.hpp"
#include "kernels/sci_space_pairs.hpp"

namespace qstage::sci {

using kernels::sci::Det;

ResidentSpace::ResidentSpace(Backend& backend, const Integrals& ints, const ExcitationTables& tables, int nalpha,
                             int nbeta, const std::vector<Det>& space, std::uint64_t stored_limit,
                             std::unique_ptr<ResidentSpace> previous)
    : nalpha_(nalpha), nbeta_(nbeta), size_(space.size()) {
  const auto started = std::chrono::steady_clock::now();
  auto stream = backend.make_stream();
  hamiltonian_ = std::make_unique<ResidentHamiltonian>(backend, *stream, ints, tables);
  space_ = backend.alloc_device(std::max<std::uint64_t>(size_, 1) * sizeof(Det), "selected-CI space");
  backend.copy_to_device(space_.data(), space.data(), size_ * sizeof(Det), *stream);
  bytes_ = ResidentHamiltonian::bytes(ints, tables) + space_.size();
  store(backend, *stream, stored_limit, previous && previous->can_seed_growth() ? previous.get() : nullptr);
  stream->synchronize();
  build_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void ResidentSpace::store(Backend& backend, Stream& stream, std::uint64_t stored_limit, const ResidentSpace* previous) {
  // (columns are 32-bit; a space of 2^32 determinants or more enumerates)
  if (size_ == 0 || size_ >= std::numeric_limits<std::uint32_t>::max()) return;
  const bool host = backend.kind() == BackendKind::cpu;
  const std::uint64_t lanes = kernels::sci_lane_ends_per_row(backend.kind());
  const std::uint64_t fixed = (size_ + 1) * 8 + size_ * lanes * 4 + size_ * 8;  // offsets, lane ends, diagonal
  if (fixed > stored_limit) return;
  std::optional<kernels::sci::CouplingsUpdate> update;
  kernels::sci::CouplingsUpdate::Stored before;
  if (previous) {
    update.emplace(hamiltonian_->view(), nalpha_, nbeta_, previous->space_.as<Det>(), previous->size_, space_.as<Det>(), size_);
    if (!update->contains_previous()) update.reset();
    before = {previous->offsets_.as<std::uint64_t>(), previous->columns_.as<std::uint32_t>(),
              previous->places_.as<std::uint32_t>(), previous->elements_.as<double>(), previous->diagonal_.as<double>()};
  }
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
  c.counts = offsets.as<std::uint64_t>();
  c.lane_ends = lane_ends.as<std::uint32_t>();
  if (update) update->count(before, c.counts);
  else kernels::sci_couplings_count(stream, c);
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
  const std::uint64_t bytes = fixed + total * (host ? 16 : 12);  // (the host keeps each entry's place)
  if (bytes > stored_limit) return;
  backend.copy_to_device(offsets.data(), at.data(), (size_ + 1) * 8, stream);
  columns_ = backend.alloc_device(std::max<std::uint64_t>(total * 4, 4), "selected-CI stored H: columns");
  elements_ = backend.alloc_device(std::max<std::uint64_t>(total * 8, 8), "selected-CI stored H: elements");
  diagonal_ = backend.alloc_device(size_ * 8, "selected-CI stored H: diagonal");
  c.offsets = offsets.as<std::uint64_t>();
  c.columns = columns_.as<std::uint32_t>();
  c.elements = elements_.as<double>();
  c.diagonal = diagonal_.as<double>();
  if (host) {
    places_ = backend.alloc_device(std::max<std::uint64_t>(total * 4, 4), "selected-CI stored H: places");
    c.places = places_.as<std::uint32_t>();
  }
  if (update) {
    update->write(before, c.offsets, c.columns, c.elements, c.places, c.diagonal);
    grown_ = true;
    grown_by_ = update->new_determinants();
  } else {
    kernels::sci_couplings_write(stream, c);
  }
  stream.synchronize();  // (the host scan above goes with this scope)
  offsets_ = std::move(offsets);
  lane_ends_ = std::move(lane_ends);
  stored_ = true;
  entries_ = total;
  bytes_ += offsets_.size() + lane_ends_.size() + columns_.size() + elements_.size() + diagonal_.size() + places_.size();
}

void ResidentSpace::sigma(Stream& stream, const double* x, std::uint64_t first, std::uint64_t n, double* sigma,
                          double* diagonal) const {
  if (stored_) {
    kernels::SciStoredSigma s{offsets_.as<std::uint64_t>(), lane_ends_.as<std::uint32_t>(), columns_.as<std::uint32_t>(),
                              elements_.as<double>(),       diagonal_.as<double>(),       x,
                              first,                        n,                            sigma,
                              diagonal};
    kernels::sci_sigma_stored(stream, s);
    return;
  }
  kernels::SciSigma s{hamiltonian_->view(), nalpha_, nbeta_, space_.as<Det>(), size_, x, first, n, sigma, diagonal};
  kernels::sci_sigma(stream, s);
}

}  // namespace qstage::sci
