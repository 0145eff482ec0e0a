#include "stages/nnqs/nnqs_run.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "core/error.hpp"
#include "core/serial.hpp"
#include "engine/tree_fold.hpp"
#include "kernels/sci/sci_generate.hpp"
#include "kernels/keys/sort_unique.hpp"
#include "stages/keys/dedup_passes.hpp"
#include "stages/nnqs/network.hpp"
#include "stages/sci/davidson.hpp"
#include "stages/sci/problem.hpp"
#include "stages/sci/resident_space.hpp"
#include "stages/common/results.hpp"

namespace qstage::nnqs {
namespace {

using kernels::sci::Candidate;
using kernels::sci::Det;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What an iteration found (the history written under iterations/).
struct Iteration {
  std::uint64_t dets = 0;                       // |S| optimized on
  double energy = 0, variance = 0;              // at the iteration's last parameters
  double ci_energy = 0;                         // H's lowest eigenvalue within S: the lowest E on S
  double coupled_energy = 0;                    // E over S and its coupled set: what the steps minimize
  // 1 - |<c|psi>|^2 / <psi|psi> against that eigenvector c, and the same of the moduli alone
  // (|c| against |psi|): where the second is small and the first is not, the phases are off.
  double infidelity = 0, modulus_infidelity = 0;
  std::uint64_t fit_steps = 0;                  // AdamW steps the fit took
  std::uint64_t generated = 0, unique = 0;      // coupled determinants, and unique ones outside S in the irrep
  std::uint64_t selected = 0;                   // joined S
  double seconds_generate = 0, seconds_dedup = 0, seconds_inference = 0, seconds_optimize = 0;
  void put(Packer& out) const {
    out.put(dets), out.put(energy), out.put(variance), out.put(ci_energy), out.put(coupled_energy);
    out.put(infidelity), out.put(modulus_infidelity);
    out.put(fit_steps), out.put(generated), out.put(unique), out.put(selected);
    out.put(seconds_generate), out.put(seconds_dedup), out.put(seconds_inference), out.put(seconds_optimize);
  }
  void get(Unpacker& in) {
    dets = in.get<std::uint64_t>(), energy = in.get<double>(), variance = in.get<double>(), ci_energy = in.get<double>();
    coupled_energy = in.get<double>();
    infidelity = in.get<double>(), modulus_infidelity = in.get<double>(), fit_steps = in.get<std::uint64_t>();
    generated = in.get<std::uint64_t>(), unique = in.get<std::uint64_t>(), selected = in.get<std::uint64_t>();
    seconds_generate = in.get<double>(), seconds_dedup = in.get<double>();
    seconds_inference = in.get<double>(), seconds_optimize = in.get<double>();
  }
};

// The occupations of determinants as the network reads them (network.hpp).
std::vector<std::uint8_t> occupation_bits(const Det* dets, std::size_t n, int norb) {
  std::vector<std::uint8_t> bits(n * 2 * static_cast<std::size_t>(norb));
  for (std::size_t i = 0; i < n; ++i)
    for (int p = 0; p < norb; ++p) {
      bits[(i * static_cast<std::size_t>(norb) + static_cast<std::size_t>(p)) * 2] = (dets[i].alpha >> p) & 1u;
      bits[(i * static_cast<std::size_t>(norb) + static_cast<std::size_t>(p)) * 2 + 1] = (dets[i].beta >> p) & 1u;
    }
  return bits;
}

// d/d(psi) of 1 - |<c|psi>|^2 / <psi|psi> (c real, normalized; psi: real parts, then imaginary),
// and that infidelity into *infidelity.
std::vector<double> infidelity_gradient(const std::vector<double>& c, const std::vector<double>& psi, double* infidelity) {
  const std::size_t n = c.size();
  double re = 0, im = 0, norm = 0;
  for (std::size_t i = 0; i < n; ++i) re += c[i] * psi[i], im += c[i] * psi[n + i];
  for (const double v : psi) norm += v * v;
  const double overlap = re * re + im * im;
  *infidelity = 1 - overlap / norm;
  std::vector<double> g(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = -(2 * re * c[i] * norm - overlap * 2 * psi[i]) / (norm * norm);
    g[n + i] = -(2 * im * c[i] * norm - overlap * 2 * psi[n + i]) / (norm * norm);
  }
  return g;
}

// The determinants coupled to S (|H_as| > eps_couple) outside it, in the target's irrep, sorted,
// and H between them and S: the rows whose amplitudes the energy's local terms reach (seed 004,
// section 3), and among which the space grows.
struct CoupledSet {
  std::vector<Det> dets;
  std::vector<double> diagonal;        // H_aa of each
  std::vector<std::uint64_t> offsets;  // |S| + 1: row s of S couples to columns[offsets[s], offsets[s + 1])
  std::vector<std::uint64_t> columns;  // indices into dets
  std::vector<double> elements;        // H_as
  std::uint64_t generated = 0;         // coupled determinants, duplicates and S's own included
  double seconds_generate = 0, seconds_dedup = 0;

  static CoupledSet empty(std::uint64_t space_rows) {
    CoupledSet c;
    c.offsets.assign(space_rows + 1, 0);
    return c;
  }
  std::uint64_t rows() const { return dets.size(); }
  // Its rows cut into `parts` strides (stride p: the rows a with a % parts == p, in order), H_as
  // kept with them; one pass over the couplings.
  std::vector<CoupledSet> strides(std::uint64_t parts) const {
    std::vector<CoupledSet> out(parts);
    for (std::uint64_t a = 0; a < rows(); ++a) out[a % parts].dets.push_back(dets[a]), out[a % parts].diagonal.push_back(diagonal[a]);
    for (CoupledSet& c : out) c.offsets.assign(offsets.size(), 0);
    for (std::uint64_t s = 0; s + 1 < offsets.size(); ++s) {
      for (std::uint64_t e = offsets[s]; e < offsets[s + 1]; ++e) {
        CoupledSet& c = out[columns[e] % parts];
        c.columns.push_back(columns[e] / parts), c.elements.push_back(elements[e]);
      }
      for (CoupledSet& c : out) c.offsets[s + 1] = c.columns.size();
    }
    return out;
  }
  // out[s] += sum_a H_sa x[n + a] and out[n + a] += sum_s H_as x[s], for S's n rows then the coupled
  // ones (one real component; in row order: the same bits on every rank count).
  void apply(const double* x, double* out, std::uint64_t n) const {
    for (std::uint64_t s = 0; s < n; ++s)
      for (std::uint64_t e = offsets[s]; e < offsets[s + 1]; ++e) {
        out[s] += elements[e] * x[n + columns[e]];
        out[n + columns[e]] += elements[e] * x[s];
      }
  }
};

// Coupled rows a step trains on beside S, at least (about |S| of them where S is larger).
constexpr std::uint64_t kCoupledRowsPerStep = 256;

// The coupled set of `space` (sorted): kernels::sci_generate from every row with a coefficient of 1
// (its records in row order, each with H_as), de-duplicated by keys.dedup's radix sort.
CoupledSet coupled_of(const sci::Problem& problem, const std::vector<Det>& space, double eps_couple, Backend& backend) {
  CoupledSet c;
  const std::uint64_t n = space.size(), room = n * problem.max_per_source;
  auto start = Clock::now();
  const BudgetHold records_charge =
      backend.hold_host(room * (2 * sizeof(Candidate) + 3 * 8 + 8 + 8), "sci.nnqs coupled determinants");
  std::vector<Candidate> records(room);
  std::vector<std::uint64_t> workspace(2 * n);
  const std::vector<double> ones(n, 1.0);
  std::uint64_t count = 0;
  kernels::SciGenerate g{};
  g.h = problem.host, g.nalpha = problem.na, g.nbeta = problem.nb;
  g.sources = space.data(), g.coefficients = ones.data(), g.n = n, g.eps = eps_couple;
  g.out = records.data(), g.count = &count, g.workspace = workspace.data();
  kernels::sci_generate_cpu(g);
  records.resize(count);
  c.generated = count;
  c.seconds_generate = seconds_since(start);
  // Unique, then those outside S in the target's irrep (ascending); the sort takes a copy, since
  // the records' order says which row of S each came from.
  start = Clock::now();
  std::vector<Candidate> sorting(records);
  std::vector<std::uint64_t> spare(count * 3);
  std::vector<double> values(count);
  const std::uint64_t tile_rows = stages::keys::DedupSource{}.tile_rows;  // (keys.dedup's tiles)
  const kernels::cpu::RadixUnique sorted(
      {reinterpret_cast<std::uint64_t*>(sorting.data()), spare.data(), values.data(), count, 2, tile_rows});
  std::vector<std::uint64_t> unique_keys(sorted.tile_records() * 2), counts(sorted.tile_records());
  std::vector<double> sums(sorted.tile_records());
  sorted.write(unique_keys.data(), counts.data(), sums.data());
  for (std::uint64_t u = 0; u < sorted.unique(); ++u) {
    const Det d{unique_keys[2 * u], unique_keys[2 * u + 1]};
    if (!std::binary_search(space.begin(), space.end(), d) && problem.symmetry.irrep(d) == problem.target.irrep)
      c.dets.push_back(d);
  }
  c.diagonal.resize(c.dets.size());
  for (std::size_t a = 0; a < c.dets.size(); ++a) c.diagonal[a] = kernels::sci::diagonal(problem.host, c.dets[a]);
  // H_as of the records that landed in the set, row by row of S.
  c.offsets.assign(n + 1, 0);
  for (std::uint64_t s = 0; s < n; ++s) {
    const std::uint64_t end = s + 1 < n ? workspace[n + s + 1] : count;
    for (std::uint64_t r = workspace[n + s]; r < end; ++r) {
      const Det d{records[r].alpha, records[r].beta};
      const auto at = std::lower_bound(c.dets.begin(), c.dets.end(), d);
      if (at == c.dets.end() || !(*at == d)) continue;  // (in S, or of another irrep)
      c.columns.push_back(static_cast<std::uint64_t>(at - c.dets.begin()));
      c.elements.push_back(records[r].value);
    }
    c.offsets[s + 1] = c.columns.size();
  }
  c.seconds_dedup = seconds_since(start);
  return c;
}

// dL/d(log |psi|) and dL/dphi of a loss L (2 |S| values: one of each a row) from psi over S (real
// parts, then imaginary parts), on rank 0; empty when the loss is low enough that no step should
// be taken.
using LossGradient = std::function<std::vector<double>(const std::vector<double>& psi)>;

// dL/dpsi (real parts, then imaginary parts) as dL/d(log |psi|) and dL/dphi (psi = |psi| e^{i phi}).
std::vector<double> through_log_and_phase(const std::vector<double>& g, const std::vector<double>& psi) {
  const std::size_t n = psi.size() / 2;
  std::vector<double> d(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    d[i] = g[i] * psi[i] + g[n + i] * psi[n + i];
    d[n + i] = -g[i] * psi[n + i] + g[n + i] * psi[i];
  }
  return d;
}

// The fit's loss against H's lowest eigenvector c within S (c real, normalized): the cross-entropy
// of |psi|^2 (normalized on S) against c^2, -sum_i c_i^2 log(|psi_i|^2 / sum_j |psi_j|^2), plus
// sum_i c_i^2 (1 - cos(phi_i - arg c_i)) for the signs. Its gradient in log |psi| is 2 (p_i - c_i^2):
// every probability pulled to its target directly. The fit adds it to the infidelity's, which
// alone left N2's moduli off (the network 9-54 mHa above its space's lowest energy; with both,
// 0.14-0.34 mHa: docs/benchmarks.md, "NNQS-SCI: the fit's loss, and N2 again").
std::vector<double> likelihood_gradient(const std::vector<double>& c, const std::vector<double>& psi) {
  const std::size_t n = c.size();
  double norm = 0;
  for (std::size_t i = 0; i < n; ++i) norm += psi[i] * psi[i] + psi[n + i] * psi[n + i];
  std::vector<double> d(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const double w = c[i] * c[i], modulus = std::hypot(psi[i], psi[n + i]);
    d[i] = 2 * (modulus * modulus / norm - w);
    // d/dphi of w (1 - cos(phi - theta)), theta = 0 or pi: w sin(phi - theta) = +-w sin(phi)
    const double sin_phi = modulus > 0 ? psi[n + i] / modulus : 0.0;
    d[n + i] = (c[i] < 0 ? -w : w) * sin_phi;
  }
  return d;
}

class NnqsRun final : public stages::StepRun {
 public:
  NnqsRun(const stages::StepContext& ctx, NnqsParams params)
      : ctx_(ctx), params_(std::move(params)), problem_(ctx.files.at("/fcidump"), params_.state) {
    if (root()) sci::log_target(problem_, "sci.nnqs");
    if (problem_.ints.norb > 64) throw InputError("sci.nnqs: the FCIDUMP has more than 64 orbitals; expected at most 64");
    NetworkShape shape = params_.network;
    shape.norb = problem_.ints.norb, shape.nalpha = problem_.na, shape.nbeta = problem_.nb;
    shape.cuda_device = ctx.backend->cuda_device();  // (the network shares the run's GPU)
    if (shape.cuda_device >= 0) {  // its share: half the device budget left; H within S takes from the rest
      const MemoryBudget& budget = ctx.backend->device_budget();
      shape.device_memory = budget.left() / 2;
    }
    network_ = make_network(shape);
    if (network_->where().rfind("cuda", 0) == 0)
      network_share_ =
          ctx.backend->hold_device(shape.device_memory, "sci.nnqs network (LibTorch's allocator, capped at it)");
    space_ = {problem_.target.reference};
    stream_ = ctx.backend->make_stream();
    if (root())
      spdlog::info("sci.nnqs: a network of {} parameters (embedding {}, {} layers, {} heads, phase hidden {}), float64 on "
                   "{}; H within the space on {}",
                   network_->parameters(), shape.embedding, shape.layers, shape.heads, fmt::join(shape.phase_hidden, "x"),
                   network_->where(), ctx.backend->description());
    if (root() && shape.cuda_device >= 0 && network_->where().rfind("cuda", 0) != 0)
      spdlog::warn("sci.nnqs: the network runs on the host, not on the run's GPU: the plugin's LibTorch has no CUDA (build "
                   "stages/nnqs/model against a CUDA LibTorch to train it on the GPU)");
  }

  bool done() const override { return done_; }

  std::optional<stages::StepPass> next() override {
    iterate();
    return std::nullopt;
  }

  stages::HostProgress progress() const override {
    return {static_cast<std::uint64_t>(iteration_), static_cast<std::uint64_t>(params_.max_iterations), "iterations", true};
  }

  stages::StepPass output(stages::StagePlan& plan) override {
    stages::copy_from_root(*this, ctx_.comm);
    return stages::planned_pass(plan, stages::no_pass_kernel());
  }

  void write(const stages::StagePlan&, const stages::StepPass&, h5::File& out) const override;
  std::string describe(const stages::StagePlan&, const stages::StepPass&) const override;
  std::string save() const override;
  void load(std::string_view state) override;

 private:
  bool root() const { return !ctx_.comm || ctx_.comm->root(); }
  int ranks() const { return ctx_.comm ? ctx_.comm->size() : 1; }
  int rank() const { return ctx_.comm ? ctx_.comm->rank() : 0; }
  // Every rank's bytes on rank 0 in rank order; rank 0's bytes on every rank.
  std::vector<std::string> gather(const std::string& mine) const {
    return ranks() > 1 ? ctx_.comm->gather(mine) : std::vector<std::string>{mine};
  }
  std::string broadcast(const std::string& value) const { return ranks() > 1 ? ctx_.comm->broadcast(value) : value; }
  void iterate();
  // One AdamW step on a loss of psi over the space x, its forward and backward passes shared by
  // the ranks in units of train_batch rows; `loss_gradient` runs on rank 0. False, and no step,
  // when the loss asked for none (every rank returns the same).
  bool train_step(const Occupations& x, const LossGradient& loss_gradient);
  // Where an iteration's AdamW steps went, for the log (the output keeps seconds_optimize whole):
  // the passes giving psi, rank 0's loss, the passes giving the gradient with their sum, and
  // AdamW's update.
  struct StepSeconds {
    double forward = 0, loss = 0, backward = 0, update = 0;
  } step_seconds_;
  void optimize(Iteration& it);
  void decide(Iteration& it);  // rank 0: stop, or grow the space
  void expand(Iteration& it);
  // H psi within S of psi on S (2 |S|: real parts, then imaginary parts).
  std::vector<double> space_products(const double* re, const double* im);
  // E and <H^2> - E^2 of psi on S, and g = (H psi - E psi) / <psi|psi>, from (re, im) of psi.
  struct Energy {
    double energy = 0, variance = 0;
    std::vector<double> g;  // 2 |S|: real parts, then imaginary parts
  };
  Energy energy_of(const std::vector<double>& psi);
  // The same of psi on S and a coupled set C (|S| + |C| rows, real parts, then imaginary parts)
  // under H_S+C, H within S and between S and C with C's diagonal alone, and the energy of psi
  // restricted to S in `space_energy`.
  struct CoupledEnergy {
    double energy = 0, space_energy = 0;
    std::vector<double> g;
  };
  CoupledEnergy energy_with_coupled(const std::vector<double>& psi, const CoupledSet& coupled);
  // log |psi| and phi of each of `rows` determinants, in batches of inference_batch, no gradient.
  void evaluate(const Det* dets, std::uint64_t rows, double* log_amplitude, double* phase) {
    const std::uint64_t batch = std::max<std::uint64_t>(params_.inference_batch, 1);
    for (std::uint64_t b = 0; b < rows; b += batch) {
      const std::uint64_t m = std::min<std::uint64_t>(batch, rows - b);
      const std::vector<std::uint8_t> bits = occupation_bits(dets + b, m, problem_.ints.norb);
      network_->evaluate({bits.data(), m}, log_amplitude + b, phase + b);
    }
  }
  // |psi| / max |psi| and phi of each determinant of S (the network's scale in its steps).
  std::pair<std::vector<double>, std::vector<double>> scaled_psi() {
    std::vector<double> a(space_.size()), f(space_.size());
    evaluate(space_.data(), space_.size(), a.data(), f.data());
    const double largest = *std::max_element(a.begin(), a.end());
    for (double& v : a) v = std::exp(v - largest);
    return {std::move(a), std::move(f)};
  }
  // H's lowest eigenvector within S (Davidson from `guess`), normalized, and its eigenvalue.
  struct Eigenpair {
    std::vector<double> vector;
    double value = 0;
  };
  Eigenpair lowest_eigenpair(std::vector<double> guess);
  // c on S, then its first-order amplitudes (H c)_a / (E_c - H_aa) on a coupled set, normalized.
  std::vector<double> first_order_target(const Eigenpair& c, const CoupledSet& coupled) const;

  const stages::StepContext& ctx_;
  NnqsParams params_;
  sci::Problem problem_;
  std::unique_ptr<Network> network_;
  BudgetHold network_share_;  // the network's device memory, on a GPU
  std::unique_ptr<Stream> stream_;
  // The iteration's H within S (and the last one's, which the next grows from), its vectors.
  std::unique_ptr<sci::ResidentSpace> resident_, grown_from_;
  Buffer x_, products_, diagonal_;
  CoupledSet coupled_;  // the iteration's coupled set (every rank builds the same from S)
  std::vector<double> coupled_log_amplitude_;  // log |psi| on it after the iteration's steps (rank 0)
  // The state (saved): the space, the history, every step's energy, where the run stands, and,
  // once done, psi on the final space normalized (re, im interleaved).
  std::vector<Det> space_;
  std::vector<Iteration> history_;
  std::vector<double> step_energies_, amplitudes_;
  int iteration_ = 0;
  bool done_ = false, converged_ = false;
  std::string stop_reason_;
};

void NnqsRun::iterate() {
  Iteration it;
  it.dets = space_.size();
  optimize(it);  // (every rank: each takes its share of every step)
  if (root()) decide(it);
  coupled_ = CoupledSet{}, coupled_log_amplitude_.clear();  // (S's, which has grown)
  if (ranks() > 1) {  // (every rank agrees on where the work stands, and on the space)
    Packer out;
    out.put(iteration_), out.put(static_cast<std::uint8_t>(done_)), out.put_vector(space_);
    const std::string shared = broadcast(out.take());
    Unpacker in(shared);
    iteration_ = in.get<int>(), done_ = in.get<std::uint8_t>() != 0, space_ = in.get_vector<Det>();
  }
}

void NnqsRun::decide(Iteration& it) {
  const bool last = iteration_ + 1 >= params_.max_iterations;
  const double change = history_.empty() ? std::nan("") : it.energy - history_.back().energy;
  if (last) stop_reason_ = "max_iterations";
  else if (std::fabs(change) < params_.energy_tolerance) stop_reason_ = "energy_tolerance";
  else if (space_.size() >= params_.max_dets) stop_reason_ = "max_dets";
  else {
    expand(it);
    if (it.selected == 0) stop_reason_ = "no candidate left";
  }
  history_.push_back(it);
  ++iteration_;
  spdlog::info("sci.nnqs iteration {}: {} determinants, E {:.10f} ({:.3e} above the space's lowest; infidelity {:.2e}, "
               "of the moduli {:.2e}), variance {:.3e}{}; +{} of {} candidates ({} coupled); {:.2f} s optimizing (forward "
               "{:.2f}, loss {:.2f}, backward {:.2f}, AdamW {:.2f}), {:.2f} s generating, {:.2f} s de-duplicating, {:.2f} s "
               "inferring",
               iteration_ - 1, it.dets, it.energy, it.energy - it.ci_energy, it.infidelity, it.modulus_infidelity, it.variance,
               std::isnan(change) ? "" : fmt::format(" ({:+.3e})", change), it.selected, it.unique, it.generated,
               it.seconds_optimize, step_seconds_.forward, step_seconds_.loss, step_seconds_.backward, step_seconds_.update,
               it.seconds_generate, it.seconds_dedup, it.seconds_inference);
  if (stop_reason_.empty()) return;
  done_ = true;
  // psi on the final space, normalized
  const auto [a, f] = scaled_psi();
  double norm = 0;
  for (const double v : a) norm += v * v;
  norm = std::sqrt(norm);
  amplitudes_.resize(2 * a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    amplitudes_[2 * i] = a[i] / norm * std::cos(f[i]), amplitudes_[2 * i + 1] = a[i] / norm * std::sin(f[i]);
  converged_ = stop_reason_ != "max_iterations" || std::fabs(change) < params_.energy_tolerance;
  if (!converged_ && std::isnan(change))
    spdlog::warn("sci.nnqs: stopped at max_iterations = 1, before a second iteration could show whether E moves: the "
                 "energy is not known to be converged");
  else if (!converged_)
    spdlog::warn("sci.nnqs: stopped at max_iterations = {} with E still moving by {:.2e} Ha an iteration (energy_tolerance "
                 "{:.1e}): the energy is not converged", params_.max_iterations, std::fabs(change), params_.energy_tolerance);
}

std::vector<double> NnqsRun::space_products(const double* re, const double* im) {
  const std::uint64_t n = space_.size();
  Backend& backend = *ctx_.backend;
  backend.copy_to_device(x_.data(), re, n * 8, *stream_);
  backend.copy_to_device(x_.as<double>() + n, im, n * 8, *stream_);
  resident_->sigma(*stream_, x_.as<double>(), 0, n, products_.as<double>(), diagonal_.as<double>(), 2);
  std::vector<double> h(2 * n);
  backend.copy_to_host(h.data(), products_.data(), 2 * n * 8, *stream_);
  stream_->synchronize();
  return h;
}

NnqsRun::Energy NnqsRun::energy_of(const std::vector<double>& psi) {
  const std::uint64_t n = space_.size();
  const std::vector<double> h = space_products(psi.data(), psi.data() + n);
  double norm = 0, numerator = 0, squares = 0;  // (sums in row order: the same bits on every backend)
  for (std::uint64_t i = 0; i < 2 * n; ++i) norm += psi[i] * psi[i], numerator += psi[i] * h[i], squares += h[i] * h[i];
  Energy e;
  e.energy = numerator / norm;
  e.variance = std::max(0.0, squares / norm - e.energy * e.energy);  // (rounding left alone could go below 0)
  e.g.resize(2 * n);
  for (std::uint64_t i = 0; i < 2 * n; ++i) e.g[i] = (h[i] - e.energy * psi[i]) / norm;
  return e;
}

NnqsRun::CoupledEnergy NnqsRun::energy_with_coupled(const std::vector<double>& psi, const CoupledSet& coupled) {
  const std::uint64_t n = space_.size(), rows = psi.size() / 2, m = rows - n;
  const double* re = psi.data();
  const double* im = psi.data() + rows;
  const std::vector<double> within = space_products(re, im);
  std::vector<double> h(2 * rows, 0.0);  // H_S+C psi
  std::copy(within.begin(), within.begin() + static_cast<std::ptrdiff_t>(n), h.begin());
  std::copy(within.begin() + static_cast<std::ptrdiff_t>(n), within.end(), h.begin() + static_cast<std::ptrdiff_t>(rows));
  double space_norm = 0, space_numerator = 0;  // (sums in row order)
  for (std::uint64_t i = 0; i < n; ++i)
    space_norm += re[i] * re[i] + im[i] * im[i], space_numerator += re[i] * h[i] + im[i] * h[rows + i];
  coupled.apply(re, h.data(), n);
  coupled.apply(im, h.data() + rows, n);
  for (std::uint64_t a = 0; a < m; ++a)
    h[n + a] += coupled.diagonal[a] * re[n + a], h[rows + n + a] += coupled.diagonal[a] * im[n + a];
  double norm = 0, numerator = 0;
  for (std::uint64_t i = 0; i < 2 * rows; ++i) norm += psi[i] * psi[i], numerator += psi[i] * h[i];
  CoupledEnergy e;
  e.energy = numerator / norm;
  e.space_energy = space_numerator / space_norm;
  e.g.resize(2 * rows);
  for (std::uint64_t i = 0; i < 2 * rows; ++i) e.g[i] = (h[i] - e.energy * psi[i]) / norm;
  return e;
}

std::vector<double> NnqsRun::first_order_target(const Eigenpair& c, const CoupledSet& coupled) const {
  const std::uint64_t n = space_.size(), m = coupled.rows();
  std::vector<double> x(n + m, 0.0), t(n + m, 0.0);
  std::copy(c.vector.begin(), c.vector.end(), x.begin());
  coupled.apply(x.data(), t.data(), n);  // t[n + a] = (H c)_a
  std::copy(c.vector.begin(), c.vector.end(), t.begin());
  double norm = 0;
  for (std::uint64_t a = 0; a < m; ++a) {
    // (E_c < H_aa for any a outside S unless S misses a lower state; a gap under 1e-8 Ha is held at it)
    const double gap = std::min(c.value - coupled.diagonal[a], -1e-8);
    t[n + a] /= gap;
  }
  for (const double v : t) norm += v * v;
  for (double& v : t) v /= std::sqrt(norm);
  return t;
}

NnqsRun::Eigenpair NnqsRun::lowest_eigenpair(std::vector<double> guess) {
  const std::uint64_t n = space_.size();
  Backend& backend = *ctx_.backend;
  if (std::all_of(guess.begin(), guess.end(), [](double v) { return v == 0; }))  // (every phase at pi/2)
    guess[static_cast<std::size_t>(std::lower_bound(space_.begin(), space_.end(), problem_.target.reference) - space_.begin())] = 1;
  sci::Davidson davidson(std::move(guess));
  std::vector<double> product(n);
  for (bool first = true; !davidson.done(); first = false) {
    const std::span<const double> x = davidson.next();
    backend.copy_to_device(x_.data(), x.data(), n * 8, *stream_);
    resident_->sigma(*stream_, x_.as<double>(), 0, n, products_.as<double>(), diagonal_.as<double>(), 1);
    backend.copy_to_host(product.data(), products_.data(), n * 8, *stream_);
    if (first) {
      std::vector<double> diagonal(n);
      backend.copy_to_host(diagonal.data(), diagonal_.data(), n * 8, *stream_);
      stream_->synchronize();
      davidson.set_diagonal(std::move(diagonal));
    }
    stream_->synchronize();
    davidson.take(product);
  }
  return {davidson.eigenvector(), davidson.eigenvalue()};
}

bool NnqsRun::train_step(const Occupations& x, const LossGradient& loss_gradient) {
  const std::uint64_t n = x.rows, unit_rows = std::max<std::uint64_t>(params_.train_batch, 1);
  const std::uint64_t units = (n + unit_rows - 1) / unit_rows, width = 2 * static_cast<std::uint64_t>(problem_.ints.norb);
  const std::uint64_t first = units * static_cast<std::uint64_t>(rank()) / static_cast<std::uint64_t>(ranks()),
                      end = units * static_cast<std::uint64_t>(rank() + 1) / static_cast<std::uint64_t>(ranks());
  const std::uint64_t row_first = std::min(n, first * unit_rows), row_end = std::min(n, end * unit_rows);
  auto unit = [&](std::uint64_t u) {
    const std::uint64_t a = u * unit_rows, b = std::min(n, a + unit_rows);
    return std::pair{a, Occupations{x.bits + a * width, b - a}};
  };
  // log |psi| and phi of this rank's rows (unit by unit: the same batches on any rank count), to rank 0.
  auto phase_start = Clock::now();
  const auto lap = [&](double& seconds) { seconds += seconds_since(phase_start), phase_start = Clock::now(); };
  std::vector<double> mine(2 * (row_end - row_first));
  const std::uint64_t mine_rows = row_end - row_first;
  for (std::uint64_t u = first; u < end; ++u) {
    const auto [a, rows] = unit(u);
    network_->evaluate(rows, mine.data() + (a - row_first), mine.data() + mine_rows + (a - row_first));
  }
  const std::vector<std::string> pieces = gather({reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double)});
  lap(step_seconds_.forward);
  // Rank 0: psi = |psi| e^{i phi} / max |psi|, the loss's dL/dpsi, and from it dL/d(log |psi|) and
  // dL/dphi for every row; or the loss's error, which every rank then throws.
  std::string derivatives;
  if (root()) {
    std::vector<double> log_amplitude, phase;
    for (const std::string& p : pieces) {
      const std::size_t rows = p.size() / (2 * sizeof(double));
      const auto* v = reinterpret_cast<const double*>(p.data());
      log_amplitude.insert(log_amplitude.end(), v, v + rows);
      phase.insert(phase.end(), v + rows, v + 2 * rows);
    }
    const double largest = *std::max_element(log_amplitude.begin(), log_amplitude.end());
    std::vector<double> psi(2 * n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const double a = std::exp(log_amplitude[i] - largest);
      psi[i] = a * std::cos(phase[i]), psi[n + i] = a * std::sin(phase[i]);
    }
    try {
      const std::vector<double> d = loss_gradient(psi);  // dL/d(log |psi|), then dL/dphi
      if (d.empty()) return broadcast(std::string(1, '\2')), false;  // (low enough: no step)
      derivatives = std::string(1, '\1') + std::string(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(double));
    } catch (const InputError& e) {
      derivatives = std::string(1, '\0') + e.what();
    }
  }
  derivatives = broadcast(derivatives);
  lap(step_seconds_.loss);
  if (derivatives.at(0) == '\0') throw InputError(derivatives.substr(1));
  if (derivatives.at(0) == '\2') return false;
  const auto* d = reinterpret_cast<const double*>(derivatives.data() + 1);
  // Each unit's gradient, folded in the engine's tree: this rank's units into whole nodes, then
  // every rank's nodes on rank 0 in unit order; the sum goes to every rank, which all step alike.
  const auto parameters = static_cast<std::size_t>(network_->parameters());
  const engine::ElementwiseSums kind(parameters);  // (the engine's fixed tree: any rank count, the same bits)
  engine::FoldStack local(kind);
  std::vector<double> partial(parameters);
  for (std::uint64_t u = first; u < end; ++u) {
    const auto [a, rows] = unit(u);
    network_->gradient(rows, d + a, d + n + a, partial.data());
    engine::FoldNode leaf{0, u, kind.empty()};
    leaf.value->fold(u, reinterpret_cast<const std::byte*>(partial.data()));
    local.push(std::move(leaf));
  }
  const std::vector<std::string> nodes = gather(local.save());
  std::string sum;
  if (root()) {
    engine::FoldStack all(kind);
    for (const std::string& part : nodes)
      for (engine::FoldNode& node : engine::read_nodes(kind, part, 0)) all.push(std::move(node));
    const std::vector<double> g = static_cast<const engine::ElementwiseSums&>(*all.result()).sums();
    sum.assign(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(double));
  }
  sum = broadcast(sum);
  lap(step_seconds_.backward);
  network_->step(reinterpret_cast<const double*>(sum.data()));
  lap(step_seconds_.update);
  return true;
}

void NnqsRun::optimize(Iteration& it) {
  const std::uint64_t n = space_.size();
  Backend& backend = *ctx_.backend;
  // (an iteration after which the space cannot grow fits S alone: nothing is selected from C)
  const bool grows = iteration_ + 1 < params_.max_iterations && n < params_.max_dets;
  coupled_ = grows ? coupled_of(problem_, space_, params_.eps_couple, backend) : CoupledSet::empty(n);
  step_seconds_ = {};
  const std::uint64_t m = coupled_.rows();
  it.generated = coupled_.generated, it.unique = m;
  it.seconds_generate = coupled_.seconds_generate, it.seconds_dedup = coupled_.seconds_dedup;
  const auto start = Clock::now();
  if (root()) {  // (H within S, on rank 0: the losses are rank 0's)
    MemoryBudget& budget = backend.device_budget();
    const std::uint64_t left = budget.left();
    resident_ = std::make_unique<sci::ResidentSpace>(backend, problem_.ints, problem_.tables, problem_.na, problem_.nb,
                                                     space_, left / 2, std::move(grown_from_));
    x_ = backend.alloc_device(2 * n * 8, "sci.nnqs psi on the space");
    products_ = backend.alloc_device(2 * n * 8, "sci.nnqs H psi");
    diagonal_ = backend.alloc_device(n * 8, "sci.nnqs H's diagonal");
  }
  // The rows a step trains on: S, then a stride of its coupled set, a different one each step
  // (parts of about |S| rows, at least kCoupledRowsPerStep: a step costs about two of S alone, and
  // every coupled row is seen once in `parts` steps).
  const std::uint64_t parts = std::max<std::uint64_t>(1, (m + std::max(n, kCoupledRowsPerStep) - 1) /
                                                             std::max(n, kCoupledRowsPerStep));
  const std::uint64_t width = 2 * static_cast<std::uint64_t>(problem_.ints.norb);
  const std::uint64_t coupled_bytes = m * (sizeof(Det) + 8) + (n + 1) * 8 + coupled_.columns.size() * 16;
  const BudgetHold coupled_charge = backend.hold_host(2 * coupled_bytes + (2 * n + 2 * m) * width,
                                                      "sci.nnqs coupled set, its strides and the rows' occupations");
  const std::vector<CoupledSet> strides = coupled_.strides(parts);
  std::vector<std::vector<std::uint8_t>> stride_bits(parts);
  for (std::uint64_t part = 0; part < parts; ++part)
    stride_bits[part] = occupation_bits(strides[part].dets.data(), strides[part].rows(), problem_.ints.norb);
  // (S's occupations, then the step's stride's, written into one buffer per step)
  std::vector<std::uint8_t> bits = occupation_bits(space_.data(), n, problem_.ints.norb);
  const auto rows_of = [&](std::uint64_t step) {
    const std::vector<std::uint8_t>& more = stride_bits[step % parts];
    bits.resize(n * width);
    bits.insert(bits.end(), more.begin(), more.end());
    return Occupations{bits.data(), bits.size() / width};
  };
  // First psi is fitted to H's lowest eigenvector c within S, and on the coupled set to c's first-
  // order amplitudes t_a = (H c)_a / (E_c - H_aa) (Epstein-Nesbet: where the energy below puts
  // them), over each step's rows normalized: 1 - |<c, t|psi>|^2 / <psi|psi> plus the cross-entropy
  // above, minimized (Davidson starts from psi's real part). The energy steps then start near their
  // optimum instead of climbing out of the plateau that new determinants, at amplitudes the
  // network only guessed, push E into.
  // It stops at fit_steps, or once the infidelity is below fit_tolerance.
  Eigenpair c;
  std::vector<std::vector<double>> targets;  // each part's (c, t), normalized
  if (params_.fit_steps > 0 && n > 1)
    for (int step = 0; step < params_.fit_steps; ++step) {
      const std::uint64_t part = static_cast<std::uint64_t>(step) % parts;
      const bool stepped = train_step(rows_of(static_cast<std::uint64_t>(step)), [&](const std::vector<double>& psi) {
        if (c.vector.empty()) {
          c = lowest_eigenpair(std::vector<double>(psi.begin(), psi.begin() + static_cast<std::ptrdiff_t>(n)));
          for (const CoupledSet& stride : strides) targets.push_back(first_order_target(c, stride));
        }
        double infidelity = 0;
        const std::vector<double> g = infidelity_gradient(targets[part], psi, &infidelity);
        if (infidelity < params_.fit_tolerance) return std::vector<double>{};
        std::vector<double> d = through_log_and_phase(g, psi);
        const std::vector<double> l = likelihood_gradient(targets[part], psi);
        for (std::size_t i = 0; i < d.size(); ++i) d[i] += l[i];
        return d;
      });
      if (!stepped) break;
      ++it.fit_steps;
    }
  // Then E over S and the step's coupled rows C: E = <psi|H_S+C|psi> / <psi|psi>, H_S+C being H
  // within S and between S and C, with C's diagonal alone (so E_loc of a row of S reaches the
  // coupled rows' amplitudes, as seed 004's does, and E stays bounded below: its minimum puts each
  // coupled amplitude at its first-order value, which is what the space grows by). dE/d(psi) =
  // 2 (H_S+C psi - E psi) / <psi|psi> (H real and symmetric). Each step records E of psi within S.
  for (int step = 0; step < params_.steps; ++step) {
    const CoupledSet& stride = strides[static_cast<std::uint64_t>(step) % parts];
    train_step(rows_of(static_cast<std::uint64_t>(step)), [&](const std::vector<double>& psi) {
      CoupledEnergy e = energy_with_coupled(psi, stride);
      if (!std::isfinite(e.energy) || !std::isfinite(e.space_energy))
        throw InputError(fmt::format("sci.nnqs: the energy is not finite at iteration {}, step {}; expected a finite "
                                     "energy (try a smaller learning_rate than {:g})", iteration_, step, params_.network.learning_rate));
      step_energies_.push_back(e.space_energy);
      for (double& v : e.g) v *= 2;
      return through_log_and_phase(e.g, psi);
    });
  }
  if (!root()) return;
  // At the iteration's last parameters, psi on S and C, inferred once: E, its variance and the
  // fidelities within S; C's amplitudes, which the space grows by; E over S and C.
  const auto inferring = Clock::now();
  std::vector<double> log_amplitude(n + m), phase(n + m);
  evaluate(space_.data(), n, log_amplitude.data(), phase.data());
  evaluate(coupled_.dets.data(), m, log_amplitude.data() + n, phase.data() + n);
  const double seconds_inference = seconds_since(inferring);
  coupled_log_amplitude_.assign(log_amplitude.begin() + static_cast<std::ptrdiff_t>(n), log_amplitude.end());
  // (|psi| / max over S: the network's scale in its steps)
  std::vector<double> a(n);
  const double largest_on_space = *std::max_element(log_amplitude.begin(), log_amplitude.begin() + static_cast<std::ptrdiff_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) a[i] = std::exp(log_amplitude[i] - largest_on_space);
  if (c.vector.empty()) c = lowest_eigenpair(a);  // (the lowest E on S, for the record)
  it.ci_energy = c.value;
  {
    const double* f = phase.data();
    std::vector<double> psi(2 * n);
    for (std::uint64_t i = 0; i < n; ++i) psi[i] = a[i] * std::cos(f[i]), psi[n + i] = a[i] * std::sin(f[i]);
    const Energy e = energy_of(psi);
    it.energy = e.energy, it.variance = e.variance;
    const double largest = *std::max_element(log_amplitude.begin(), log_amplitude.end());
    std::vector<double> all(2 * (n + m));
    for (std::uint64_t i = 0; i < n + m; ++i) {
      const double r = std::exp(log_amplitude[i] - largest);
      all[i] = r * std::cos(phase[i]), all[n + m + i] = r * std::sin(phase[i]);
    }
    it.coupled_energy = energy_with_coupled(all, coupled_).energy;
    double re = 0, im = 0, moduli = 0, norm = 0;  // (sums in row order)
    for (std::uint64_t i = 0; i < n; ++i) {
      re += c.vector[i] * psi[i], im += c.vector[i] * psi[n + i];
      moduli += std::fabs(c.vector[i]) * a[i], norm += a[i] * a[i];
    }
    it.infidelity = std::max(0.0, 1 - (re * re + im * im) / norm);
    it.modulus_infidelity = std::max(0.0, 1 - moduli * moduli / norm);
  }
  x_.reset(), products_.reset(), diagonal_.reset();
  if (resident_->can_seed_growth()) {
    resident_->keep_only_growth_seed();
    grown_from_ = std::move(resident_);
  }
  resident_.reset();
  it.seconds_inference = seconds_inference;
  it.seconds_optimize = seconds_since(start) - seconds_inference;
}

void NnqsRun::expand(Iteration& it) {
  const std::uint64_t n = space_.size();
  const std::vector<Det>& fresh = coupled_.dets;  // (found before the iteration's steps)
  const std::vector<double>& log_amplitude = coupled_log_amplitude_;  // (inferred after them)
  // The largest join S (ties: the lower determinant first).
  const std::uint64_t k = std::min<std::uint64_t>({params_.max_new_dets, params_.max_dets - n, fresh.size()});
  std::vector<std::uint64_t> order(fresh.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](auto a, auto b) {
    return log_amplitude[a] > log_amplitude[b] || (log_amplitude[a] == log_amplitude[b] && a < b);
  });
  for (std::uint64_t i = 0; i < k; ++i) space_.push_back(fresh[order[i]]);
  std::sort(space_.begin(), space_.end());
  it.selected = k;
}

std::string NnqsRun::save() const {
  Packer out;
  out.put(iteration_), out.put(static_cast<std::uint8_t>(done_)), out.put(static_cast<std::uint8_t>(converged_));
  out.put_string(stop_reason_);
  out.put_vector(space_);
  out.put<std::uint64_t>(history_.size());
  for (const Iteration& it : history_) it.put(out);
  out.put_vector(step_energies_), out.put_vector(amplitudes_);
  out.put_string(network_->save());
  return out.take();
}

void NnqsRun::load(std::string_view state) {
  Unpacker in(state);
  iteration_ = in.get<int>(), done_ = in.get<std::uint8_t>() != 0, converged_ = in.get<std::uint8_t>() != 0;
  stop_reason_ = in.get_string();
  space_ = in.get_vector<Det>();
  history_.resize(in.get<std::uint64_t>());
  for (Iteration& it : history_) it.get(in);
  step_energies_ = in.get_vector<double>(), amplitudes_ = in.get_vector<double>();
  network_->load(in.get_string());
  grown_from_.reset();  // (H within the next space is found from nothing: the same entries)
  if (root() && !history_.empty())
    spdlog::info("sci.nnqs: resuming after iteration {} ({} determinants, E {:.10f}, {} AdamW steps taken)", iteration_ - 1,
                 space_.size(), history_.back().energy, step_energies_.size());
}

void NnqsRun::write(const stages::StagePlan&, const stages::StepPass&, h5::File& out) const {
  using stages::detail::write_array;
  const Iteration& last = history_.back();
  stages::detail::write_scalar(out, "energy", h5::DType::float64, &last.energy,
                               "E = <psi|H|psi> / <psi|psi> (Ha) of the network on the final space: variational");
  std::vector<std::uint64_t> dets;
  for (const Det& d : space_) dets.push_back(d.alpha), dets.push_back(d.beta);
  write_array(out, "dets", h5::DType::uint64, {space_.size(), 2}, dets.data(),
              "the final space, sorted: (alpha, beta) occupation bits, bit p for orbital p");
  write_array(out, "amplitudes", h5::DType::complex128, {space_.size()}, amplitudes_.data(),
              "psi over /dets, normalized on the space");
  write_array(out, "steps/energy", h5::DType::float64, {step_energies_.size()}, step_energies_.data(),
              "E (Ha) at every AdamW step, before its update, iteration after iteration");
  auto column = [&](const char* key, h5::DType type, auto field, const char* doc, bool measured = false) {
    h5::Dataset d = stages::detail::write_column(out, "iterations", history_, key, type, field, doc);
    if (measured) stages::mark_measured(d);
  };
  column("dets", h5::DType::uint64, &Iteration::dets, "determinants in the space each iteration optimized on");
  column("energy", h5::DType::float64, &Iteration::energy, "E (Ha) after each iteration's steps");
  column("variance", h5::DType::float64, &Iteration::variance, "<psi|H P_S H|psi> / <psi|psi> - E^2 (Ha^2) on the space");
  column("ci_energy", h5::DType::float64, &Iteration::ci_energy,
         "H's lowest eigenvalue within the space (Ha): the lowest E any psi on it reaches");
  column("coupled_energy", h5::DType::float64, &Iteration::coupled_energy,
         "E (Ha) over the space and its coupled determinants, H between them with the latter's diagonal alone: what the "
         "energy steps minimize (not variational)");
  column("infidelity", h5::DType::float64, &Iteration::infidelity,
         "1 - |<c|psi>|^2 / <psi|psi>, c that eigenvector, after the iteration's steps");
  column("modulus_infidelity", h5::DType::float64, &Iteration::modulus_infidelity,
         "the same of |c| against |psi| (phases ignored): small where only the phases are off");
  column("fit_steps", h5::DType::uint64, &Iteration::fit_steps,
         "AdamW steps the fit took (fit_steps, or fewer once below fit_tolerance)");
  column("generated", h5::DType::uint64, &Iteration::generated, "determinants coupled to the space, duplicates included");
  column("unique", h5::DType::uint64, &Iteration::unique, "unique coupled determinants outside the space, in the irrep");
  column("selected", h5::DType::uint64, &Iteration::selected, "determinants that joined the space");
  column("seconds_generate", h5::DType::float64, &Iteration::seconds_generate, "generating the coupled determinants (s)", true);
  column("seconds_dedup", h5::DType::float64, &Iteration::seconds_dedup, "de-duplicating them (s)", true);
  column("seconds_inference", h5::DType::float64, &Iteration::seconds_inference, "|psi| of the unique ones (s)", true);
  column("seconds_optimize", h5::DType::float64, &Iteration::seconds_optimize, "the AdamW steps, H within S included (s)", true);
  out.set_attribute("stop_reason", stop_reason_);
  // (0: stopped at max_iterations with E still moving by energy_tolerance or more an iteration)
  out.set_attribute("converged", static_cast<std::int64_t>(converged_));
  out.set_attribute("irrep", static_cast<std::int64_t>(problem_.target.irrep));
  out.set_attribute("ms2", static_cast<std::int64_t>(problem_.target.ms2));
  out.set_attribute("parameters", static_cast<std::int64_t>(network_->parameters()));
  out.set_attribute("network_device", network_->where());
  if (network_share_.bytes() >
      0)  // (LibTorch's allocator's peak reserve, within the network's share of the device budget)
    out.set_attribute("network_peak_device_bytes", static_cast<std::int64_t>(network_->peak_device_bytes()));
  if (params_.reference_energy) out.set_attribute("reference_energy", *params_.reference_energy);
  for (const NamedWeights& w : network_->weights())
    write_array(out, ("network/" + w.name).c_str(), h5::DType::float64, w.shape, w.values.data(),
                "the network's parameter of this name, as trained (float64)");
}

std::string NnqsRun::describe(const stages::StagePlan&, const stages::StepPass&) const {
  const Iteration& last = history_.back();
  return fmt::format("{} determinants, E {:.10f}, variance {:.2e}, after {} iterations ({}{})", space_.size(), last.energy,
                     last.variance, history_.size(), stop_reason_, converged_ ? "" : "; not converged");
}

}  // namespace

std::unique_ptr<stages::StepRun> start_run(const stages::StepContext& ctx, const NnqsParams& params) {
  return std::make_unique<NnqsRun>(ctx, params);
}

}  // namespace qstage::nnqs
