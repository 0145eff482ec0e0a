#include "comm/nccl_comm.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/mpi.hpp"

#ifdef QSTAGE_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "backend/cuda_check.hpp"

namespace qstage::comm::detail {
namespace {

void check(ncclResult_t rc, const char* call) {
  if (rc != ncclSuccess) throw RuntimeFailure(fmt::format("NCCL {} failed: {}", call, ncclGetErrorString(rc)));
}

}  // namespace

NcclComm::NcclComm(MPI_Comm comm, int rank, int size) : rank_(rank), size_(size) {
  // NVLink multicast (NVLS) must stay off: the GPU machines qstage runs its multi-GPU tests on
  // require it. A user who sets the variable keeps their value.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (comm != MPI_COMM_NULL) mpi::check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm), "MPI_Bcast");
  check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::alltoallv(const char* send, const std::vector<std::uint64_t>& send_bytes,
                         const std::vector<std::uint64_t>& send_at, char* recv,
                         const std::vector<std::uint64_t>& recv_bytes, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  const Counts recv_at = displacements(recv_bytes);
  const auto self = static_cast<std::size_t>(rank_);
  // NCCL counts are size_t, so no pieces; the block to ourselves is a copy on the stream.
  check(ncclGroupStart(), "ncclGroupStart");
  try {
    for (std::size_t p = 0; p < send_bytes.size(); ++p) {
      const char* block = send + send_at[p];
      if (p == self) {
        if (send_bytes[p] > 0)
          QSTAGE_CUDA_CHECK(cudaMemcpyAsync(recv + recv_at[p], block, send_bytes[p], cudaMemcpyDeviceToDevice, s));
        continue;
      }
      // A zero count is skipped on both sides (the counts agree), so no empty message is posted.
      if (send_bytes[p] > 0)
        check(ncclSend(block, send_bytes[p], ncclUint8, static_cast<int>(p), comm_, s), "ncclSend");
      if (recv_bytes[p] > 0)
        check(ncclRecv(recv + recv_at[p], recv_bytes[p], ncclUint8, static_cast<int>(p), comm_, s), "ncclRecv");
    }
  } catch (...) {
    ncclGroupEnd();  // close the group, so the thread's next NCCL call is not inside it
    throw;
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
}

}  // namespace qstage::comm::detail

#else

namespace qstage::comm::detail {

// This build has no NCCL, so device buffers on a cuda stream cannot be exchanged.
NcclComm::NcclComm(MPI_Comm, int, int) {
  throw RuntimeFailure("exchanging device buffers on a cuda stream needs NCCL, and this build of qstage has none");
}
NcclComm::~NcclComm() = default;
void NcclComm::alltoallv(const char*, const std::vector<std::uint64_t>&, const std::vector<std::uint64_t>&, char*,
                         const std::vector<std::uint64_t>&, void*) {
  throw RuntimeFailure("exchanging device buffers on a cuda stream needs NCCL, and this build of qstage has none");
}

}  // namespace qstage::comm::detail

#endif
