#pragma once
// MPI session and the few collectives qstage needs. All MPI calls happen on the main (I/O)
// thread, so MPI is initialised with MPI_THREAD_FUNNELED.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qstage::mpi {

// Initialises MPI for the process lifetime (finalises in the destructor) when a launcher started
// the process as a rank (mpirun, srun, any Slurm step); a process started on its own runs as one
// rank without MPI. Before MPI_Init it selects the MPI-IO component that works with chunked
// collective HDF5 writes on OpenMPI 4.1 (see docs/design.md, "MPI-IO"), unless the user set
// OMPI_MCA_io themselves.
class Session {
 public:
  Session(int* argc, char*** argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Seconds MPI_Init_thread took (0 when the process runs without MPI): the run's log reports it
  // with the rest of the start-up.
  static double init_seconds();
};

// Ends the whole job from this rank: `line` on stderr, the log flushed, then MPI_Abort with
// `exit_code`. For errors only this rank meets while the others wait in a collective: throwing
// would not reach them either, and unwinding can hang in a collective itself (an MPI-IO file's
// close is one).
[[noreturn]] void abort_job(const std::string& line, int exit_code);

// A communicator handle with the rank facts the runner needs. Does not own the MPI_Comm.
class Comm {
 public:
  explicit Comm(MPI_Comm comm = MPI_COMM_WORLD);
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the ranks on this host
  int local_size() const { return local_size_; }  // ranks on this host
  bool root() const { return rank_ == 0; }

  void barrier() const;
  // Broadcasts a string from rank 0 to every rank.
  std::string broadcast(std::string value) const;  // (moved through on one rank)
  std::uint64_t broadcast(std::uint64_t value) const;
  // Element-wise maximum / sum over ranks.
  std::vector<std::int64_t> max(std::vector<std::int64_t> values) const;
  std::vector<std::uint64_t> sum_wrapping(std::vector<std::uint64_t> values) const;  // mod 2^64
  double max(double value) const;
  // Gathers every rank's bytes on rank 0, in rank order (others get an empty vector; any size).
  std::vector<std::string> gather(std::string mine) const;
  // Every rank's bytes on every rank, in rank order (MPI_Allgatherv; each rank's part < 2 GiB).
  std::vector<std::string> allgather(const std::string& mine) const;
  // Agrees on an outcome: true on every rank if any rank passed true.
  bool any(bool mine) const;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// A communicator of its own over the ranks of `parent` that pass the same `color` (MPI_Comm_split,
// collective over parent), ordered as in parent and freed with this object.
class SubComm {
 public:
  SubComm(const Comm& parent, int color);
  ~SubComm();
  SubComm(const SubComm&) = delete;
  SubComm& operator=(const SubComm&) = delete;
  const Comm& comm() const { return comm_; }

 private:
  MPI_Comm raw_ = MPI_COMM_NULL;
  Comm comm_;
};

// Throws RuntimeFailure naming the call and MPI's error text unless rc is MPI_SUCCESS (errors
// return, not abort: Session sets MPI_ERRORS_RETURN).
void check(int rc, const char* what);

// True if MPI_Init has been called (commands like `inspect` never initialise MPI).
bool initialized();

}  // namespace qstage::mpi
