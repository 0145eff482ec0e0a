#pragma once
// Theta of a two-site update in gather form, for updates whose sectors are many and small (a
// density matrix's pair charges: bonds of a thousand 1 x 1 sectors, and pairs of outer sectors
// with up to d^2 = 225 old centre sectors each): kernels/charge_blocks' charge_products lists
// every (product, new centre charge) as a scatter, which there runs to 10^8 entries and a launch
// per product. Here a pair of outer sectors (l, r) carries its old centre sectors (the terms:
// P(mid) = X Y), and the destinations Theta(c)[l, r] are found from tables by the local index
// l - c, so nothing per destination is stored. Every Theta element belongs to one pair, so pairs
// run in parallel without atomics, and each element sums its terms in term order: on the CPU the
// same products (kernels::matmul) and the same sums as charge_products, so the bits are the same
// (stages/mps/tebd.cpp chooses per pair).
// Two kinds of pairs on the GPU: a pair whose products fit shared memory (terms m n <=
// kTileMaxTermsMn) is one thread block's; a wide pair keeps its products in a device workspace,
// and the wide pairs go in rounds whose products fit it: one launch computes a round's products
// (every element by the same loop as the shared-memory kernel, so a pair's bits do not depend on
// its kind), one more sums them into the tiles. A round's pairs write disjoint tiles.
// charge_tiles.cpp is the CPU twin, charge_tiles.cu the CUDA version; a template on the element
// type T as kernels/charge_blocks (complex128 and complex64; complex64's gate table rounded to it).
#include <complex>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "kernels/mps/u1_math.hpp"

namespace qstage::kernels {

// Old centre sector `mid`: X (m x k at x) and Y (k x n at y) in the packed sites.
struct TileTerm {
  std::int64_t x = 0, y = 0, k = 0;
  int mid = 0;
};
// A pair of outer sectors (l of m rows, r of n columns) and its terms [first_term, first_term + terms).
// A wide pair also has, within its round, where its products start in the workspace (`work`:
// terms m n elements) and its first item of the mixing (`mix`: local_dim m n items, one per
// destination element whether or not its centre exists).
struct TilePair {
  int l = 0, r = 0;
  std::int64_t m = 0, n = 0, first_term = 0, terms = 0;
  std::int64_t work = 0, mix = 0;
};
// Wide pairs [first, first + count) whose `products` elements fit the workspace together, with
// `mixes` mixing items.
struct TileRound {
  std::int64_t first = 0, count = 0, products = 0, mixes = 0;
};
// Where Theta(c) of each new centre charge lives: block b at block_offset[b] with block_cols[b]
// columns; rows_of[b D + t] is the first row of the left sector l with local index l - c = t in
// it (-1: none), cols_of[b D + t] the first column of the right sector r with c - r = t (D: the
// rule's local dimension). block_at maps a charge to its block through a grid: n charges
// c -> block_at[c - ket0]; pair charges -> block_at[(ket - ket0) bras + bra - bra0]; -1 none.
struct TileTables {
  ChargeRule rule;
  int ket0 = 0, kets = 0, bra0 = 0, bras = 1;
  std::int64_t pair_count = 0, wide_count = 0;
  std::int64_t max_terms_mn = 0;  // the largest terms m n of a pair in `pairs` (the CUDA version's shared memory)
  const TilePair* pairs = nullptr;  // pairs whose products fit shared memory
  const TilePair* wide = nullptr;   // pairs whose products do not, in rounds
  const TileTerm* terms = nullptr;
  const std::int64_t* block_offset = nullptr;
  const std::int64_t* block_cols = nullptr;
  const std::int32_t* rows_of = nullptr;
  const std::int32_t* cols_of = nullptr;
  const std::int32_t* block_at = nullptr;

  // The block of charge c, or -1.
  QSTAGE_HD int block_of(int c) const {
    const int k = rule.pair() ? pair_ket(c) - ket0 : c - ket0, b = rule.pair() ? pair_bra(c) - bra0 : 0;
    if (k < 0 || k >= kets || b < 0 || b >= bras) return -1;
    return block_at[static_cast<std::int64_t>(k) * bras + b];
  }
  // Where pair (l, r)'s tile in Theta(centre), centre = l - delta(local), starts in c, with the
  // block's row stride in ld; -1 where that centre has no such tile.
  QSTAGE_HD std::int64_t tile_at(int l, int r, int local, int& c, std::int64_t& ld) const {
    c = centre(l, local);
    if (c < 0 || !rule.allowed(c, r)) return -1;
    const int b = block_of(c);
    if (b < 0) return -1;
    const int D = rule.local_dim();
    const std::int32_t r0 = rows_of[static_cast<std::int64_t>(b) * D + local], c0 = cols_of[static_cast<std::int64_t>(b) * D + rule.local(c, r)];
    if (r0 < 0 || c0 < 0) return -1;
    ld = block_cols[b];
    return block_offset[b] + r0 * ld + c0;
  }
  // l - delta(t) componentwise, or -1 if a component would be negative.
  QSTAGE_HD int centre(int l, int t) const {
    if (!rule.pair()) return l - t >= 0 ? l - t : -1;
    const int k = pair_ket(l) - t / rule.d, b = pair_bra(l) - t % rule.d;
    return k >= 0 && b >= 0 ? pair_key(k, b) : -1;
  }
};

// The largest terms m n a pair may have to keep its products in shared memory (the CUDA version:
// 32 KiB of complex128); larger ones are wide pairs.
inline constexpr std::int64_t kTileMaxTermsMn = 2048;
// A pair takes the gather form while its largest product m k n is below this; from there one
// cuBLAS GEMM a product (charge_products) is faster than the gather kernels' plain loops, whose
// launches are what they save (chi 8192 GBS: 2.5M products of ~170 elements an update).
inline constexpr std::int64_t kTileMaxProduct = std::int64_t{1} << 20;

// Sets the wide pairs' `work` and `mix` and returns their rounds: consecutive pairs whose products
// total at most `limit` elements (a pair larger than that alone). local_dim: the rule's.
std::vector<TileRound> plan_tile_rounds(std::vector<TilePair>& wide, int local_dim, std::int64_t limit);

// c += every pair's tiles: c[block_offset[b] + (rows_of + i) cols + cols_of + j] += sum over terms
// of gate_value(gate, l, mid, c, r) (X Y)[i, j], terms in order, zero gate entries skipped.
// `sites`, `gate` (the gate table, d^3 entries), the tables' arrays, `c` and `workspace` (the
// largest round's products; unused on the CPU) are on the stream's backend (device memory on
// cuda); `rounds` (plan_tile_rounds of tables.wide) on the host.
template <typename T>
void charge_tiles(Stream& stream, const T* sites, const T* gate, const TileTables& tables,
                  const std::vector<TileRound>& rounds, T* c, T* workspace);

namespace detail {
template <typename T>
void charge_tiles_cuda(Stream& stream, const T* sites, const T* gate, const TileTables& tables,
                       const std::vector<TileRound>& rounds, T* c, T* workspace);
}

}  // namespace qstage::kernels
