#pragma once
// The NCCL side of comm::Communicator: device buffers on a cuda stream. Declared in every build;
// without NCCL (no CUDA, or no libnccl found) making one throws, so a device exchange on a cuda
// stream fails with one line instead of falling back to something slower unnoticed.
#include <mpi.h>

#include <cstdint>
#include <vector>

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace qstage::comm::detail {

class NcclComm {
 public:
  // Collective over `comm`: rank 0 makes the NCCL id and broadcasts it over MPI. The calling
  // thread's current CUDA device is the one NCCL uses.
  NcclComm(MPI_Comm comm, int rank, int size);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Byte counts per peer; the blocks sent at send_at (they may overlap), those received at the
  // exclusive prefix sums of their counts. Enqueued on `stream` (a cudaStream_t) and asynchronous.
  void alltoallv(const char* send, const std::vector<std::uint64_t>& send_bytes,
                 const std::vector<std::uint64_t>& send_at, char* recv, const std::vector<std::uint64_t>& recv_bytes,
                 void* stream);

 private:
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace qstage::comm::detail
