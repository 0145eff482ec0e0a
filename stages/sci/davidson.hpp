#pragma once
// The lowest eigenpairs of a real symmetric operator known only through products A v (Davidson's
// method with the diagonal preconditioner; several roots as Davidson and Liu do: one correction a
// root not yet converged, the basis restarted from the Ritz vectors), as a state machine: next()
// is the vector to multiply, take(A next()) advances. Every step is deterministic host arithmetic
// (the loops over the vector's entries run on OpenMP threads, each entry summed in the same order,
// so the bits do not depend on the thread count); save() and load() carry the whole state bit for
// bit, so a resumed run continues where it stopped.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/serial.hpp"

namespace qstage::sci {

struct DavidsonOptions {
  double residual_tolerance = 1e-7;  // converged when ||A x - theta x|| < this
  int max_basis = 24;                // restart with the current Ritz vector when the basis is full
  int max_products = 400;            // stop (not converged) after this many products
};

class Davidson {
 public:
  // `guess`: a start vector (normalized here), for the lowest root. A's diagonal (the
  // preconditioner) is set before the first take(): it can come with the first product.
  explicit Davidson(std::vector<double> guess, DavidsonOptions options = {});
  // The lowest guesses.size() roots from as many start vectors (orthonormalized here; at most
  // the dimension, and fewer than options.max_basis).
  explicit Davidson(std::vector<std::vector<double>> guesses, DavidsonOptions options = {});
  void set_diagonal(std::vector<double> diagonal);
  const std::vector<double>& next() const {
    if (done_) throw std::logic_error("Davidson::next after it finished");
    return basis_[products_of_basis_.size()];
  }
  // Hands A next(); returns true once every root converged (or out of products: see converged()).
  bool take(std::vector<double> product);
  bool done() const { return done_; }
  bool converged() const { return converged_; }
  int roots() const { return roots_; }
  // The lowest root's pair, and root r's (ascending eigenvalues).
  double eigenvalue(int r = 0) const { return theta_.at(static_cast<std::size_t>(r)); }
  const std::vector<double>& eigenvector(int r = 0) const { return ritz_.at(static_cast<std::size_t>(r)); }
  double residual_norm(int r = 0) const { return residual_.at(static_cast<std::size_t>(r)); }
  int products() const { return products_; }

  // The state, packed; once done() only what the results need (the basis is gone by then).
  void save(Packer& out) const;
  void load(Unpacker& in);

 private:
  bool add_direction(std::vector<double> t);
  void extend_projected();
  void finish(bool converged);
  std::vector<double> diagonal_;
  DavidsonOptions options_;
  int roots_ = 1;
  // The basis, and the products of its first vectors (the rest are next() in turn).
  std::vector<std::vector<double>> basis_, products_of_basis_;
  std::vector<double> projected_;  // basis' A basis over the vectors with products, row-major
  std::vector<std::vector<double>> ritz_;
  std::vector<double> theta_, residual_;
  int products_ = 0;
  bool done_ = false, converged_ = false;
};

// All eigenvalues and eigenvectors of a small dense symmetric matrix (cyclic Jacobi; ascending
// eigenvalues, eigenvectors as columns of `vectors`, n x n row-major). Deterministic.
void symmetric_eigen(int n, std::vector<double> a, std::vector<double>& values, std::vector<double>& vectors);

}  // namespace qstage::sci
