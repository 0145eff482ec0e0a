#include <cuComplex.h>
#include <cusolverDn.h>
#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/charge_blocks.hpp"

namespace qstage::kernels::detail {
namespace {

void cusolver_check(cusolverStatus_t rc, const char* call, const char* file, int line) {
  if (rc != CUSOLVER_STATUS_SUCCESS) ::qstage::detail::throw_cuda_error(call, file, line, fmt::format("cusolver status {}", int(rc)).c_str());
}
#define QSTAGE_CUSOLVER_CHECK(call) cusolver_check((call), #call, __FILE__, __LINE__)

cuDoubleComplex* z(cplx128* p) { return reinterpret_cast<cuDoubleComplex*>(p); }
const cuDoubleComplex* z(const cplx128* p) { return reinterpret_cast<const cuDoubleComplex*>(p); }
cuDoubleComplex z(cplx128 v) { return make_cuDoubleComplex(v.real(), v.imag()); }

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

// Up to kScatters destinations of one product, by value.
constexpr int kScatters = 16;
struct Scatters {
  std::int64_t offset[kScatters], ld[kScatters];
  cuDoubleComplex u[kScatters];
  int count;
};

__global__ void scatter_kernel(const cuDoubleComplex* p, std::int64_t m, std::int64_t n, Scatters s, cuDoubleComplex* c) {
  const std::int64_t total = m * n, stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t r = e / n, col = e - r * n;
    const cuDoubleComplex v = p[e];
    for (int i = 0; i < s.count; ++i) {
      cuDoubleComplex& dst = c[s.offset[i] + r * s.ld[i] + col];
      dst = cuCadd(dst, cuCmul(s.u[i], v));
    }
  }
}

__global__ void scale_rows_kernel(const cuDoubleComplex* a, const double* scale, std::int64_t rows, std::int64_t cols,
                                  cuDoubleComplex* out) {
  const std::int64_t total = rows * cols, stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const double f = scale[e / cols];
    out[e] = make_cuDoubleComplex(cuCreal(a[e]) * f, cuCimag(a[e]) * f);
  }
}

cublasHandle_t blas(Stream& stream) {
  auto h = static_cast<cublasHandle_t>(stream.blas_handle());
  if (!h) throw std::logic_error("charge_blocks: the stream has no cuBLAS handle (make_stream(true))");
  QSTAGE_CUDA_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.native())));
  return h;
}

// One cuSOLVER handle and Jacobi configuration per host thread (the device is the thread's).
struct Solver {
  cusolverDnHandle_t handle = nullptr;
  gesvdjInfo_t jacobi = nullptr;
  Solver() {
    QSTAGE_CUSOLVER_CHECK(cusolverDnCreate(&handle));
    QSTAGE_CUSOLVER_CHECK(cusolverDnCreateGesvdjInfo(&jacobi));
    // The defaults (tolerance: machine precision; 100 sweeps), written out so they are on record.
    QSTAGE_CUSOLVER_CHECK(cusolverDnXgesvdjSetTolerance(jacobi, 0.0));
    QSTAGE_CUSOLVER_CHECK(cusolverDnXgesvdjSetMaxSweeps(jacobi, 100));
  }
  ~Solver() {
    cusolverDnDestroyGesvdjInfo(jacobi);
    cusolverDnDestroy(handle);
  }
};
Solver& solver(Stream& stream) {
  thread_local Solver s;
  QSTAGE_CUSOLVER_CHECK(cusolverDnSetStream(s.handle, static_cast<cudaStream_t>(stream.native())));
  return s;
}

bool on_host(const SvdProblem& p, std::int64_t gpu_from) {
  const double f = static_cast<double>(gpu_from);
  return static_cast<double>(p.m) * p.n * std::min(p.m, p.n) < f * f * f;
}

// Jacobi's work array for p, in elements. The row-major m x n A is the column-major n x m A^T;
// its left vectors (n x r, column-major) are Vh (r x n, row-major): they go straight to vh.
int jacobi_lwork(Solver& s, const SvdProblem& p) {
  int lwork = 0;
  const int rows = static_cast<int>(p.n), cols = static_cast<int>(p.m);
  QSTAGE_CUSOLVER_CHECK(cusolverDnZgesvdj_bufferSize(s.handle, CUSOLVER_EIG_MODE_VECTOR, 1, rows, cols, nullptr, rows,
                                                    nullptr, nullptr, rows, nullptr, cols, &lwork, s.jacobi));
  return lwork;
}

struct Layout {
  std::size_t a_copy = 0, v = 0, work = 0, info = 0, total = 0;
};
// The workspace: a copy of the largest A (Jacobi overwrites its input; the original stays for
// the fallback), its right vectors, the largest work array, and one info per problem.
Layout layout(Solver& s, const std::vector<SvdProblem>& problems, std::int64_t gpu_from) {
  std::int64_t a = 0, v = 0, work = 0, count = 0;
  for (const auto& p : problems) {
    if (p.m == 0 || p.n == 0 || on_host(p, gpu_from)) continue;
    a = std::max(a, p.m * p.n);
    v = std::max(v, p.m * std::min(p.m, p.n));
    work = std::max<std::int64_t>(work, jacobi_lwork(s, p));
    ++count;
  }
  auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
  Layout l;
  l.a_copy = 0;
  l.v = up(l.a_copy + a * sizeof(cplx128));
  l.work = up(l.v + v * sizeof(cplx128));
  l.info = up(l.work + work * sizeof(cplx128));
  l.total = count == 0 ? 0 : up(l.info + count * sizeof(int));
  return l;
}

// Copies problems to the host, solves them there, and copies S and Vh back.
void solve_on_host(Stream& stream, const cplx128* a, const std::vector<SvdProblem>& problems, double* s, cplx128* vh) {
  if (problems.empty()) return;
  auto st = static_cast<cudaStream_t>(stream.native());
  std::vector<SvdProblem> local;
  std::int64_t a_size = 0, s_size = 0, vh_size = 0;
  for (const auto& p : problems) {
    const std::int64_t r = std::min(p.m, p.n);
    local.push_back({p.m, p.n, a_size, s_size, vh_size});
    a_size += p.m * p.n, s_size += r, vh_size += r * p.n;
  }
  std::vector<cplx128> ha(a_size), hvh(vh_size);
  std::vector<double> hs(s_size);
  for (std::size_t i = 0; i < problems.size(); ++i)
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(ha.data() + local[i].offset, a + problems[i].offset,
                                      problems[i].m * problems[i].n * sizeof(cplx128), cudaMemcpyDeviceToHost, st));
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
  svd_on_host(ha.data(), local, hs.data(), hvh.data());
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const std::int64_t r = std::min(problems[i].m, problems[i].n);
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(s + problems[i].s_offset, hs.data() + local[i].s_offset, r * sizeof(double),
                                      cudaMemcpyHostToDevice, st));
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(vh + problems[i].vh_offset, hvh.data() + local[i].vh_offset,
                                      r * problems[i].n * sizeof(cplx128), cudaMemcpyHostToDevice, st));
  }
  // (the host vectors must outlive the copies)
  QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace

void charge_products_cuda(Stream& stream, const cplx128* sites, const std::vector<ChargeProduct>& products,
                          const std::vector<ChargeScatter>& scatters, cplx128* c, std::int64_t c_size,
                          cplx128* scratch) {
  cublasHandle_t h = blas(stream);
  auto st = static_cast<cudaStream_t>(stream.native());
  QSTAGE_CUDA_CHECK(cudaMemsetAsync(c, 0, c_size * sizeof(cplx128), st));
  const cuDoubleComplex one = make_cuDoubleComplex(1, 0), zero = make_cuDoubleComplex(0, 0);
  for (const ChargeProduct& p : products) {
    if (p.count == 0 || p.m == 0 || p.n == 0) continue;
    // Row-major P = X Y is column-major P^T = Y^T X^T.
    QSTAGE_CUDA_CHECK(cublasZgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
                                  static_cast<int>(p.k), &one, z(sites + p.y), static_cast<int>(p.n), z(sites + p.x),
                                  static_cast<int>(p.k), &zero, z(scratch), static_cast<int>(p.n)));
    for (std::int64_t first = p.first; first < p.first + p.count; first += kScatters) {
      Scatters s{};
      s.count = static_cast<int>(std::min<std::int64_t>(kScatters, p.first + p.count - first));
      for (int i = 0; i < s.count; ++i) {
        s.offset[i] = scatters[first + i].offset;
        s.ld[i] = scatters[first + i].ld;
        s.u[i] = z(scatters[first + i].u);
      }
      scatter_kernel<<<blocks_for(p.m * p.n), kThreads, 0, st>>>(z(scratch), p.m, p.n, s, z(c));
      QSTAGE_CUDA_CHECK_LAUNCH();
    }
  }
}

void scale_rows_cuda(Stream& stream, const cplx128* a, const double* scale, const std::vector<ScaledRows>& matrices,
                     cplx128* out) {
  auto st = static_cast<cudaStream_t>(stream.native());
  for (const ScaledRows& x : matrices) {
    if (x.rows == 0 || x.cols == 0) continue;
    scale_rows_kernel<<<blocks_for(x.rows * x.cols), kThreads, 0, st>>>(z(a + x.offset), scale + x.scale_offset, x.rows,
                                                                          x.cols, z(out + x.offset));
    QSTAGE_CUDA_CHECK_LAUNCH();
  }
}

std::size_t svd_workspace_bytes_cuda(Stream& stream, const std::vector<SvdProblem>& problems, std::int64_t gpu_from) {
  return layout(solver(stream), problems, gpu_from).total;
}

SvdReport batched_svd_cuda(Stream& stream, cplx128* a, const std::vector<SvdProblem>& problems, double* s,
                           cplx128* vh, void* workspace, std::size_t workspace_bytes, std::int64_t gpu_from) {
  Solver& sv = solver(stream);
  auto st = static_cast<cudaStream_t>(stream.native());
  const Layout l = layout(sv, problems, gpu_from);
  if (workspace_bytes < l.total)
    throw std::logic_error(fmt::format("batched_svd: workspace of {} bytes, needs {}", workspace_bytes, l.total));
  auto* base = static_cast<char*>(workspace);
  auto* a_copy = reinterpret_cast<cuDoubleComplex*>(base + l.a_copy);
  auto* v = reinterpret_cast<cuDoubleComplex*>(base + l.v);
  auto* work = reinterpret_cast<cuDoubleComplex*>(base + l.work);
  auto* info = reinterpret_cast<int*>(base + l.info);
  SvdReport report;
  std::vector<SvdProblem> host, gpu;
  for (const auto& p : problems)
    if (p.m > 0 && p.n > 0) (on_host(p, gpu_from) ? host : gpu).push_back(p);
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const SvdProblem& p = gpu[i];
    const int rows = static_cast<int>(p.n), cols = static_cast<int>(p.m);
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(a_copy, a + p.offset, p.m * p.n * sizeof(cplx128), cudaMemcpyDeviceToDevice, st));
    const int lwork = jacobi_lwork(sv, p);
    QSTAGE_CUSOLVER_CHECK(cusolverDnZgesvdj(sv.handle, CUSOLVER_EIG_MODE_VECTOR, 1, rows, cols, a_copy, rows,
                                            s + p.s_offset, z(vh + p.vh_offset), rows, v, cols, work, lwork,
                                            info + i, sv.jacobi));
  }
  // The host's share runs while the GPU works through Jacobi.
  solve_on_host(stream, a, host, s, vh);
  report.host = static_cast<std::int64_t>(host.size());
  std::vector<int> infos(gpu.size());
  if (!gpu.empty()) {
    QSTAGE_CUDA_CHECK(cudaMemcpyAsync(infos.data(), info, gpu.size() * sizeof(int), cudaMemcpyDeviceToHost, st));
    QSTAGE_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  std::vector<SvdProblem> failed;
  for (std::size_t i = 0; i < gpu.size(); ++i) (infos[i] == 0 ? report.jacobi : report.host_fallbacks)++;
  for (std::size_t i = 0; i < gpu.size(); ++i)
    if (infos[i] != 0) failed.push_back(gpu[i]);
  solve_on_host(stream, a, failed, s, vh);
  return report;
}

void times_adjoint_cuda(Stream& stream, const cplx128* a, const cplx128* vh,
                        const std::vector<AdjointProduct>& products, cplx128* out) {
  cublasHandle_t h = blas(stream);
  const cuDoubleComplex zero = make_cuDoubleComplex(0, 0);
  for (const AdjointProduct& p : products) {
    if (p.m == 0 || p.k == 0) continue;
    // Row-major out = A Vh^dagger is column-major out^T (k x m) = conj(Vh) A^T, with Vh's
    // memory the column-major n x k Vh^T, used conjugate-transposed.
    const cuDoubleComplex alpha = make_cuDoubleComplex(1.0 / p.divisor, 0);
    QSTAGE_CUDA_CHECK(cublasZgemm(h, CUBLAS_OP_C, CUBLAS_OP_N, static_cast<int>(p.k), static_cast<int>(p.m),
                                  static_cast<int>(p.n), &alpha, z(vh + p.vh_offset), static_cast<int>(p.n),
                                  z(a + p.a_offset), static_cast<int>(p.n), &zero, z(out + p.out_offset),
                                  static_cast<int>(p.k)));
  }
}

}  // namespace qstage::kernels::detail
