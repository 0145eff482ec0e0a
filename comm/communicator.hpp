#pragma once
// Moving data between ranks: one typed communicator for sample sort, slice redistribution and
// MPS bond ownership. A buffer says where it lives (HostSpan, DeviceSpan); host buffers go
// through MPI, device buffers on a cuda Stream through NCCL, and device buffers on the cpu
// backend (which are host memory) through MPI again. Counts and displacements are in elements,
// as 64-bit integers: MPI's int counts are never seen by the caller (see docs/design.md,
// "Exchange between ranks").
//
// Every call is collective over the communicator, and all MPI calls happen on the main thread
// (MPI is initialised FUNNELED). Ranks that share a GPU (more ranks than GPUs) exchange device
// buffers through pinned host memory and MPI instead of NCCL, which refuses a GPU twice.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backend/backend.hpp"
#include "core/mpi.hpp"

namespace qstage::comm {

enum class Where { host, device };

// A typed view of memory that knows where it lives. The tag is part of the type, so a device
// buffer cannot be handed to the host path by mistake. A span of T converts to a span of const T.
template <typename T, Where W>
class Span {
 public:
  Span() = default;
  Span(T* data, std::uint64_t size) : data_(data), size_(size) {}
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  Span(Span<U, W> other) : data_(other.data()), size_(other.size()) {}
  T* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  static constexpr Where where = W;

 private:
  T* data_ = nullptr;
  std::uint64_t size_ = 0;
};

template <typename T>
using HostSpan = Span<T, Where::host>;
template <typename T>
using DeviceSpan = Span<T, Where::device>;

// Views of a Backend's buffers. alloc_host memory is host memory; alloc_device memory is device
// memory (host memory on the cpu backend, which the stream's kind tells the communicator).
template <typename T>
HostSpan<T> host_span(const Buffer& buffer) {
  return {buffer.as<T>(), buffer.size() / sizeof(T)};
}
template <typename T>
DeviceSpan<T> device_span(const Buffer& buffer) {
  return {buffer.as<T>(), buffer.size() / sizeof(T)};
}

// One count per peer rank, in elements.
using Counts = std::vector<std::uint64_t>;

// Exclusive prefix sums: where each peer's block starts (peer 0's block first).
Counts displacements(const Counts& counts);

// What exchange() returns: the received elements in peer order, and how many came from each peer.
template <typename T>
struct Received {
  std::vector<T> data;
  Counts counts;
};

namespace detail {
class NcclComm;

// How one message of `bytes` is cut into MPI messages of at most `piece_bytes` (each fits an int).
// Both sides compute the same pieces from the same count, so they match message for message.
struct Pieces {
  std::uint64_t bytes = 0;
  std::uint64_t piece_bytes = 0;
  std::uint64_t count() const { return (bytes + piece_bytes - 1) / piece_bytes; }
  std::uint64_t offset(std::uint64_t i) const { return i * piece_bytes; }
  int size(std::uint64_t i) const;  // bytes in piece i: piece_bytes, less for the last
};
}  // namespace detail

class Communicator {
 public:
  // MPI messages are at most this long (1 GiB), far below INT_MAX bytes.
  static constexpr std::uint64_t kDefaultPieceBytes = std::uint64_t{1} << 30;

  // Duplicates comm's MPI communicator (collective), so its messages never match anyone
  // else's. `backend`, if given, is made current on this thread before NCCL starts (NCCL binds
  // its communicator to the current GPU). Without MPI initialised it is a communicator of one.
  explicit Communicator(const mpi::Comm& comm, Backend* backend = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The longest single MPI message; counts above it (and above INT_MAX) go in several pieces.
  // Only tests change it, to send many pieces with little data. 1 <= bytes <= INT_MAX.
  void set_piece_bytes(std::uint64_t bytes);
  std::uint64_t piece_bytes() const { return piece_bytes_; }

  // send_counts[p]: elements this rank sends to rank p. Returns recv_counts[p]: elements rank p
  // sends to this rank.
  Counts alltoall_counts(const Counts& send_counts) const;

  // All-to-all with counts per peer. send holds peer 0's block, then peer 1's, ...; so does
  // recv afterwards. recv_counts must be what the peers send (alltoall_counts gives them).
  template <typename S, typename T>
  void alltoallv(HostSpan<S> send, const Counts& send_counts, HostSpan<T> recv, const Counts& recv_counts) {
    check_types<S, T>();
    alltoallv_bytes(send.data(), in_bytes<T>(send_counts), recv.data(), in_bytes<T>(recv_counts),
                    capacity_bytes<T>(send.size()), capacity_bytes<T>(recv.size()), Where::host, nullptr);
  }
  // Device buffers, ordered on `stream`: on a cuda stream NCCL runs asynchronously on it (the
  // results are there once the stream gets past the exchange); on the cpu backend it is MPI
  // and done on return.
  template <typename S, typename T>
  void alltoallv(DeviceSpan<S> send, const Counts& send_counts, DeviceSpan<T> recv, const Counts& recv_counts,
                 Stream& stream) {
    check_types<S, T>();
    alltoallv_bytes(send.data(), in_bytes<T>(send_counts), recv.data(), in_bytes<T>(recv_counts),
                    capacity_bytes<T>(send.size()), capacity_bytes<T>(recv.size()), Where::device, &stream);
  }

  // Exchanges the counts, then the data: what a sample sort does once it knows where each
  // element goes.
  template <typename S, typename T = std::remove_const_t<S>>
  Received<T> exchange(HostSpan<S> send, const Counts& send_counts) {
    Received<T> out;
    out.counts = alltoall_counts(send_counts);
    std::uint64_t total = 0;
    for (std::uint64_t c : out.counts) total += c;
    out.data.resize(total);
    alltoallv(send, send_counts, HostSpan<T>(out.data.data(), total), out.counts);
    return out;
  }
  template <typename T>
  Received<T> exchange(const std::vector<T>& send, const Counts& send_counts) {
    return exchange(HostSpan<const T>(send.data(), send.size()), send_counts);
  }

  // Every rank's counts[r] elements into `out` on every rank, in rank order (this rank's are
  // counts[rank()] of `mine`; counts from allgather): device buffers ordered on `stream`, moved as
  // alltoallv moves them (NCCL, staged through the host, or MPI on the cpu backend), each rank's
  // block sent from the one place to every peer. Collective.
  template <typename T>
  void allgatherv(DeviceSpan<const T> mine, DeviceSpan<T> out, const Counts& counts, Stream& stream) {
    check_types<const T, T>();
    const Counts bytes = in_bytes<T>(counts);
    const std::uint64_t own = bytes.at(static_cast<std::size_t>(rank_));
    if (own > capacity_bytes<T>(mine.size()))
      throw std::logic_error("allgatherv: this rank's count exceeds its buffer");
    alltoallv_bytes(mine.data(), Counts(bytes.size(), own), out.data(), bytes, capacity_bytes<T>(mine.size()),
                    capacity_bytes<T>(out.size()), Where::device, &stream, Counts(bytes.size(), 0));
  }

  // Every rank's elements on every rank, in rank order, any number from each (the messages cut
  // into pieces as alltoallv's: no 2 GiB limit). Collective.
  template <typename T>
  Received<T> allgatherv(HostSpan<const T> mine) const {
    check_type<T>();
    Received<T> out;
    out.counts = allgather<std::uint64_t>(mine.size());
    std::uint64_t total = 0;
    for (const std::uint64_t c : out.counts) total += c;
    out.data.resize(total);
    allgatherv_bytes(mine.data(), in_bytes<T>(out.counts), out.data.data());
    return out;
  }

  // Every rank's value, in rank order.
  template <typename T>
  std::vector<T> allgather(const T& value) const {
    check_type<T>();
    std::vector<T> out(static_cast<std::size_t>(size_));
    allgather_bytes(&value, out.data(), sizeof(T));
    return out;
  }

  // Rank `root`'s values on every rank (sample sort's splitters); the other ranks' `values`
  // are ignored.
  template <typename T>
  std::vector<T> broadcast(std::vector<T> values, int root = 0) const {
    check_type<T>();
    const std::uint64_t n = broadcast_count(values.size(), root);
    values.resize(n);
    broadcast_bytes(values.data(), capacity_bytes<T>(n), root);
    return values;
  }

 private:
  template <typename T>
  static void check_type() {
    static_assert(std::is_trivially_copyable_v<T>, "ranks exchange elements as bytes");
  }
  template <typename S, typename T>
  static void check_types() {
    static_assert(std::is_same_v<std::remove_const_t<S>, T>, "send and receive elements differ");
    check_type<T>();
  }
  template <typename T>
  static std::uint64_t capacity_bytes(std::uint64_t elements) {
    if (elements > UINT64_MAX / sizeof(T)) throw std::logic_error("an exchange's byte count exceeds 2^64");
    return elements * sizeof(T);
  }
  template <typename T>
  static Counts in_bytes(Counts counts) {
    for (std::uint64_t& c : counts) c = capacity_bytes<T>(c);
    return counts;
  }

  // (send_at[p]: where peer p's block starts in `send`; empty: end to end, in peer order)
  void alltoallv_bytes(const void* send, const Counts& send_bytes, void* recv, const Counts& recv_bytes,
                       std::uint64_t send_capacity, std::uint64_t recv_capacity, Where where, Stream* stream,
                       Counts send_at = {});
  // (send_at[p]: where peer p's block starts in `send`)
  void mpi_alltoallv(const char* send, const Counts& send_bytes, const Counts& send_at, char* recv,
                     const Counts& recv_bytes) const;
  void allgatherv_bytes(const void* mine, const Counts& bytes, void* out) const;
  bool gpus_shared() const;
  void staged_alltoallv(const void* send, const Counts& send_bytes, const Counts& send_at, void* recv,
                        const Counts& recv_bytes, Stream& stream);
  void allgather_bytes(const void* value, void* out, std::size_t bytes) const;
  std::uint64_t broadcast_count(std::uint64_t count, int root) const;
  void broadcast_bytes(void* data, std::uint64_t bytes, int root) const;

  MPI_Comm comm_ = MPI_COMM_NULL;  // our duplicate; null when MPI is not initialised
  int rank_ = 0, size_ = 1;
  Backend* backend_ = nullptr;
  std::uint64_t piece_bytes_ = kDefaultPieceBytes;
  // Device exchanges on cuda: NCCL, or where ranks share a GPU (NCCL refuses that), staged
  // through host memory and MPI; decided by the first one (collective).
  enum class DevicePath { nccl, staged };
  std::optional<DevicePath> device_path_;
  std::unique_ptr<detail::NcclComm> nccl_;  // made by the first device exchange on a cuda stream
};

}  // namespace qstage::comm
