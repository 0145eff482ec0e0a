#include "stages/sci/davidson.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace qstage::sci {

namespace {

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
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

void Davidson::set_diagonal(std::vector<double> diagonal) {
  if (diagonal.size() != basis_.front().size()) throw std::invalid_argument("Davidson: the diagonal has the wrong size");
  diagonal_ = std::move(diagonal);
}

void Davidson::add_direction(std::vector<double> t) {
  for (int pass = 0; pass < 2; ++pass)  // twice: Gram-Schmidt keeps the basis orthonormal to rounding
    for (const auto& b : basis_) {
      const double d = dot(b, t);
#pragma omp parallel for schedule(static)
      for (std::size_t i = 0; i < t.size(); ++i) t[i] -= d * b[i];
    }
  const double norm = std::sqrt(dot(t, t));
  if (!(norm > 1e-12)) {  // no new direction: the space is exhausted, the Ritz pair is exact
    finish(true);
    return;
  }
  scale(t, 1 / norm);
  basis_.push_back(std::move(t));
}

void Davidson::finish(bool converged) {
  done_ = true;
  converged_ = converged;
  basis_.clear(), products_of_basis_.clear(), projected_.clear();  // (only the Ritz pair is needed now)
}

void Davidson::save(Packer& out) const {
  out.put(options_), out.put(theta_), out.put(residual_), out.put(products_);
  out.put<std::uint8_t>(done_), out.put<std::uint8_t>(converged_);
  out.put_vector(diagonal_), out.put_vector(projected_), out.put_vector(ritz_);
  out.put<std::uint64_t>(basis_.size());
  for (std::size_t j = 0; j < basis_.size(); ++j) out.put_vector(basis_[j]);
  out.put<std::uint64_t>(products_of_basis_.size());
  for (std::size_t j = 0; j < products_of_basis_.size(); ++j) out.put_vector(products_of_basis_[j]);
}

void Davidson::load(Unpacker& in) {
  options_ = in.get<DavidsonOptions>(), theta_ = in.get<double>(), residual_ = in.get<double>(), products_ = in.get<int>();
  done_ = in.get<std::uint8_t>() != 0, converged_ = in.get<std::uint8_t>() != 0;
  diagonal_ = in.get_vector<double>(), projected_ = in.get_vector<double>(), ritz_ = in.get_vector<double>();
  basis_.resize(in.get<std::uint64_t>());
  for (auto& b : basis_) b = in.get_vector<double>();
  products_of_basis_.resize(in.get<std::uint64_t>());
  for (auto& p : products_of_basis_) p = in.get_vector<double>();
  if (!done_ && basis_.empty()) throw std::runtime_error("Davidson: a saved state without a basis");
}

bool Davidson::take(std::vector<double> product) {
  if (done_) throw std::logic_error("Davidson::take after it finished");
  if (diagonal_.empty()) throw std::logic_error("Davidson::take before set_diagonal");
  if (product.size() != diagonal_.size()) throw std::invalid_argument("Davidson: product of the wrong size");
  ++products_;
  products_of_basis_.push_back(std::move(product));
  const int m = static_cast<int>(basis_.size());
  // The projected matrix grows by a row and a column (symmetrized).
  std::vector<double> t(static_cast<std::size_t>(m) * m);
  for (int i = 0; i < m - 1; ++i)
    for (int j = 0; j < m - 1; ++j) t[i * m + j] = projected_[i * (m - 1) + j];
  for (int i = 0; i < m; ++i) {
    const double v = 0.5 * (dot(basis_[i], products_of_basis_[m - 1]) + dot(basis_[m - 1], products_of_basis_[i]));
    t[i * m + (m - 1)] = t[(m - 1) * m + i] = v;
  }
  projected_ = t;
  std::vector<double> values, vectors;
  symmetric_eigen(m, t, values, vectors);
  theta_ = values[0];
  const std::size_t n = diagonal_.size();
  ritz_.assign(n, 0.0);
  std::vector<double> ax(n, 0.0), r(n);
  // (per entry, the basis vectors in order: the same bits on any number of threads)
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) {
    double x = 0, a = 0;
    for (int j = 0; j < m; ++j) {
      const double y = vectors[j * m + 0];
      x += y * basis_[j][i];
      a += y * products_of_basis_[j][i];
    }
    ritz_[i] = x, ax[i] = a;
    r[i] = a - theta_ * x;
  }
  residual_ = std::sqrt(dot(r, r));
  if (residual_ < options_.residual_tolerance || static_cast<std::size_t>(m) == n) {
    finish(true);
    return true;
  }
  if (products_ >= options_.max_products) {
    finish(false);
    return true;
  }
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < n; ++i) {  // diagonal preconditioner, kept away from zero
    double d = theta_ - diagonal_[i];
    if (std::fabs(d) < 1e-4) d = d < 0 ? -1e-4 : 1e-4;
    r[i] /= d;
  }
  if (m >= options_.max_basis) {  // restart from the Ritz vector (and its product)
    basis_ = {ritz_};
    products_of_basis_ = {ax};
    projected_ = {theta_};
  }
  add_direction(std::move(r));
  return done_;
}

}  // namespace qstage::sci
