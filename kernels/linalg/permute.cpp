#include "kernels/linalg/permute.hpp"

#include <cstring>

#include "kernels/dispatch.hpp"

namespace qstage::kernels {

namespace {

template <std::size_t Bytes>
void gather(const GatherPermute& g) {
  std::int64_t total = 1;
  for (int j = 0; j < g.rank; ++j) total *= g.dims[j];
  const char* in = static_cast<const char*>(g.in);
  char* out = static_cast<char*>(g.out);
#pragma omp parallel for schedule(static) if (total > 65536)
  for (std::int64_t i = 0; i < total; ++i) {
    std::int64_t rest = i, offset = g.base;
    for (int j = g.rank - 1; j >= 0; --j) {
      offset += (rest % g.dims[j]) * g.strides[j];
      rest /= g.dims[j];
    }
    std::memcpy(out + i * static_cast<std::int64_t>(Bytes), in + offset * static_cast<std::int64_t>(Bytes), Bytes);
  }
}

}  // namespace

GatherPermute merged(const GatherPermute& args) {
  GatherPermute g = args;
  g.rank = 0;
  for (int j = 0; j < args.rank; ++j) {
    if (args.dims[j] == 1) continue;
    if (g.rank > 0 && g.strides[g.rank - 1] == args.strides[j] * args.dims[j]) {  // contiguous with the previous
      g.dims[g.rank - 1] *= args.dims[j];
      g.strides[g.rank - 1] = args.strides[j];
      continue;
    }
    g.dims[g.rank] = args.dims[j];
    g.strides[g.rank] = args.strides[j];
    ++g.rank;
  }
  for (int j = g.rank; j < kMaxRank; ++j) g.dims[j] = 1, g.strides[j] = 0;
  return g;
}

void gather_permute_cpu(const GatherPermute& args) {
  const GatherPermute g = merged(args);
  switch (dtype_size(g.dtype)) {
    case 4: return gather<4>(g);
    case 8: return gather<8>(g);
    case 16: return gather<16>(g);
    default: return gather<1>(g);
  }
}

void gather_permute(Stream& stream, const GatherPermute& args) {
  QSTAGE_DISPATCH(stream, gather_permute_cpu(args), detail::gather_permute_cuda(stream.native(), merged(args)));
}

}  // namespace qstage::kernels
