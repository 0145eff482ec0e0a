#include "kernels/linalg/looped_gemm.hpp"

#include <stdexcept>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {
void check(const LoopedGemm& g) {
  if (g.dtype != DType::complex64 && g.dtype != DType::complex128)
    throw std::invalid_argument("looped_gemm: complex64 or complex128 only");
  if (g.groups < 0 || g.groups > kMaxLoopGroups) throw std::invalid_argument("looped_gemm: too many loop groups");
  if (g.semiring == Semiring::tropical && g.dtype != DType::complex128)
    throw std::invalid_argument("looped_gemm: the tropical semiring takes complex128 storage only");
}

template <typename Real, typename Product>
void run_cpu(const Product& g) {
  const auto total = static_cast<std::int64_t>(g.loops() * static_cast<std::uint64_t>(g.m * g.n));
#pragma omp parallel for schedule(static) if (total * g.k > (std::int64_t{1} << 16))
  for (std::int64_t e = 0; e < total; ++e) detail::looped_gemm_element<Real>(g, static_cast<std::uint64_t>(e));
}

template <typename Product>
void run_tropical_cpu(const Product& g) {
  const auto total = static_cast<std::int64_t>(g.loops() * static_cast<std::uint64_t>(g.m * g.n));
#pragma omp parallel for schedule(static) if (total * g.k > (std::int64_t{1} << 16))
  for (std::int64_t e = 0; e < total; ++e) detail::looped_tropical_element(g, static_cast<std::uint64_t>(e));
}

template <typename Product>
void run_product_cpu(const Product& g) {
  if (g.semiring == Semiring::tropical)
    run_tropical_cpu(g);
  else if (g.dtype == DType::complex64)
    run_cpu<float>(g);
  else
    run_cpu<double>(g);
}
}  // namespace

void set_shifts(LoopedGemm& g) {
  auto shift_of = [](std::int64_t x) -> std::int8_t {
    if (x <= 0 || (x & (x - 1)) != 0) return -1;
    std::int8_t s = 0;
    while ((std::int64_t{1} << s) < x) ++s;
    return s;
  };
  for (int d = 0; d < g.groups; ++d) g.shift[d] = shift_of(g.extent[d]);
  g.m_shift = shift_of(g.m);
  g.n_shift = shift_of(g.n);
}

void looped_gemm_cpu(const LoopedGemm& args) {
  check(args);
  LoopedGemm g = args;
  set_shifts(g);
  run_product_cpu(g);
}

void looped_gemm(Stream& stream, const LoopedGemm& args) {
  check(args);
  LoopedGemm g = args;
  set_shifts(g);
  QSTAGE_DISPATCH(stream, looped_gemm_cpu(g), detail::looped_gemm_cuda(stream.native(), g));
}

bool LoopedChain::fits(std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t loops, int groups) {
  if (groups > kChainMaxGroups || k > kChainMaxSum) return false;
  const std::uint64_t results = loops * static_cast<std::uint64_t>(m * n);
  return results <= kChainMaxResults && results * static_cast<std::uint64_t>(k) <= kChainMaxMultiplyAdds;
}

bool LoopedChain::fits(const LoopedGemm& g) { return fits(g.m, g.n, g.k, g.loops(), g.groups); }

LoopedChain::Footprint LoopedChain::footprint(const LoopedGemm& g) {
  const std::uint64_t bytes = g.dtype == DType::complex128 ? 16 : 8;
  auto span = [&](const void* at, const std::int64_t* strides, std::int64_t inner) {
    std::int64_t last = inner - 1;  // the highest element's offset
    for (int d = 0; d < g.groups; ++d) {
      if (strides[d] < 0) return Span{0, ~std::uintptr_t{0}};  // (below `at`: all of memory, to be safe)
      last += (g.extent[d] - 1) * strides[d];
    }
    const auto begin = reinterpret_cast<std::uintptr_t>(at);
    return Span{begin, begin + (static_cast<std::uint64_t>(last) + 1) * bytes};
  };
  return {span(g.a, g.stride_a, g.m * g.k), span(g.b, g.stride_b, g.n * g.k), span(g.c, g.stride_c, g.m * g.n)};
}

void LoopedChain::push(const LoopedGemm& args) {
  check(args);
  const bool same_kind =
      queued_.empty() || (queued_.front().dtype == args.dtype && queued_.front().semiring == args.semiring);
  if (!fits(args) || !same_kind) {
    flush();
    if (!fits(args)) return looped_gemm(stream_, args);
  }
  LoopedGemm g = args;
  set_shifts(g);
  const Footprint f = footprint(g);
  if (queued_.size() % kChainBatch == 0) stage_.clear();  // (a launch of its own: nothing to compare with)
  const bool after_stage =
      std::any_of(stage_.begin(), stage_.end(), [&](const Footprint& q) { return q.conflicts(f); });
  if (after_stage) stage_.clear();
  starts_stage_.push_back(stage_.empty() ? 1 : 0);
  stage_.push_back(f);
  ChainedGemm& q = queued_.emplace_back();
  q.dtype = g.dtype, q.semiring = g.semiring, q.m = g.m, q.n = g.n, q.k = g.k, q.a = g.a, q.b = g.b, q.c = g.c;
  q.groups = g.groups, q.m_shift = g.m_shift, q.n_shift = g.n_shift;
  for (int d = 0; d < g.groups; ++d) {
    q.extent[d] = g.extent[d], q.stride_a[d] = g.stride_a[d], q.stride_b[d] = g.stride_b[d],
    q.stride_c[d] = g.stride_c[d];
    q.shift[d] = g.shift[d];
  }
}

void LoopedChain::flush() {
  if (queued_.empty()) return;
  auto on_cpu = [&] {
    for (const ChainedGemm& q : queued_) run_product_cpu(q);
  };
  QSTAGE_DISPATCH(stream_, on_cpu(),
                  detail::looped_chain_cuda(stream_.native(), queued_.data(), starts_stage_.data(), queued_.size()));
  queued_.clear();
  starts_stage_.clear();
  stage_.clear();
}

}  // namespace qstage::kernels
