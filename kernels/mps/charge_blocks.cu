#include <cuComplex.h>
#include <cusolverDn.h>
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <limits>
#include <type_traits>

#include "backend/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/mps/charge_blocks.hpp"

namespace qstage::kernels::detail {
namespace {

void cusolver_check(cusolverStatus_t rc, const char* call, const char* file, int line) {
  if (rc != CUSOLVER_STATUS_SUCCESS) ::qstage::detail::throw_cuda_error(call, file, line, fmt::format("cusolver status {}", int(rc)).c_str());
}
#define QSTAGE_CUSOLVER_CHECK(call) cusolver_check((call), #call, __FILE__, __LINE__)

// The CUDA types and library calls of each precision: Cu<T>::type is T's CUDA complex type.
template <typename T>
struct Cu;
template <>
struct Cu<cplx128> {
  using type = cuDoubleComplex;
  static constexpr auto gemm = cublasZgemm;
  static constexpr auto gesvdj_buffer_size = cusolverDnZgesvdj_bufferSize;
  static constexpr auto gesvdj = cusolverDnZgesvdj;
  static constexpr cudaDataType data = CUDA_C_64F, real = CUDA_R_64F;
  static type make(double re, double im) { return make_cuDoubleComplex(re, im); }
};
template <>
struct Cu<cplx64> {
  using type = cuFloatComplex;
  static constexpr auto gemm = cublasCgemm;
  static constexpr auto gesvdj_buffer_size = cusolverDnCgesvdj_bufferSize;
  static constexpr auto gesvdj = cusolverDnCgesvdj;
  static constexpr cudaDataType data = CUDA_C_32F, real = CUDA_R_32F;
  static type make(double re, double im) { return make_cuFloatComplex(static_cast<float>(re), static_cast<float>(im)); }
};
template <typename T>
using CuT = typename Cu<T>::type;

template <typename T>
CuT<T>* z(T* p) { return reinterpret_cast<CuT<T>*>(p); }
template <typename T>
const CuT<T>* z(const T* p) { return reinterpret_cast<const CuT<T>*>(p); }

// Complex arithmetic of either CUDA type, in its own precision.
__device__ inline cuDoubleComplex add(cuDoubleComplex a, cuDoubleComplex b) { return cuCadd(a, b); }
__device__ inline cuDoubleComplex mul(cuDoubleComplex a, cuDoubleComplex b) { return cuCmul(a, b); }
__device__ inline cuFloatComplex add(cuFloatComplex a, cuFloatComplex b) { return cuCaddf(a, b); }
__device__ inline cuFloatComplex mul(cuFloatComplex a, cuFloatComplex b) { return cuCmulf(a, b); }
__device__ inline cuDoubleComplex scaled(cuDoubleComplex a, double f) { return make_cuDoubleComplex(cuCreal(a) * f, cuCimag(a) * f); }
__device__ inline cuFloatComplex scaled(cuFloatComplex a, double f) {
  const float g = static_cast<float>(f);
  return make_cuFloatComplex(cuCrealf(a) * g, cuCimagf(a) * g);
}

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

// Up to kScatters destinations of one product, by value (32 bytes each: 8 KiB of kernel
// parameters, within the 32 KiB CUDA 12.1+ allows). A density matrix's product goes to up to d^2
// new centre charges (225 at d = 15): one launch each then, where 16 a launch made the launches,
// not the arithmetic, Theta's cost at chi 8192.
constexpr int kScatters = 256;
template <typename C>
struct Scatters {
  std::int64_t offset[kScatters], ld[kScatters];
  C u[kScatters];
  int count;
};

template <typename C>
__global__ void scatter_kernel(const C* p, std::int64_t m, std::int64_t n, Scatters<C> s, C* c) {
  const std::int64_t total = m * n, stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t r = e / n, col = e - r * n;
    const C v = p[e];
    for (int i = 0; i < s.count; ++i) {
      C& dst = c[s.offset[i] + r * s.ld[i] + col];
      dst = add(dst, mul(s.u[i], v));
    }
  }
}

template <typename C>
__global__ void scale_rows_kernel(const C* a, const double* scale, std::int64_t rows, std::int64_t cols, C* out) {
  const std::int64_t total = rows * cols, stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
    out[e] = scaled(a[e], scale[e / cols]);
}

cublasHandle_t blas(Stream& stream) {
  auto h = static_cast<cublasHandle_t>(stream.blas_handle());
  if (!h) throw std::logic_error("charge_blocks: the stream has no cuBLAS handle (make_stream(true))");
  QSTAGE_CUDA_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.native())));
  return h;
}

// One cuSOLVER handle, Jacobi configuration and 64-bit API parameters per host thread (the device
// is the thread's).
struct Solver {
  cusolverDnHandle_t handle = nullptr;
  gesvdjInfo_t jacobi = nullptr;
  cusolverDnParams_t params = nullptr;
  Solver() {
    QSTAGE_CUSOLVER_CHECK(cusolverDnCreate(&handle));
    QSTAGE_CUSOLVER_CHECK(cusolverDnCreateGesvdjInfo(&jacobi));
    // The defaults (tolerance: machine precision; 100 sweeps), written out so they are on record.
    QSTAGE_CUSOLVER_CHECK(cusolverDnXgesvdjSetTolerance(jacobi, 0.0));
    QSTAGE_CUSOLVER_CHECK(cusolverDnXgesvdjSetMaxSweeps(jacobi, 100));
    QSTAGE_CUSOLVER_CHECK(cusolverDnCreateParams(&params));
  }
  ~Solver() {
    cusolverDnDestroyParams(params);
    cusolverDnDestroyGesvdjInfo(jacobi);
    cusolverDnDestroy(handle);
  }
};
Solver& solver(Stream& stream) {
  thread_local Solver s;
  QSTAGE_CUSOLVER_CHECK(cusolverDnSetStream(s.handle, static_cast<cudaStream_t>(stream.native())));
  return s;
}

// complex64 keeps to Jacobi: gesvdp's perturbation of rank-deficient blocks scales with the
// precision's square root (2e-10 of the largest value in complex128, measured), too coarse in float.
template <typename T>
SvdRouting routed(SvdRouting r) {
  if constexpr (std::is_same_v<T, cplx64>) r.polar_from = std::numeric_limits<std::int64_t>::max();
  return r;
}

enum class Path { host, jacobi, polar };
Path path_of(const SvdProblem& p, SvdRouting r) {
  if (p.host) return Path::host;
  const double f = static_cast<double>(r.gpu_from);
  if (static_cast<double>(p.m) * p.n * std::min(p.m, p.n) < f * f * f) return Path::host;
  return std::min(p.m, p.n) >= r.polar_from ? Path::polar : Path::jacobi;
}

// The row-major m x n A is the column-major n x m A^T; its left vectors (n x r, column-major) are
// Vh (r x n, row-major): both GPU paths write them straight to vh, and the right ones (m x r) to
// the workspace.
// Jacobi's work array for p, in elements.
template <typename T>
int jacobi_lwork(Solver& s, const SvdProblem& p) {
  int lwork = 0;
  const int rows = static_cast<int>(p.n), cols = static_cast<int>(p.m);
  QSTAGE_CUSOLVER_CHECK(Cu<T>::gesvdj_buffer_size(s.handle, CUSOLVER_EIG_MODE_VECTOR, 1, rows, cols, nullptr, rows,
                                                    nullptr, nullptr, rows, nullptr, cols, &lwork, s.jacobi));
  return lwork;
}
// gesvdp's device and host work arrays for p, in bytes.
template <typename T>
std::pair<std::size_t, std::size_t> polar_work(Solver& s, const SvdProblem& p) {
  std::size_t device = 0, host = 0;
  QSTAGE_CUSOLVER_CHECK(cusolverDnXgesvdp_bufferSize(s.handle, s.params, CUSOLVER_EIG_MODE_VECTOR, 1, p.n, p.m, Cu<T>::data,
                                                     nullptr, p.n, Cu<T>::real, nullptr, Cu<T>::data, nullptr, p.n,
                                                     Cu<T>::data, nullptr, p.m, Cu<T>::data, &device, &host));
  return {device, host};
}

struct Layout {
  std::size_t a_copy = 0, v = 0, work = 0, info = 0, total = 0;
  std::size_t host_work = 0;  // gesvdp's host array (bytes)
};
// The workspace: a copy of the largest A (the GPU paths overwrite their input; the original stays
// for the fallback), its right vectors, the largest work array, and one info per problem.
template <typename T>
Layout layout(Solver& s, const std::vector<SvdProblem>& problems, SvdRouting routing) {
  std::int64_t a = 0, v = 0, count = 0;
  std::size_t work = 0, host_work = 0;
  for (const auto& p : problems) {
    if (p.m == 0 || p.n == 0) continue;
    const Path path = path_of(p, routing);
    if (path == Path::host) continue;
    a = std::max(a, p.m * p.n);
    v = std::max(v, p.m * std::min(p.m, p.n));
    if (path == Path::jacobi) {
      work = std::max(work, jacobi_lwork<T>(s, p) * sizeof(T));
    } else {
      const auto [device, host] = polar_work<T>(s, p);
      work = std::max(work, device), host_work = std::max(host_work, host);
    }
    ++count;
  }
  auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
  Layout l;
  l.a_copy = 0;
  l.v = up(l.a_copy + a * sizeof(T));
  l.work = up(l.v + v * sizeof(T));
  l.info = up(l.work + work);
  l.total = count == 0 ? 0 : up(l.info + count * sizeof(int));
  l.host_work = host_work;
  return l;
}

// Problems solved on the host: their blocks copied out (download), solved (solve: LAPACK, no
// device work, so it may run beside the GPU's problems) and S and Vh copied back (upload).
template <typename T>
struct HostShare {
  std::vector<SvdProblem> problems, local;  // where they are on the device; in the host copies
  std::vector<T> a, vh;
  std::vector<Real<T>> s;

  HostShare(Stream& stream, const T* da, std::vector<SvdProblem> ps) : problems(std::move(ps)) {
    if (problems.empty()) return;
    auto st = static_cast<cudaStream_t>(stream.native());
    std::int64_t a_size = 0, s_size = 0, vh_size = 0;
    for (const auto& p : problems) {
      const std::int64_t r = std::min(p.m, p.n);
      local.push_back({p.m, p.n, a_size, s_size, vh_size});
      a_size += p.m * p.n, s_size += r, vh_size += r * p.n;
    }
    a.resize(a_size), vh.resize(vh_size), s.resize(s_size);
    for (std::size_t i = 0; i < problems.size(); ++i)
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(a.data() + local[i].offset, da + problems[i].offset, problems[i].m * problems[i].n * sizeof(T),
                                        cudaMemcpyDeviceToHost, st));
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  void solve() {
    if (!problems.empty()) svd_on_host(a.data(), local, s.data(), vh.data());
  }
  void upload(Stream& stream, Real<T>* ds, T* dvh) {
    if (problems.empty()) return;
    auto st = static_cast<cudaStream_t>(stream.native());
    for (std::size_t i = 0; i < problems.size(); ++i) {
      const std::int64_t r = std::min(problems[i].m, problems[i].n);
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(ds + problems[i].s_offset, s.data() + local[i].s_offset, r * sizeof(Real<T>),
                                        cudaMemcpyHostToDevice, st));
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(dvh + problems[i].vh_offset, vh.data() + local[i].vh_offset, r * problems[i].n * sizeof(T),
                                        cudaMemcpyHostToDevice, st));
    }
    // (the host vectors must outlive the copies)
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
};

// Copies problems to the host, solves them there, and copies S and Vh back.
template <typename T>
void solve_on_host(Stream& stream, const T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh) {
  HostShare<T> share(stream, a, problems);
  share.solve();
  share.upload(stream, s, vh);
}

}  // namespace

template <typename T>
void charge_products_cuda(Stream& stream, const T* sites, const std::vector<ChargeProduct>& products,
                          const std::vector<ChargeScatter>& scatters, T* c, std::int64_t c_size, T* scratch) {
  cublasHandle_t h = blas(stream);
  auto st = static_cast<cudaStream_t>(stream.native());
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(c, 0, c_size * sizeof(T), st));
  const CuT<T> one = Cu<T>::make(1, 0), zero = Cu<T>::make(0, 0);
  for (const ChargeProduct& p : products) {
    if (p.count == 0 || p.m == 0 || p.n == 0) continue;
    // Row-major P = X Y is column-major P^T = Y^T X^T.
    QSTAGE_CUDA_CHECK(Cu<T>::gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
                                  static_cast<int>(p.k), &one, z(sites + p.y), static_cast<int>(p.n), z(sites + p.x),
                                  static_cast<int>(p.k), &zero, z(scratch), static_cast<int>(p.n)));
    for (std::int64_t first = p.first; first < p.first + p.count; first += kScatters) {
      Scatters<CuT<T>> s{};
      s.count = static_cast<int>(std::min<std::int64_t>(kScatters, p.first + p.count - first));
      for (int i = 0; i < s.count; ++i) {
        s.offset[i] = scatters[first + i].offset;
        s.ld[i] = scatters[first + i].ld;
        s.u[i] = Cu<T>::make(scatters[first + i].u.real(), scatters[first + i].u.imag());
      }
      scatter_kernel<<<blocks_for(p.m * p.n), kThreads, 0, st>>>(z(scratch), p.m, p.n, s, z(c));
      QSTAGE_CUDA_CHECK_LAUNCH();
    }
  }
}

template <typename T>
void scale_rows_cuda(Stream& stream, const T* a, const double* scale, const std::vector<ScaledRows>& matrices, T* out) {
  auto st = static_cast<cudaStream_t>(stream.native());
  for (const ScaledRows& x : matrices) {
    if (x.rows == 0 || x.cols == 0) continue;
    scale_rows_kernel<<<blocks_for(x.rows * x.cols), kThreads, 0, st>>>(z(a + x.offset), scale + x.scale_offset, x.rows,
                                                                          x.cols, z(out + x.offset));
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
std::size_t svd_workspace_bytes_cuda(Stream& stream, const std::vector<SvdProblem>& problems, SvdRouting routing) {
  return layout<T>(solver(stream), problems, routed<T>(routing)).total;
}

template <typename T>
SvdReport batched_svd_cuda(Stream& stream, T* a, const std::vector<SvdProblem>& problems, Real<T>* s, T* vh,
                           void* workspace, std::size_t workspace_bytes, SvdRouting routing) {
  using C = CuT<T>;
  Solver& sv = solver(stream);
  auto st = static_cast<cudaStream_t>(stream.native());
  routing = routed<T>(routing);
  const Layout l = layout<T>(sv, problems, routing);
  if (workspace_bytes < l.total)
    throw std::logic_error(fmt::format("batched_svd: workspace of {} bytes, needs {}", workspace_bytes, l.total));
  auto* base = static_cast<char*>(workspace);
  auto* a_copy = reinterpret_cast<C*>(base + l.a_copy);
  auto* v = reinterpret_cast<C*>(base + l.v);
  auto* work = base + l.work;
  auto* info = reinterpret_cast<int*>(base + l.info);
  SvdReport report;
  std::vector<SvdProblem> host, gpu;
  std::vector<Path> paths;
  for (const auto& p : problems) {
    if (p.m == 0 || p.n == 0) continue;
    const Path path = path_of(p, routing);
    if (path == Path::host) {
      host.push_back(p);
    } else {
      gpu.push_back(p);
      paths.push_back(path);
    }
  }
  // The host's share runs on a thread of its own beside the GPU's problems (gesvdp returns its
  // perturbation to the host, so each of its calls waits for the GPU): its blocks are copied out
  // first (the GPU paths leave A as it is), its S and Vh copied back once both are done. The same
  // calls on the same values as one after the other: the same bits.
  HostShare<T> share(stream, a, std::move(host));
  std::future<void> host_done;
  if (gpu.empty()) share.solve();
  else if (!share.problems.empty()) host_done = run_beside([&share] { share.solve(); });
  try {
    std::vector<char> host_work(l.host_work);
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const SvdProblem& p = gpu[i];
      QSTAGE_CUDA_CHECK(cudaMemcpyAsync(a_copy, a + p.offset, p.m * p.n * sizeof(T), cudaMemcpyDeviceToDevice, st));
      if (paths[i] == Path::jacobi) {
        const int rows = static_cast<int>(p.n), cols = static_cast<int>(p.m);
        const int lwork = jacobi_lwork<T>(sv, p);
        QSTAGE_CUSOLVER_CHECK(Cu<T>::gesvdj(sv.handle, CUSOLVER_EIG_MODE_VECTOR, 1, rows, cols, a_copy, rows,
                                            s + p.s_offset, z(vh + p.vh_offset), rows, v, cols,
                                            reinterpret_cast<C*>(work), lwork, info + i, sv.jacobi));
        continue;
      }
      const auto [device_bytes, host_bytes] = polar_work<T>(sv, p);
      double shift = 0;
      const cusolverStatus_t rc = cusolverDnXgesvdp(
          sv.handle, sv.params, CUSOLVER_EIG_MODE_VECTOR, 1, p.n, p.m, Cu<T>::data, a_copy, p.n, Cu<T>::real, s + p.s_offset,
          Cu<T>::data, z(vh + p.vh_offset), p.n, Cu<T>::data, v, p.m, Cu<T>::data, work, device_bytes,
          host_bytes ? host_work.data() : nullptr, host_bytes, info + i, &shift);
      if (rc != CUSOLVER_STATUS_SUCCESS) {
        // (a shape or size gesvdp refuses: the host solves it, counted as a fallback)
        const int failed = 1;
        QSTAGE_CUDA_CHECK(cudaMemcpyAsync(info + i, &failed, sizeof(int), cudaMemcpyHostToDevice, st));
        QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
        continue;
      }
      report.polar_shift = std::max(report.polar_shift, shift);
    }
  } catch (...) {
    if (host_done.valid()) host_done.wait();  // (its thread uses `share`)
    throw;
  }
  if (host_done.valid()) host_done.get();
  share.upload(stream, s, vh);
  report.host = static_cast<std::int64_t>(share.problems.size());
  std::vector<int> infos(gpu.size());
  if (!gpu.empty()) {
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(infos.data(), info, gpu.size() * sizeof(int), cudaMemcpyDeviceToHost, st));
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  std::vector<SvdProblem> failed;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (infos[i] != 0) {
      failed.push_back(gpu[i]);
      ++report.host_fallbacks;
    } else {
      ++(paths[i] == Path::jacobi ? report.jacobi : report.polar);
    }
  }
  solve_on_host(stream, a, failed, s, vh);
  return report;
}

template <typename T>
void times_adjoint_cuda(Stream& stream, const T* a, const T* vh, const std::vector<AdjointProduct>& products, T* out) {
  cublasHandle_t h = blas(stream);
  const CuT<T> zero = Cu<T>::make(0, 0);
  for (const AdjointProduct& p : products) {
    if (p.m == 0 || p.k == 0) continue;
    // Row-major out = A Vh^dagger is column-major out^T (k x m) = conj(Vh) A^T, with Vh's
    // memory the column-major n x k Vh^T, used conjugate-transposed.
    const CuT<T> alpha = Cu<T>::make(1.0 / p.divisor, 0);
    QSTAGE_CUDA_CHECK(Cu<T>::gemm(h, CUBLAS_OP_C, CUBLAS_OP_N, static_cast<int>(p.k), static_cast<int>(p.m),
                                  static_cast<int>(p.n), &alpha, z(vh + p.vh_offset), static_cast<int>(p.n),
                                  z(a + p.a_offset), static_cast<int>(p.n), &zero, z(out + p.out_offset),
                                  static_cast<int>(p.k)));
  }
}

#define QSTAGE_CHARGE_BLOCKS_CUDA(T)                                                                                \
  template void charge_products_cuda(Stream&, const T*, const std::vector<ChargeProduct>&,                           \
                                     const std::vector<ChargeScatter>&, T*, std::int64_t, T*);                       \
  template void scale_rows_cuda(Stream&, const T*, const double*, const std::vector<ScaledRows>&, T*);               \
  template std::size_t svd_workspace_bytes_cuda<T>(Stream&, const std::vector<SvdProblem>&, SvdRouting);             \
  template SvdReport batched_svd_cuda(Stream&, T*, const std::vector<SvdProblem>&, Real<T>*, T*, void*, std::size_t, \
                                      SvdRouting);                                                                   \
  template void times_adjoint_cuda(Stream&, const T*, const T*, const std::vector<AdjointProduct>&, T*);
QSTAGE_CHARGE_BLOCKS_CUDA(cplx128)
QSTAGE_CHARGE_BLOCKS_CUDA(cplx64)
#undef QSTAGE_CHARGE_BLOCKS_CUDA

}  // namespace qstage::kernels::detail
