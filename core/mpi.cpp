#include "core/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "core/error.hpp"

namespace qstage::mpi {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw RuntimeFailure(std::string("MPI ") + what + " failed: " + std::string(text, static_cast<size_t>(len)));
  }
}

namespace {

double init_seconds_ = 0;

// Whether a launcher started this process as a rank of a job (OpenMPI's mpirun, PMIx or PMI
// launchers such as srun and MPICH's hydra, any Slurm step): the variables they set.
bool launched_as_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID"})
    if (std::getenv(name)) return true;
  return false;
}

}  // namespace

double Session::init_seconds() { return init_seconds_; }

Session::Session(int* argc, char*** argv) {
  // A process started on its own is a job of one rank: MPI_Init would start OpenMPI's singleton
  // runtime (0.3 s of a small run's 0.9 s here) for no communication. Without it every
  // communicator is one of a single rank and HDF5 opens files without MPI-IO, as it does for
  // one rank anyway: the same bytes.
  if (!launched_as_rank()) return;
  // OpenMPI 4.1: OMPIO's default collective component (vulcan) has hung and corrupted chunked
  // HDF5 collective writes (HDFGroup/hdf5#1227, open-mpi/ompi#12718), and ROMIO 3.2.1 in 4.x
  // segfaults on some of them (ompi#7795). OMPIO with the two_phase component passes our
  // 3-rank chunked read/write test; users can still override both variables.
  setenv("OMPI_MCA_io", "ompio", 0);
  setenv("OMPI_MCA_fcoll", "two_phase", 0);
  int provided = 0;
  const auto started = std::chrono::steady_clock::now();
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  init_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Session::~Session() {
  if (!initialized()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

void abort_job(const std::string& line, int exit_code) {
  std::fprintf(stderr, "%s\n", line.c_str());
  spdlog::default_logger()->flush();
  if (initialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // (MPI_Abort does not return; this is for the compiler)
}

Comm::Comm(MPI_Comm comm) : comm_(comm) {
  if (!initialized()) {
    comm_ = MPI_COMM_NULL;
    return;
  }
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm local;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

namespace {
MPI_Comm split(const Comm& parent, int color) {
  MPI_Comm out = MPI_COMM_NULL;
  if (parent.get() == MPI_COMM_NULL) return out;  // (MPI not initialised: a group of one)
  check(MPI_Comm_split(parent.get(), color, parent.rank(), &out), "MPI_Comm_split");
  return out;
}
}  // namespace

SubComm::SubComm(const Comm& parent, int color) : raw_(split(parent, color)), comm_(raw_) {}

SubComm::~SubComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (raw_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&raw_);
}

void Comm::barrier() const {
  if (size_ > 1) check(MPI_Barrier(comm_), "MPI_Barrier");
}

std::string Comm::broadcast(std::string value) const {
  if (size_ == 1) return value;
  std::uint64_t n = broadcast(static_cast<std::uint64_t>(value.size()));
  std::string out = rank_ == 0 ? std::move(value) : std::string(n, '\0');
  // (in pieces: MPI counts are ints, and a run's state, an MPS, may pass 2 GiB)
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 30;
  for (std::uint64_t at = 0; at < n; at += kPiece)
    check(MPI_Bcast(out.data() + at, static_cast<int>(std::min(kPiece, n - at)), MPI_CHAR, 0, comm_), "MPI_Bcast");
  return out;
}

std::uint64_t Comm::broadcast(std::uint64_t value) const {
  if (size_ > 1) check(MPI_Bcast(&value, 1, MPI_UINT64_T, 0, comm_), "MPI_Bcast");
  return value;
}

std::vector<std::int64_t> Comm::max(std::vector<std::int64_t> values) const {
  if (size_ > 1)
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, MPI_MAX, comm_),
          "MPI_Allreduce");
  return values;
}

std::vector<std::uint64_t> Comm::sum_wrapping(std::vector<std::uint64_t> values) const {
  // Unsigned addition wraps modulo 2^64 in C, and MPI_SUM on MPI_UINT64_T is that addition.
  if (size_ > 1)
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_UINT64_T, MPI_SUM, comm_),
          "MPI_Allreduce");
  return values;
}

double Comm::max(double value) const {
  if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce");
  return value;
}

// Rank 0 receives each rank's bytes in rank order, in pieces: MPI counts are ints, and a round's
// record (its output rows, the fold of a large result) may pass 2 GiB, where MPI_Gatherv's int
// counts and displacements wrapped.
std::vector<std::string> Comm::gather(std::string mine) const {
  if (size_ == 1) return {std::move(mine)};
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 30;
  constexpr int kTag = 4711;  // (this communicator's only point-to-point messages)
  std::uint64_t n = mine.size();
  std::vector<std::uint64_t> sizes(rank_ == 0 ? static_cast<size_t>(size_) : 0);
  check(MPI_Gather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, 0, comm_), "MPI_Gather");
  if (rank_ != 0) {
    for (std::uint64_t at = 0; at < n; at += kPiece)
      check(MPI_Send(mine.data() + at, static_cast<int>(std::min(kPiece, n - at)), MPI_CHAR, 0, kTag, comm_),
            "MPI_Send");
    return {};
  }
  std::vector<std::string> out(static_cast<size_t>(size_));
  out[0] = std::move(mine);
  for (int r = 1; r < size_; ++r) {
    std::string& in = out[static_cast<size_t>(r)];
    in.resize(sizes[static_cast<size_t>(r)]);
    for (std::uint64_t at = 0; at < in.size(); at += kPiece)
      check(MPI_Recv(in.data() + at, static_cast<int>(std::min<std::uint64_t>(kPiece, in.size() - at)), MPI_CHAR, r,
                     kTag, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv");
  }
  return out;
}

std::vector<std::string> Comm::allgather(const std::string& mine) const {
  if (size_ == 1) return {mine};
  if (mine.size() > static_cast<std::size_t>(INT32_MAX))
    throw RuntimeFailure("MPI allgather: " + std::to_string(mine.size()) + " bytes from one rank; at most 2^31 - 1 are supported");
  const int n = static_cast<int>(mine.size());
  std::vector<int> sizes(static_cast<size_t>(size_));
  check(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  std::vector<int> offsets(sizes.size());
  std::int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets[i] = static_cast<int>(total);
    total += sizes[i];
    if (total > INT32_MAX)
      throw RuntimeFailure("MPI allgather: " + std::to_string(total) + " bytes in all; at most 2^31 - 1 are supported");
  }
  std::string all(static_cast<size_t>(total), '\0');
  check(MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR, comm_),
        "MPI_Allgatherv");
  std::vector<std::string> out;
  for (size_t i = 0; i < sizes.size(); ++i)
    out.push_back(all.substr(static_cast<size_t>(offsets[i]), static_cast<size_t>(sizes[i])));
  return out;
}

bool Comm::any(bool mine) const { return max(std::vector<std::int64_t>{mine ? 1 : 0})[0] != 0; }

}  // namespace qstage::mpi
