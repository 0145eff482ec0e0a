#include "stages/sci/davidson.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "kernels/sci/sci_davidson.hpp"

namespace qstage::sci {

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

// The vectors as slabs in one allocation: `capacity` basis vectors and as many products, a Ritz
// vector, its product and its residual a root, the diagonal, then the arithmetic's workspace
// (partial sums, and the scalars one step hands the next: Gram-Schmidt's coefficients, the
// projected matrix's new dots, the residuals' squares, the Ritz coefficients). Host memory
// (written before it is read, so left uninitialized) or one device buffer.
struct Davidson::Vectors {
  Vectors(std::uint64_t n, int capacity, int roots) : n(n), capacity(capacity), roots(roots) {}
  std::uint64_t n;
  int capacity, roots;
  std::unique_ptr<double[]> host;
  Buffer device;
  double* base = nullptr;

  std::uint64_t vector_doubles() const { return (2 * static_cast<std::uint64_t>(capacity) + 3 * roots + 1) * n; }
  std::uint64_t partial_doubles() const { return 2 * static_cast<std::uint64_t>(capacity) * kernels::fixed_sum_blocks(n); }
  std::uint64_t scalar_doubles() const { return (4 * static_cast<std::uint64_t>(capacity) + 1) + roots + static_cast<std::uint64_t>(roots) * capacity; }
  std::uint64_t bytes() const { return (vector_doubles() + partial_doubles() + scalar_doubles()) * sizeof(double); }

  double* basis(int j) const { return base + static_cast<std::uint64_t>(j) * n; }
  double* products(int j) const { return basis(capacity + j); }
  double* ritz(int r) const { return basis(2 * capacity + r); }
  double* ax(int r) const { return basis(2 * capacity + roots + r); }
  double* residual(int r) const { return basis(2 * capacity + 2 * roots + r); }
  double* diagonal() const { return basis(2 * capacity + 3 * roots); }
  double* partials() const { return base + vector_doubles(); }
  double* steps() const { return partials() + partial_doubles(); }        // 2 capacity + 1: Gram-Schmidt's
  double* dots() const { return steps() + 2 * capacity + 1; }             // 2 capacity: the projected matrix's
  double* residual_squares() const { return dots() + 2 * capacity; }      // roots
  double* coefficients() const { return residual_squares() + roots; }     // roots x capacity
};

namespace {

// A step on the stream (a device's) or, without one, the CPU twin on host memory.
template <typename Args>
void run(Stream* stream, void (*on_stream)(Stream&, const Args&), void (*on_host)(const Args&), const Args& args) {
  if (stream) on_stream(*stream, args);
  else on_host(args);
}

}  // namespace

Davidson::Davidson(std::vector<double> guess, DavidsonOptions options) : options_(options) {
  std::vector<std::vector<double>> guesses;
  guesses.push_back(std::move(guess));
  start(std::move(guesses));
}

Davidson::Davidson(std::vector<std::vector<double>> guesses, DavidsonOptions options) : options_(options) {
  if (guesses.empty()) throw std::invalid_argument("Davidson: an empty guess");
  if (guesses.size() > guesses.front().size() || static_cast<int>(guesses.size()) >= options.max_basis)
    throw std::invalid_argument("Davidson: more roots than the dimension or the basis allows");
  start(std::move(guesses));
}

Davidson::~Davidson() = default;

void Davidson::start(std::vector<std::vector<double>> guesses) {
  n_ = guesses.front().size();
  if (n_ == 0) throw std::invalid_argument("Davidson: an empty guess");
  roots_ = static_cast<int>(guesses.size());
  // (a restart keeps the Ritz vectors and adds a correction each: up to twice the roots)
  v_ = std::make_unique<Vectors>(n_, std::max(options_.max_basis, 2 * roots_), roots_);
  v_->host = std::make_unique_for_overwrite<double[]>(v_->bytes() / sizeof(double));
  v_->base = v_->host.get();
  double* first = v_->basis(0);
  std::copy(guesses.front().begin(), guesses.front().end(), first);
  double* square = v_->steps();
  kernels::subtract_then_dot_cpu({first, nullptr, nullptr, first, n_, v_->partials(), square});
  if (!(std::sqrt(*square) > 0)) throw std::invalid_argument("Davidson: the guess is zero");
  kernels::scale_to_unit_cpu({first, square, n_});
  basis_count_ = 1;
  for (std::size_t g = 1; g < guesses.size(); ++g) {
    if (guesses[g].size() != n_) throw std::invalid_argument("Davidson: guesses of different sizes");
    if (!add_direction(guesses[g].data())) throw std::invalid_argument("Davidson: the guesses are linearly dependent");
  }
}

bool Davidson::place(Backend& backend, Stream& stream) {
  if (on_backend_ || done_) return on_backend_;
  if (backend.kind() == BackendKind::cpu) return on_backend_ = true;  // (the host's memory is the backend's)
  const MemoryBudget& budget = backend.device_budget();
  const std::uint64_t half_left = budget.left() / 2;
  if (v_->bytes() > half_left) return false;
  auto placed = std::make_unique<Vectors>(n_, v_->capacity, v_->roots);
  placed->device = backend.alloc_device(placed->bytes(), "selected-CI Davidson vectors");
  placed->base = placed->device.as<double>();
  const auto upload = [&](double* (Vectors::*at)(int) const, int count) {
    if (count > 0) backend.copy_to_device((placed.get()->*at)(0), ((*v_).*at)(0), count * n_ * sizeof(double), stream);
  };
  upload(&Vectors::basis, basis_count_);
  upload(&Vectors::products, product_count_);
  upload(&Vectors::ritz, ritz_count_);
  upload(&Vectors::ax, ritz_count_);
  if (!diagonal_.empty()) backend.copy_to_device(placed->diagonal(), diagonal_.data(), n_ * sizeof(double), stream);
  stream.synchronize();
  v_ = std::move(placed);
  backend_ = &backend, stream_ = &stream, on_backend_ = true;
  return true;
}

std::vector<double> Davidson::read_back(const double* at, std::size_t count) const {
  std::vector<double> out(count);
  if (!stream_) {
    std::copy(at, at + count, out.begin());
    return out;
  }
  backend_->copy_to_host(out.data(), at, count * sizeof(double), *stream_);
  stream_->synchronize();
  return out;
}

void Davidson::set_diagonal(std::vector<double> diagonal) {
  if (diagonal.size() != n_) throw std::invalid_argument("Davidson: the diagonal has the wrong size");
  diagonal_ = std::move(diagonal);
  if (!v_) return;
  if (stream_) backend_->copy_to_device(v_->diagonal(), diagonal_.data(), n_ * sizeof(double), *stream_);
  else std::copy(diagonal_.begin(), diagonal_.end(), v_->diagonal());
}

std::span<const double> Davidson::next() const {
  if (done_) throw std::logic_error("Davidson::next after it finished");
  return {v_->basis(product_count_), n_};
}

double* Davidson::product_slot() {
  if (done_) throw std::logic_error("Davidson::product_slot after it finished");
  return v_->products(product_count_);
}

const std::vector<double>& Davidson::eigenvector(int r) const {
  if (!done_) throw std::logic_error("Davidson::eigenvector before it finished");
  return eigenvectors_.at(static_cast<std::size_t>(r));
}

// False (the basis unchanged) when t has no direction outside the basis.
bool Davidson::add_direction(const double* source) {
  double* t = v_->basis(basis_count_);
  if (stream_) backend_->copy_on_device(t, source, n_ * sizeof(double), *stream_);
  else if (t != source) std::copy(source, source + n_, t);
  // Twice (Gram-Schmidt keeps the basis orthonormal to rounding): t -= (b, t) b for each b in
  // turn, each subtraction swept together with the next dot product (and the last with the norm's);
  // each coefficient stays where its step wrote it.
  double* steps = v_->steps();
  const double* last = nullptr;
  int step = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int j = 0; j < basis_count_; ++j, ++step) {
      run(stream_, kernels::subtract_then_dot, kernels::subtract_then_dot_cpu,
          {t, last, step > 0 ? steps + step - 1 : nullptr, v_->basis(j), n_, v_->partials(), steps + step});
      last = v_->basis(j);
    }
  run(stream_, kernels::subtract_then_dot, kernels::subtract_then_dot_cpu,
      {t, last, steps + step - 1, t, n_, v_->partials(), steps + step});
  const double norm = std::sqrt(read_back(steps + step, 1).front());
  if (!(norm > 1e-12)) return false;
  run(stream_, kernels::scale_to_unit, kernels::scale_to_unit_cpu, {t, steps + step, n_});
  ++basis_count_;
  return true;
}

void Davidson::finish(bool converged) {
  done_ = true;
  converged_ = converged;
  eigenvectors_.clear();
  for (int r = 0; r < ritz_count_; ++r) eigenvectors_.push_back(read_back(v_->ritz(r), n_));
  // (only the Ritz pairs are needed now)
  v_.reset(), projected_.clear();
  basis_count_ = product_count_ = ritz_count_ = 0;
  backend_ = nullptr, stream_ = nullptr, on_backend_ = false;
}

void Davidson::save(Packer& out) const {
  out.put(options_), out.put(roots_), out.put(products_);
  out.put<std::uint8_t>(done_), out.put<std::uint8_t>(converged_);
  out.put_vector(theta_), out.put_vector(residual_);
  out.put_vector(diagonal_), out.put_vector(projected_);
  // (the Ritz vectors, the basis, their products: lists of vectors)
  if (done_) {
    out.put<std::uint64_t>(eigenvectors_.size());
    for (const auto& v : eigenvectors_) out.put_vector(v);
    out.put<std::uint64_t>(0), out.put<std::uint64_t>(0);
    return;
  }
  for (const auto& [at, count] : {std::pair{&Vectors::ritz, ritz_count_}, std::pair{&Vectors::basis, basis_count_},
                                  std::pair{&Vectors::products, product_count_}}) {
    out.put<std::uint64_t>(static_cast<std::uint64_t>(count));
    if (count > 0) {
      const std::vector<double> all = read_back(((*v_).*at)(0), static_cast<std::size_t>(count) * n_);
      for (int j = 0; j < count; ++j)
        out.put_vector(std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(j * n_), all.begin() + static_cast<std::ptrdiff_t>((j + 1) * n_)));
    }
  }
}

void Davidson::load(Unpacker& in) {
  options_ = in.get<DavidsonOptions>(), roots_ = in.get<int>(), products_ = in.get<int>();
  done_ = in.get<std::uint8_t>() != 0, converged_ = in.get<std::uint8_t>() != 0;
  theta_ = in.get_vector<double>(), residual_ = in.get_vector<double>();
  diagonal_ = in.get_vector<double>(), projected_ = in.get_vector<double>();
  std::vector<std::vector<double>> lists[3];  // the Ritz vectors, the basis, their products
  for (auto& list : lists) {
    list.resize(in.get<std::uint64_t>());
    for (auto& v : list) v = in.get_vector<double>();
  }
  auto& [ritz, basis, products] = lists;
  backend_ = nullptr, stream_ = nullptr, on_backend_ = false;
  v_.reset();
  basis_count_ = product_count_ = ritz_count_ = 0;
  if (done_) {
    eigenvectors_ = std::move(ritz);
    return;
  }
  eigenvectors_.clear();
  const int capacity = std::max(options_.max_basis, 2 * roots_);
  if (basis.empty() || products.size() >= basis.size() || basis.size() > static_cast<std::size_t>(capacity) ||
      ritz.size() > static_cast<std::size_t>(roots_) || roots_ < 1)
    throw std::runtime_error("Davidson: a saved state without a vector to multiply");
  n_ = basis.front().size();
  for (const auto* list : {&ritz, &basis, &products})
    for (const auto& v : *list)
      if (v.size() != n_) throw std::runtime_error("Davidson: a saved state with vectors of different sizes");
  if (!diagonal_.empty() && diagonal_.size() != n_) throw std::runtime_error("Davidson: a saved state with a diagonal of the wrong size");
  v_ = std::make_unique<Vectors>(n_, capacity, roots_);
  v_->host = std::make_unique_for_overwrite<double[]>(v_->bytes() / sizeof(double));
  v_->base = v_->host.get();
  for (std::size_t j = 0; j < ritz.size(); ++j) std::copy(ritz[j].begin(), ritz[j].end(), v_->ritz(static_cast<int>(j)));
  for (std::size_t j = 0; j < basis.size(); ++j) std::copy(basis[j].begin(), basis[j].end(), v_->basis(static_cast<int>(j)));
  for (std::size_t j = 0; j < products.size(); ++j) std::copy(products[j].begin(), products[j].end(), v_->products(static_cast<int>(j)));
  if (!diagonal_.empty()) std::copy(diagonal_.begin(), diagonal_.end(), v_->diagonal());
  ritz_count_ = static_cast<int>(ritz.size()), basis_count_ = static_cast<int>(basis.size());
  product_count_ = static_cast<int>(products.size());
}

// The projected matrix grows by the row and column of the basis vector whose product just came
// (symmetrized).
void Davidson::extend_projected() {
  const int m = product_count_;
  const std::uint64_t blocks = kernels::fixed_sum_blocks(n_);
  run(stream_, kernels::fixed_dots, kernels::fixed_dots_cpu,
      {v_->basis(0), n_, v_->products(m - 1), 0, m, n_, v_->partials(), v_->dots()});
  run(stream_, kernels::fixed_dots, kernels::fixed_dots_cpu,
      {v_->basis(m - 1), 0, v_->products(0), n_, m, n_, v_->partials() + static_cast<std::uint64_t>(m) * blocks, v_->dots() + m});
  const std::vector<double> dots = read_back(v_->dots(), 2 * static_cast<std::size_t>(m));
  std::vector<double> t(static_cast<std::size_t>(m) * m);
  for (int i = 0; i < m - 1; ++i)
    for (int j = 0; j < m - 1; ++j) t[i * m + j] = projected_[i * (m - 1) + j];
  for (int i = 0; i < m; ++i) t[i * m + (m - 1)] = t[(m - 1) * m + i] = 0.5 * (dots[i] + dots[m + i]);
  projected_ = std::move(t);
}

bool Davidson::take(std::span<const double> product) {
  if (done_) throw std::logic_error("Davidson::take after it finished");
  if (product.size() != n_) throw std::invalid_argument("Davidson: product of the wrong size");
  double* slot = v_->products(product_count_);
  if (stream_) backend_->copy_to_device(slot, product.data(), n_ * sizeof(double), *stream_);
  else std::copy(product.begin(), product.end(), slot);
  return take_in_place();
}

bool Davidson::take_in_place(int count) {
  if (done_) throw std::logic_error("Davidson::take after it finished");
  if (diagonal_.empty()) throw std::logic_error("Davidson::take before set_diagonal");
  if (count < 1 || count > pending()) throw std::logic_error("Davidson::take_in_place: more products than pending vectors");
  for (int k = 0; k < count; ++k) {
    ++products_;
    ++product_count_;
    extend_projected();
  }
  if (product_count_ < basis_count_) return false;  // (more directions to multiply first)
  return advance();
}

// The basis has every product: the Ritz pairs, then convergence, or the next directions.
bool Davidson::advance() {
  const int m = basis_count_;
  std::vector<double> values, vectors;
  symmetric_eigen(m, projected_, values, vectors);
  const int k = std::min(roots_, m);
  theta_.assign(values.begin(), values.begin() + k);
  std::vector<double> y(static_cast<std::size_t>(k) * m);  // root r's coefficients at r * m
  for (int root = 0; root < k; ++root)
    for (int j = 0; j < m; ++j) y[root * m + j] = vectors[j * m + root];
  if (stream_) backend_->copy_to_device(v_->coefficients(), y.data(), y.size() * sizeof(double), *stream_);
  else std::copy(y.begin(), y.end(), v_->coefficients());
  for (int root = 0; root < k; ++root)
    run(stream_, kernels::ritz_vector, kernels::ritz_vector_cpu,
        {v_->basis(0), v_->products(0), n_, v_->coefficients() + root * m, m, theta_[root], n_, v_->ritz(root), v_->ax(root),
         v_->residual(root), v_->partials(), v_->residual_squares() + root});
  ritz_count_ = k;
  residual_ = read_back(v_->residual_squares(), static_cast<std::size_t>(k));
  bool all_converged = true;
  for (double& r : residual_) {
    r = std::sqrt(r);
    all_converged = all_converged && r < options_.residual_tolerance;
  }
  if (all_converged || static_cast<std::uint64_t>(m) == n_) {
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
    run(stream_, kernels::precondition, kernels::precondition_cpu, {v_->residual(root), v_->diagonal(), theta_[root], n_});
  }
  if (m + corrections > options_.max_basis) {  // restart from the Ritz vectors (and their products)
    const std::size_t bytes = static_cast<std::size_t>(k) * n_ * sizeof(double);
    if (stream_) {
      backend_->copy_on_device(v_->basis(0), v_->ritz(0), bytes, *stream_);
      backend_->copy_on_device(v_->products(0), v_->ax(0), bytes, *stream_);
    } else {
      std::copy(v_->ritz(0), v_->ritz(0) + k * n_, v_->basis(0));
      std::copy(v_->ax(0), v_->ax(0) + k * n_, v_->products(0));
    }
    basis_count_ = product_count_ = k;
    projected_.assign(static_cast<std::size_t>(k) * k, 0.0);
    for (int root = 0; root < k; ++root) projected_[root * k + root] = theta_[root];
  }
  bool added = false;
  for (int root = 0; root < k; ++root)
    if (residual_[root] >= options_.residual_tolerance) added = add_direction(v_->residual(root)) || added;
  if (!added) finish(true);  // no new direction: the space is exhausted, the Ritz pairs are exact
  return done_;
}

}  // namespace qstage::sci
