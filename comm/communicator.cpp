#include "comm/communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/nccl_comm.hpp"

namespace qstage::comm {
namespace {

// One tag for every message: the communicator is our own duplicate, and MPI keeps messages
// between two ranks with the same tag in order, so pieces arrive in the order they were sent.
constexpr int kTag = 17;

std::uint64_t total(const Counts& counts, const char* what) {
  std::uint64_t sum = 0;
  for (std::uint64_t c : counts) {
    if (sum + c < sum) throw std::logic_error(fmt::format("alltoallv's {} counts add up to more than 2^64", what));
    sum += c;
  }
  return sum;
}

}  // namespace

Counts displacements(const Counts& counts) {
  Counts at(counts.size());
  std::uint64_t sum = 0;
  for (std::size_t p = 0; p < counts.size(); ++p) {
    at[p] = sum;
    sum += counts[p];
  }
  return at;
}

int detail::Pieces::size(std::uint64_t i) const {
  return static_cast<int>(std::min(piece_bytes, bytes - offset(i)));
}

Communicator::Communicator(const mpi::Comm& comm, Backend* backend) : backend_(backend) {
  if (comm.get() == MPI_COMM_NULL) return;  // MPI not initialised: a communicator of one
  mpi::check(MPI_Comm_dup(comm.get(), &comm_), "MPI_Comm_dup");
  rank_ = comm.rank();
  size_ = comm.size();
}

Communicator::~Communicator() {
  nccl_.reset();  // before the MPI communicator it was set up over
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void Communicator::set_piece_bytes(std::uint64_t bytes) {
  if (bytes == 0 || bytes > static_cast<std::uint64_t>(INT_MAX))
    throw std::logic_error(fmt::format("an MPI piece must be 1 to {} bytes, not {}", INT_MAX, bytes));
  piece_bytes_ = bytes;
}

Counts Communicator::alltoall_counts(const Counts& send_counts) const {
  if (send_counts.size() != static_cast<std::size_t>(size_))
    throw std::logic_error(
        fmt::format("alltoall_counts needs one count per rank ({}), got {}", size_, send_counts.size()));
  if (comm_ == MPI_COMM_NULL) return send_counts;
  Counts recv_counts(send_counts.size());
  mpi::check(MPI_Alltoall(send_counts.data(), 1, MPI_UINT64_T, recv_counts.data(), 1, MPI_UINT64_T, comm_),
             "MPI_Alltoall");
  return recv_counts;
}

void Communicator::alltoallv_bytes(const void* send, const Counts& send_bytes, void* recv, const Counts& recv_bytes,
                                   std::uint64_t send_capacity, std::uint64_t recv_capacity, Where where,
                                   Stream* stream, Counts send_at) {
  if (send_bytes.size() != static_cast<std::size_t>(size_) || recv_bytes.size() != static_cast<std::size_t>(size_))
    throw std::logic_error(fmt::format("alltoallv needs one count per rank ({}), got {} send and {} receive counts",
                                       size_, send_bytes.size(), recv_bytes.size()));
  if (send_at.empty()) send_at = displacements(send_bytes);
  if (send_at.size() != send_bytes.size())
    throw std::logic_error(fmt::format("alltoallv needs one send offset per rank ({}), got {}", size_, send_at.size()));
  total(send_bytes, "send");  // (checks the sum)
  for (std::size_t p = 0; p < send_bytes.size(); ++p)
    if (send_at[p] + send_bytes[p] < send_at[p] || send_at[p] + send_bytes[p] > send_capacity)
      throw std::logic_error(
          fmt::format("alltoallv sends bytes [{}, +{}) from a buffer of {}", send_at[p], send_bytes[p], send_capacity));
  if (total(recv_bytes, "receive") > recv_capacity)
    throw std::logic_error(fmt::format("alltoallv receives {} bytes into a buffer of {}",
                                       total(recv_bytes, "receive"), recv_capacity));
  const auto self = static_cast<std::size_t>(rank_);
  if (send_bytes[self] != recv_bytes[self])
    throw std::logic_error(fmt::format("rank {} sends itself {} bytes but expects {}", rank_, send_bytes[self],
                                       recv_bytes[self]));
  if (where == Where::device && stream && stream->kind() == BackendKind::cuda) {
    if (!device_path_) device_path_ = gpus_shared() ? DevicePath::staged : DevicePath::nccl;
    if (*device_path_ == DevicePath::staged)
      return staged_alltoallv(send, send_bytes, send_at, recv, recv_bytes, *stream);
    if (!nccl_) {
      if (backend_) backend_->bind_thread();
      nccl_ = std::make_unique<detail::NcclComm>(comm_, rank_, size_);
    }
    nccl_->alltoallv(static_cast<const char*>(send), send_bytes, send_at, static_cast<char*>(recv), recv_bytes,
                     stream->native());
    return;
  }
  // Host memory, or the cpu backend's "device" memory (host memory too; its stream has already
  // run everything enqueued on it).
  mpi_alltoallv(static_cast<const char*>(send), send_bytes, send_at, static_cast<char*>(recv), recv_bytes);
}

// Whether two ranks of this communicator drive the same GPU (more ranks than GPUs on a host):
// NCCL refuses a communicator with a GPU twice, so their device exchanges go through the host.
bool Communicator::gpus_shared() const {
  if (comm_ == MPI_COMM_NULL || !backend_) return false;
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  mpi::check(MPI_Get_processor_name(host, &length), "MPI_Get_processor_name");
  const std::string mine = std::string(host, static_cast<std::size_t>(length)) + "/" + backend_->pci_bus_id();
  std::vector<std::string> all = mpi::Comm(comm_).allgather(mine);
  std::sort(all.begin(), all.end());
  return std::adjacent_find(all.begin(), all.end()) != all.end();
}

// Device buffers through pinned host memory and MPI, for ranks that share a GPU.
void Communicator::staged_alltoallv(const void* send, const Counts& send_bytes, const Counts& send_at, void* recv,
                                    const Counts& recv_bytes, Stream& stream) {
  // (the send buffer's span that the blocks cover, copied once: blocks may overlap, as an allgather's do)
  std::uint64_t first = UINT64_MAX, end = 0;
  for (std::size_t p = 0; p < send_bytes.size(); ++p)
    if (send_bytes[p]) first = std::min(first, send_at[p]), end = std::max(end, send_at[p] + send_bytes[p]);
  const std::uint64_t out = end > first ? end - first : 0, in = total(recv_bytes, "receive");
  Buffer host_send = backend_->alloc_host(std::max<std::uint64_t>(out, 1), "all-to-all staging (ranks share a GPU)");
  Buffer host_recv = backend_->alloc_host(std::max<std::uint64_t>(in, 1), "all-to-all staging (ranks share a GPU)");
  if (out) backend_->copy_to_host(host_send.data(), static_cast<const char*>(send) + first, out, stream);
  stream.synchronize();
  Counts at(send_at.size(), 0);
  for (std::size_t p = 0; p < at.size(); ++p)
    if (send_bytes[p]) at[p] = send_at[p] - first;
  mpi_alltoallv(static_cast<const char*>(host_send.data()), send_bytes, at, static_cast<char*>(host_recv.data()),
                recv_bytes);
  if (in) backend_->copy_to_device(recv, host_recv.data(), in, stream);
  stream.synchronize();  // (the staging goes now)
}

void Communicator::mpi_alltoallv(const char* send, const Counts& send_bytes, const Counts& send_at, char* recv,
                                 const Counts& recv_bytes) const {
  const Counts recv_at = displacements(recv_bytes);
  const auto self = static_cast<std::size_t>(rank_);
  if (send_bytes[self] > 0) std::memcpy(recv + recv_at[self], send + send_at[self], send_bytes[self]);
  // Pairwise rounds: in round r every rank sends to rank + r and receives from rank - r, so each
  // round's messages pair up, and messages go in the same order on every run. Each message is
  // cut into pieces that fit MPI's int count.
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;
  for (int round = 1; round < size_; ++round) {
    const int to = (rank_ + round) % size_, from = (rank_ - round + size_) % size_;
    const detail::Pieces in{recv_bytes[static_cast<std::size_t>(from)], piece_bytes_};
    const detail::Pieces out{send_bytes[static_cast<std::size_t>(to)], piece_bytes_};
    requests.assign(in.count() + out.count(), MPI_REQUEST_NULL);
    for (std::uint64_t i = 0; i < in.count(); ++i)
      mpi::check(MPI_Irecv(recv + recv_at[static_cast<std::size_t>(from)] + in.offset(i), in.size(i), MPI_BYTE,
                           from, kTag, comm_, &requests[i]),
                 "MPI_Irecv");
    for (std::uint64_t i = 0; i < out.count(); ++i)
      mpi::check(MPI_Isend(send + send_at[static_cast<std::size_t>(to)] + out.offset(i), out.size(i), MPI_BYTE, to,
                           kTag, comm_, &requests[in.count() + i]),
                 "MPI_Isend");
    statuses.resize(requests.size());
    mpi::check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), statuses.data()), "MPI_Waitall");
    // A sender that sends less than the receiver expects would otherwise leave a gap unnoticed.
    for (std::uint64_t i = 0; i < in.count(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != in.size(i))
        throw std::logic_error(fmt::format("rank {} expected {} bytes from rank {} in piece {} but got {}", rank_,
                                           in.size(i), from, i, got));
    }
  }
}

// An all-to-all whose every block is this rank's bytes: the same pairwise rounds and pieces.
void Communicator::allgatherv_bytes(const void* mine, const Counts& bytes, void* out) const {
  const auto self = static_cast<std::size_t>(rank_);
  mpi_alltoallv(static_cast<const char*>(mine), Counts(bytes.size(), bytes[self]), Counts(bytes.size(), 0),
                static_cast<char*>(out), bytes);
}

void Communicator::allgather_bytes(const void* value, void* out, std::size_t bytes) const {
  if (comm_ == MPI_COMM_NULL) {
    std::memcpy(out, value, bytes);
    return;
  }
  if (bytes > static_cast<std::size_t>(INT_MAX)) throw std::logic_error("allgather of a value over 2 GiB");
  mpi::check(MPI_Allgather(value, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_),
             "MPI_Allgather");
}

std::uint64_t Communicator::broadcast_count(std::uint64_t count, int root) const {
  if (root < 0 || root >= size_) throw std::logic_error(fmt::format("broadcast from rank {} of {}", root, size_));
  if (comm_ != MPI_COMM_NULL) mpi::check(MPI_Bcast(&count, 1, MPI_UINT64_T, root, comm_), "MPI_Bcast");
  return count;
}

void Communicator::broadcast_bytes(void* data, std::uint64_t bytes, int root) const {
  if (comm_ == MPI_COMM_NULL) return;
  const detail::Pieces pieces{bytes, piece_bytes_};
  for (std::uint64_t i = 0; i < pieces.count(); ++i)
    mpi::check(MPI_Bcast(static_cast<char*>(data) + pieces.offset(i), pieces.size(i), MPI_BYTE, root, comm_),
               "MPI_Bcast");
}

}  // namespace qstage::comm
