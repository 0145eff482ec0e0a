#include "stages/sci/davidson.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace qstage::sci {

namespace {

// Dot products in one fixed shape, so that their bits depend on the vectors only, never on the
// threads: blocks of kDotBlock entries, each summed in eight lanes (entry i in lane i % 8, the
// lanes then added pairwise), and the blocks' sums added in block order. A plain sequential sum
// waits for each addition before the next (4 cycles an entry: Gram-Schmidt's 2 x 24 dots over a
// million entries took 40 ms a product on one thread); eight chains overlap, and the blocks run
// on OpenMP threads (inside a parallel region, on the caller's thread alone: the same bits).
constexpr std::size_t kDotBlock = 4096;

double block_dot(const double* a, const double* b, std::size_t n) {
  double lane[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) lane[l] += a[i] * b[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The blocks' sums of a sweep over n entries (block(first, size) returns one), added in order.
template <typename Block>
double sum_of_blocks(std::size_t n, Block block) {
  const std::size_t blocks = (n + kDotBlock - 1) / kDotBlock;
  std::vector<double> sums(blocks);
#pragma omp parallel for schedule(static) if (blocks >= 8)
  for (std::size_t k = 0; k < blocks; ++k) sums[k] = block(k * kDotBlock, std::min(kDotBlock, n - k * kDotBlock));
  if (blocks == 0) return 0;
  double s = sums[0];
  for (std::size_t k = 1; k < blocks; ++k) s += sums[k];
  return s;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() <= kDotBlock) return block_dot(a.data(), b.data(), a.size());  // (sum_of_blocks' result, without its array)
  return sum_of_blocks(a.size(), [&](std::size_t first, std::size_t size) { return block_dot(a.data() + first, b.data() + first, size); });
}

// One sweep over t: t -= d * b (unless b is null), then the dot product of c and the updated t,
// block by block, so Gram-Schmidt reads each vector once a step. The arithmetic is that of the
// subtraction and dot() apart: the same bits.
double subtract_then_dot(std::vector<double>& t, const std::vector<double>* b, double d, const std::vector<double>& c) {
  return sum_of_blocks(t.size(), [&](std::size_t first, std::size_t size) {
    if (b)
      for (std::size_t i = first; i < first + size; ++i) t[i] -= d * (*b)[i];
    return block_dot(c.data() + first, t.data() + first, size);
  });
}

void scale(std::vector<double>& a, double f) {
  for (double& x : a) x *= f;
}

}  // namespace

void symmetric_eigen(int n, std::vector<double> a, std::vector<double>& values, std::vector<double>& vectors) {
  std::vector<double> v(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) v[i * n + i] = 1;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-30) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < n; ++k) {
          const double vkp = v[k * n + p], vkq = v[k * n + q];
          v[k * n + p] = c * vkp - s * vkq;
          v[k * n + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[x * n + x] < a[y * n + y]; });
  values.resize(n);
  vectors.assign(static_cast<std::size_t>(n) * n, 0.0);
  for (int j = 0; j < n; ++j) {
    values[j] = a[order[j] * n + order[j]];
    for (int i = 0; i < n; ++i) vectors[i * n + j] = v[i * n + order[j]];
  }
}

Davidson::Davidson(std::vector<double> guess, DavidsonOptions options) : options_(options) {
  if (guess.empty()) throw std::invalid_argument("Davidson: an empty guess");
  const double norm = std::sqrt(dot(guess, guess));
  if (!(norm > 0)) throw std::invalid_argument("Davidson: the guess is zero");
  scale(guess, 1 / norm);
  basis_.push_back(std::move(guess));
}

Davidson::Davidson(std::vector<std::vector<double>> guesses, DavidsonOptions options)
    : Davidson(guesses.empty() ? std::vector<double>{} : guesses.front(), options) {
  roots_ = static_cast<int>(guesses.size());
  if (guesses.size() > basis_.front().size() || roots_ >= options.max_basis)
    throw std::invalid_argument("Davidson: more roots than the dimension or the basis allows");
  for (std::size_t g = 1; g < guesses.size(); ++g) {
    if (guesses[g].size() != basis_.front().size()) throw std::invalid_argument("Davidson: guesses of different sizes");
    if (!add_direction(std::move(guesses[g]))) throw std::invalid_argument("Davidson: the guesses are linearly dependent");
  }
}

void Davidson::set_diagonal(std::vector<double> diagonal) {
  if (diagonal.size() != basis_.front().size()) throw std::invalid_argument("Davidson: the diagonal has the wrong size");
  diagonal_ = std::move(diagonal);
}

// False (the basis unchanged) when t has no direction outside the basis.
bool Davidson::add_direction(std::vector<double> t) {
  // Twice (Gram-Schmidt keeps the basis orthonormal to rounding): t -= (b, t) b for each b in
  // turn, each subtraction swept together with the next dot product (and the last with the norm's).
  const std::vector<double>* last = nullptr;
  double d = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& b : basis_) {
      d = subtract_then_dot(t, last, d, b);
      last = &b;
    }
  const double norm = std::sqrt(subtract_then_dot(t, last, d, t));
  if (!(norm > 1e-12)) return false;
  scale(t, 1 / norm);
  basis_.push_back(std::move(t));
  return true;
}

void Davidson::finish(bool converged) {
  done_ = true;
  converged_ = converged;
  basis_.clear(), products_of_basis_.clear(), projected_.clear();  // (only the Ritz pairs are needed now)
}

void Davidson::save(Packer& out) const {
  out.put(options_), out.put(roots_), out.put(products_);
  out.put<std::uint8_t>(done_), out.put<std::uint8_t>(converged_);
  out.put_vector(theta_), out.put_vector(residual_);
  out.put_vector(diagonal_), out.put_vector(projected_);
  for (const auto* vectors : {&ritz_, &basis_, &products_of_basis_}) {
    out.put<std::uint64_t>(vectors->size());
    for (const auto& v : *vectors) out.put_vector(v);
  }
}

void Davidson::load(Unpacker& in) {
  options_ = in.get<DavidsonOptions>(), roots_ = in.get<int>(), products_ = in.get<int>();
  done_ = in.get<std::uint8_t>() != 0, converged_ = in.get<std::uint8_t>() != 0;
  theta_ = in.get_vector<double>(), residual_ = in.get_vector<double>();
  diagonal_ = in.get_vector<double>(), projected_ = in.get_vector<double>();
  for (auto* vectors : {&ritz_, &basis_, &products_of_basis_}) {
    vectors->resize(in.get<std::uint64_t>());
    for (auto& v : *vectors) v = in.get_vector<double>();
  }
  if (!done_ && (basis_.empty() || products_of_basis_.size() >= basis_.size()))
    throw std::runtime_error("Davidson: a saved state without a vector to multiply");
}

// The projected matrix grows by the row and column of the basis vector whose product just came
// (symmetrized).
void Davidson::extend_projected() {
  const int m = static_cast<int>(products_of_basis_.size());
  std::vector<double> t(static_cast<std::size_t>(m) * m);
  for (int i = 0; i < m - 1; ++i)
    for (int j = 0; j < m - 1; ++j) t[i * m + j] = projected_[i * (m - 1) + j];
  // (the dots are independent: one a thread, each summed in entry order, so the bits do not depend
  // on the threads; on 4.6e5-entry vectors they were most of a multi-root product's host time)
#pragma omp parallel for schedule(dynamic)
  for (int i = 0; i < m; ++i) {
    const double v = 0.5 * (dot(basis_[i], products_of_basis_[m - 1]) + dot(basis_[m - 1], products_of_basis_[i]));
    t[i * m + (m - 1)] = t[(m - 1) * m + i] = v;
  }
  projected_ = std::move(t);
}

bool Davidson::take(std::vector<double> product) {
  if (done_) throw std::logic_error("Davidson::take after it finished");
  if (diagonal_.empty()) throw std::logic_error("Davidson::take before set_diagonal");
  if (product.size() != diagonal_.size()) throw std::invalid_argument("Davidson: product of the wrong size");
  ++products_;
  products_of_basis_.push_back(std::move(product));
  extend_projected();
  if (products_of_basis_.size() < basis_.size()) return false;  // (more directions to multiply first)
  const int m = static_cast<int>(basis_.size());
  std::vector<double> values, vectors;
  symmetric_eigen(m, projected_, values, vectors);
  const int k = std::min(roots_, m);
  const std::size_t n = diagonal_.size();
  theta_.assign(values.begin(), values.begin() + k);
  ritz_.assign(static_cast<std::size_t>(k), std::vector<double>(n, 0.0));
  residual_.assign(static_cast<std::size_t>(k), 0.0);
  std::vector<std::vector<double>> ax(static_cast<std::size_t>(k), std::vector<double>(n, 0.0)),
      r(static_cast<std::size_t>(k), std::vector<double>(n));
  bool all_converged = true;
  for (int root = 0; root < k; ++root) {
    std::vector<double>&x_out = ritz_[root], &a_out = ax[root], &r_out = r[root];
    const double theta = theta_[root];
    // (per entry, the basis vectors in order: the same bits on any number of threads. A block of
    // entries at a time, vector after vector: each vector is read as one stream, not 2m at once;
    // the residual's norm is taken in the same sweep)
    residual_[root] = std::sqrt(sum_of_blocks(n, [&](std::size_t first, std::size_t size) {
      double* x = x_out.data() + first;
      double* a = a_out.data() + first;
      std::fill(x, x + size, 0.0), std::fill(a, a + size, 0.0);
      for (int j = 0; j < m; ++j) {
        const double y = vectors[j * m + root];
        const double *b = basis_[j].data() + first, *p = products_of_basis_[j].data() + first;
        for (std::size_t i = 0; i < size; ++i) x[i] += y * b[i], a[i] += y * p[i];
      }
      double* r = r_out.data() + first;
      for (std::size_t i = 0; i < size; ++i) r[i] = a[i] - theta * x[i];
      return block_dot(r, r, size);
    }));
    all_converged = all_converged && residual_[root] < options_.residual_tolerance;
  }
  if (all_converged || static_cast<std::size_t>(m) == n) {
    finish(true);
    return true;
  }
  if (products_ >= options_.max_products) {
    finish(false);
    return true;
  }
  int corrections = 0;
  for (int root = 0; root < k; ++root) {
    if (residual_[root] < options_.residual_tolerance) continue;
    ++corrections;
    std::vector<double>& t = r[root];
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) {  // diagonal preconditioner, kept away from zero
      double d = theta_[root] - diagonal_[i];
      if (std::fabs(d) < 1e-4) d = d < 0 ? -1e-4 : 1e-4;
      t[i] /= d;
    }
  }
  if (m + corrections > options_.max_basis) {  // restart from the Ritz vectors (and their products)
    basis_ = ritz_;
    products_of_basis_ = std::move(ax);
    projected_.assign(static_cast<std::size_t>(k) * k, 0.0);
    for (int root = 0; root < k; ++root) projected_[root * k + root] = theta_[root];
  }
  bool added = false;
  for (int root = 0; root < k; ++root)
    if (residual_[root] >= options_.residual_tolerance) added = add_direction(std::move(r[root])) || added;
  if (!added) finish(true);  // no new direction: the space is exhausted, the Ritz pairs are exact
  return done_;
}

}  // namespace qstage::sci
