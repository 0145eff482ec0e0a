#pragma once
// The lowest eigenpairs of a real symmetric operator known only through products A v (Davidson's
// method with the diagonal preconditioner; several roots as Davidson and Liu do: one correction a
// root not yet converged, the basis restarted from the Ritz vectors), as a state machine: next()
// is the vector to multiply, take(A next()) advances.
//
// Its vectors (the basis, their products, the Ritz vectors and residuals) live in host memory
// until place() moves them to a backend's device, where they stay until Davidson is done: the
// caller's product kernel then reads next() and writes product_slot() in place, and a product
// costs its kernel and Davidson's own kernels, no copies. Every step is the fixed-shape arithmetic
// of kernels/sci/sci_davidson.hpp, whose bits do not depend on the threads or on the backend; only
// the small projected eigenproblem is solved on the host. save() and load() carry the whole state
// bit for bit, so a resumed run continues where it stopped.
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <vector>

#include "backend/backend.hpp"
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
  ~Davidson();
  Davidson(const Davidson&) = delete;
  Davidson& operator=(const Davidson&) = delete;

  // Moves the vectors to the backend's device when they fit half of its budget left (on cpu the
  // host's memory is the backend's: nothing moves); the stream then runs Davidson's arithmetic
  // until done(). Returns on_backend().
  bool place(Backend& backend, Stream& stream);
  // Whether next() and product_slot() are memory the placed backend's kernels read and write.
  bool on_backend() const { return on_backend_; }

  void set_diagonal(std::vector<double> diagonal);
  // The vector to multiply (device memory once placed on a cuda backend).
  std::span<const double> next() const;
  // How many vectors wait for their products (a correction a root not yet converged): next() and
  // the pending() - 1 after it, one after the other in memory.
  int pending() const { return basis_count_ - product_count_; }
  // Where A next() goes when the caller writes it in place, and the products of the vectors after
  // it after that (then take_in_place(count)).
  double* product_slot();
  // Hands A next(); returns true once every root converged (or out of products: see converged()).
  bool take(std::span<const double> product);
  // Takes the products of the next `count` vectors (at most pending()) written at product_slot():
  // the same steps, so the same bits, as taking them one at a time.
  bool take_in_place(int count = 1);
  bool done() const { return done_; }
  bool converged() const { return converged_; }
  int roots() const { return roots_; }
  std::uint64_t dimension() const { return n_; }
  // The lowest root's pair, and root r's (ascending eigenvalues); the vectors once done().
  double eigenvalue(int r = 0) const { return theta_.at(static_cast<std::size_t>(r)); }
  const std::vector<double>& eigenvector(int r = 0) const;
  double residual_norm(int r = 0) const { return residual_.at(static_cast<std::size_t>(r)); }
  int products() const { return products_; }

  // The state, packed; once done() only what the results need (the basis is gone by then).
  void save(Packer& out) const;
  void load(Unpacker& in);

 private:
  struct Vectors;  // the slabs of vectors, in host or device memory
  void start(std::vector<std::vector<double>> guesses);
  bool advance();
  bool add_direction(const double* t);
  void extend_projected();
  void finish(bool converged);
  std::vector<double> read_back(const double* at, std::size_t count) const;
  std::vector<double> diagonal_;  // (the host's copy; the preconditioner reads the slab's)
  DavidsonOptions options_;
  int roots_ = 1;
  std::uint64_t n_ = 0;
  std::unique_ptr<Vectors> v_;
  Backend* backend_ = nullptr;  // (once placed on a device)
  Stream* stream_ = nullptr;
  bool on_backend_ = false;
  // The basis vectors, the first `products` of which have products (the next is next()).
  int basis_count_ = 0, product_count_ = 0, ritz_count_ = 0;
  std::vector<double> projected_;  // basis' A basis over the vectors with products, row-major
  std::vector<std::vector<double>> eigenvectors_;  // (the Ritz vectors, on the host once done)
  std::vector<double> theta_, residual_;
  int products_ = 0;
  bool done_ = false, converged_ = false;
};

// All eigenvalues and eigenvectors of a small dense symmetric matrix (cyclic Jacobi; ascending
// eigenvalues, eigenvectors as columns of `vectors`, n x n row-major). Deterministic.
void symmetric_eigen(int n, std::vector<double> a, std::vector<double>& values, std::vector<double>& vectors);

}  // namespace qstage::sci
