// sci.solve: heat-bath selected CI, iterated to convergence, every phase a streamed pass.
//
// Iteration k holds a sorted space S_k (k = 0: the determinant of lowest diagonal energy reached
// from aufbau by single moves) and runs these passes, each batched, checkpointed and resumed by
// the engine like any other:
//   Davidson  (host work) H x over the rows of S_k, on the iteration's resident space (H within
//                        S_k stored on the device when it fits, else kernels::sci_sigma: the
//                        column of each coupled determinant found by binary search in S_k), each
//                        rank its share of the rows; no pass, no file: a product costs its kernel;
//   generate             from each determinant i of S_k, every excitation a with |H_ai c_i| >
//                        eps_var (kernels::sci_generate), appended as {a, H_ai c_i};
//   dedup    (several)   keys.dedup's passes on those candidates: unique, sorted, H_ai c_i summed;
//   score                per unique candidate outside S_k: the Epstein–Nesbet term v^2 / (E - H_aa)
//                        (summed in a fixed tree: E_PT2) and the amplitude of the model
//                        (sci/amplitude_model.hpp; first_order: v / (E - H_aa)), the largest
//                        max_new_dets of which (a two-level top-K: per tile, then merged) join S_k
//                        to make S_{k+1}.
// With nroots > 1, Davidson finds the lowest roots together and generate/dedup/score run once a
// root (its coefficients, its energy in the denominators); the roots' best candidates are merged
// (each determinant where it scores best) into one top-K, and the final PT2 runs once a root.
// Once converged (|dE| < energy_tolerance, no new determinant, max_dets or max_iterations), a
// final generate/dedup/score at eps_pt2 gives E_PT2 when eps_pt2 < eps_var. With eps_pt2_large,
// that PT2 is semistochastic (Sharma et al., JCTC 13, 1595 (2017)): the same passes at
// eps_pt2_large give its deterministic part, then groups of sampled batches (generate from the
// sampled determinants, dedup, score) estimate the rest, E_PT2(eps_pt2) - E_PT2(eps_pt2_large),
// until its error bar is below pt2_target_error or pt2_batches are done. The output pass
// writes the final space and coefficients; the history goes into `iterations/`.
//
// Resume: the run's state records which passes made what and Davidson's whole state (bit for bit);
// a new space is written (atomically, by rank 0) into the work directory before the state saying
// so is committed, so a resumed run continues with the same bits, for any rank count.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/parallel.hpp"
#include "core/serial.hpp"
#include "core/units.hpp"
#include "engine/tree_fold.hpp"
#include "kernels/sci/sci_generate.hpp"
#include "kernels/sci/sci_score.hpp"
#include "kernels/keys/sort_unique.hpp"
#include "stages/keys/dedup_passes.hpp"
#include "stages/sci/amplitude_model.hpp"
#include "stages/sci/davidson.hpp"
#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"
#include "stages/sci/problem.hpp"
#include "stages/sci/resident_space.hpp"
#include "stages/sci/sci_stages.hpp"
#include "stages/sci/target_state.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

namespace fs = std::filesystem;
using kernels::sci::Candidate;
using kernels::sci::Det;
using nlohmann::json;

struct SolveParams {
  // eps_var: one threshold, or a schedule of decreasing ones (each iterated to convergence, with
  // its PT2, from the space the one before left); eps_var is the last.
  std::vector<double> eps_schedule{1e-4};
  double eps_var = 1e-4, eps_pt2 = 1e-6;
  // Semistochastic PT2 (when eps_pt2_large is set): draws a batch, most batches, the error bar to
  // stop at, and the seed of the draws.
  std::optional<double> eps_pt2_large;
  std::uint64_t pt2_samples = 200, pt2_batches = 200;
  double pt2_target_error = 1e-5;
  std::uint64_t pt2_seed = 0;
  bool semistochastic() const { return eps_pt2_large.has_value(); }
  std::uint64_t max_new_dets = 100000, max_dets = 10000000;
  int max_iterations = 20;
  double energy_tolerance = 1e-6, davidson_tolerance = 1e-5;
  std::optional<double> reference_energy;
  std::string amplitude_model = "first_order";
  // The state (sci/target_state.hpp): the FCIDUMP's ISYM and MS2 unless these say otherwise.
  sci::StateRequest state;
  // The lowest nroots states of that irrep and MS2: each selects, each has its PT2.
  int nroots = 1;
  static constexpr int kMostRoots = 16;

  static SolveParams from_json(const json& p) {
    SolveParams s;
    s.amplitude_model = p.value("amplitude_model", s.amplitude_model);
    if (p.contains("eps_var"))
      s.eps_schedule = p.at("eps_var").is_array() ? p.at("eps_var").get<std::vector<double>>()
                                                  : std::vector<double>{p.at("eps_var").get<double>()};
    s.eps_var = s.eps_schedule.empty() ? 0.0 : s.eps_schedule.back();
    s.eps_pt2 = p.value("eps_pt2", s.eps_pt2);
    if (p.contains("eps_pt2_large")) s.eps_pt2_large = p.at("eps_pt2_large").get<double>();
    s.pt2_samples = p.value("pt2_samples", s.pt2_samples);
    s.pt2_batches = p.value("pt2_batches", s.pt2_batches);
    s.pt2_target_error = p.value("pt2_target_error", s.pt2_target_error);
    s.pt2_seed = p.value("pt2_seed", s.pt2_seed);
    s.max_new_dets = p.value("max_new_dets", s.max_new_dets);
    s.max_dets = p.value("max_dets", s.max_dets);
    s.max_iterations = p.value("max_iterations", s.max_iterations);
    s.energy_tolerance = p.value("energy_tolerance", s.energy_tolerance);
    s.davidson_tolerance = p.value("davidson_tolerance", s.davidson_tolerance);
    if (p.contains("reference_energy")) s.reference_energy = p.at("reference_energy").get<double>();
    s.state = sci::StateRequest::from_json(p);
    s.nroots = p.value("nroots", s.nroots);
    return s;
  }
};

// ---------------------------------------------------------------- the problem and the space

using sci::Problem;

// A space: sorted determinants, Davidson's start vectors (one a root known so far, the lowest
// first), and the iteration each joined in.
struct Space {
  std::vector<Det> dets;
  std::vector<std::vector<double>> guesses;
  std::vector<std::int32_t> joined;
};

fs::path space_file(const StepContext& ctx, int iteration) { return ctx.work_dir / fmt::format("stage-space-{}.bin", iteration); }

// (n, the guesses' count g, then the dets, the g guesses and the iterations joined)
std::string encode(const Space& s) {
  std::string out;
  const std::uint64_t n = s.dets.size(), g = s.guesses.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(reinterpret_cast<const char*>(&g), 8);
  out.append(reinterpret_cast<const char*>(s.dets.data()), n * sizeof(Det));
  for (const auto& guess : s.guesses) out.append(reinterpret_cast<const char*>(guess.data()), n * 8);
  out.append(reinterpret_cast<const char*>(s.joined.data()), n * 4);
  return out;
}

Space decode(const std::string& bytes, const fs::path& file) {
  Space s;
  std::uint64_t n = 0, g = 0;
  if (bytes.size() < 16) throw RuntimeFailure(fmt::format("{}: truncated", file.string()));
  std::memcpy(&n, bytes.data(), 8);
  std::memcpy(&g, bytes.data() + 8, 8);
  if (g == 0 || bytes.size() != 16 + n * (sizeof(Det) + 4 + 8 * g))
    throw RuntimeFailure(fmt::format("{}: truncated", file.string()));
  const char* at = bytes.data() + 16;
  s.dets.resize(n);
  std::memcpy(s.dets.data(), at, n * sizeof(Det));
  at += n * sizeof(Det);
  s.guesses.assign(g, std::vector<double>(n));
  for (auto& guess : s.guesses) {
    std::memcpy(guess.data(), at, n * 8);
    at += n * 8;
  }
  s.joined.resize(n);
  std::memcpy(s.joined.data(), at, n * 4);
  return s;
}

// A restart's inputs, as far as their layouts say (an earlier step's output has no shape until
// it ran: then only the dtypes, and the shapes once the step starts).
void check_restart_inputs(const Layout* space, const Layout* guess) {
  if (guess && !space)
    throw InputError("input 'guess' is given without input 'space'; expected both (an earlier run's `dets` and "
                     "`coefficients`) or only 'space'");
  if (!space) return;
  const bool known = !space->shape.empty();
  if (space->dtype != DType::uint64 || (known && (space->shape.size() != 2 || space->shape[1] != 2 || space->shape[0] == 0)))
    throw InputError(fmt::format("input 'space' is {} of shape {}; expected uint64 (n, 2) with n >= 1, an earlier "
                                 "sci.solve's `dets` (alpha and beta occupations as bit strings)",
                                 h5::dtype_name(space->dtype), shape_text(space->shape)));
  if (guess && (guess->dtype != DType::float64 ||
                (known && !guess->shape.empty() && (guess->shape.size() != 1 || guess->shape[0] != space->shape[0]))))
    throw InputError(fmt::format("input 'guess' is {} of shape {}; expected float64 ({},), a coefficient per row of input "
                                 "'space'", h5::dtype_name(guess->dtype), shape_text(guess->shape),
                                 known ? std::to_string(space->shape[0]) : "n"));
}

// The first iteration's space: the reference determinant alone, or, for a restart, the
// determinants of input `space` (an earlier run's `dets`, with the reference if it lacks it) and
// Davidson's start from input `guess` (its `coefficients`; else the reference). Every
// determinant must be one of the state looked for: its electrons of each spin, its irrep, its
// orbitals within NORB. Throws InputError naming the first row that is not.
Space initial_space(const StepContext& ctx, const Problem& p) {
  const auto space_input = ctx.inputs.find("space");
  if (space_input == ctx.inputs.end()) return Space{{p.target.reference}, {{1.0}}, {0}};
  const auto guess_input = ctx.inputs.find("guess");
  const auto layout = [](const h5::Dataset* d) {
    return Layout{d->dtype().value_or(DType::uint8), d->shape(), {}};
  };
  const Layout space_layout = layout(space_input->second);
  const std::optional<Layout> guess_layout =
      guess_input != ctx.inputs.end() ? std::optional<Layout>(layout(guess_input->second)) : std::nullopt;
  check_restart_inputs(&space_layout, guess_layout ? &*guess_layout : nullptr);
  const std::uint64_t n = space_layout.shape.at(0);
  std::vector<Det> dets(n);
  space_input->second->read_all(dets.data());
  std::vector<double> guess(n, 0.0);
  if (guess_input != ctx.inputs.end()) guess_input->second->read_all(guess.data());
  const int norb = p.ints.norb;
  const std::uint64_t outside = norb >= 64 ? 0 : ~std::uint64_t{0} << norb;
  for (std::uint64_t r = 0; r < n; ++r) {
    const Det& d = dets[r];
    const auto where = [&](const std::string& what) {
      return InputError(fmt::format("input 'space' row {} ({}) {}; expected determinants of the state looked for ({} alpha and "
                                    "{} beta electrons in NORB={} orbitals, irrep {}): an earlier sci.solve's `dets` of "
                                    "the same FCIDUMP and state", r, sci::describe(d, norb), what, p.na, p.nb, norb,
                                    p.target.irrep));
    };
    if ((d.alpha | d.beta) & outside) throw where(fmt::format("occupies an orbital beyond NORB={}", norb));
    if (std::popcount(d.alpha) != p.na || std::popcount(d.beta) != p.nb)
      throw where(fmt::format("has {} alpha and {} beta electrons", std::popcount(d.alpha), std::popcount(d.beta)));
    if (p.symmetry.known() && p.symmetry.irrep(d) != p.target.irrep)
      throw where(fmt::format("is of irrep {}", p.symmetry.irrep(d)));
  }
  // Sorted and unique (a repeated determinant keeps its first coefficient), with the reference.
  std::vector<std::uint64_t> order(n);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) { return dets[a] < dets[b]; });
  Space s;
  std::vector<double> start;
  for (const std::uint64_t r : order) {
    if (!s.dets.empty() && s.dets.back() == dets[r]) continue;
    s.dets.push_back(dets[r]);
    start.push_back(guess[r]);
  }
  const auto at = std::lower_bound(s.dets.begin(), s.dets.end(), p.target.reference);
  const auto k = at - s.dets.begin();
  if (at == s.dets.end() || !(*at == p.target.reference)) {
    s.dets.insert(at, p.target.reference);
    start.insert(start.begin() + k, 0.0);
  }
  if (guess_input == ctx.inputs.end()) start[static_cast<std::size_t>(k)] = 1.0;
  if (std::none_of(start.begin(), start.end(), [](double c) { return c != 0; }))
    throw InputError("input 'guess' is zero on every determinant of input 'space'; expected the coefficients of an earlier "
                     "sci.solve's state (its `coefficients`)");
  s.guesses = {std::move(start)};
  s.joined.assign(s.dets.size(), 0);
  return s;
}

// Davidson's start vectors for `roots` roots: the space's guesses (the roots known so far), then,
// for each root still missing, a unit vector on a determinant of lowest diagonal energy that adds
// a direction to those (tested against them orthonormalized; a new root starts where the
// space's low determinants are).
std::vector<std::vector<double>> start_vectors(const Problem& p, const Space& s, int roots) {
  const auto wanted = static_cast<std::size_t>(roots);
  std::vector<std::vector<double>> starts(s.guesses.begin(),
                                          s.guesses.begin() + static_cast<std::ptrdiff_t>(std::min(wanted, s.guesses.size())));
  if (starts.size() >= wanted) return starts;
  const std::size_t n = s.dets.size();
  std::vector<double> diagonal(n);
  parallel_for(static_cast<std::int64_t>(n), [&](std::int64_t i) { diagonal[i] = kernels::sci::diagonal(p.host, s.dets[i]); });
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return diagonal[a] < diagonal[b]; });
  std::vector<std::vector<double>> orthonormal;
  const auto adds_direction = [&](std::vector<double> v) {
    for (int pass = 0; pass < 2; ++pass)
      for (const auto& q : orthonormal) {
        double d = 0;
        for (std::size_t i = 0; i < n; ++i) d += q[i] * v[i];
        for (std::size_t i = 0; i < n; ++i) v[i] -= d * q[i];
      }
    double norm = 0;
    for (const double x : v) norm += x * x;
    norm = std::sqrt(norm);
    if (!(norm > 1e-3)) return false;  // (well inside the span: Davidson would gain little from it)
    for (double& x : v) x /= norm;
    orthonormal.push_back(std::move(v));
    return true;
  };
  for (const auto& g : starts) adds_direction(g);
  for (const std::size_t j : order) {
    if (starts.size() >= wanted) break;
    std::vector<double> unit(n, 0.0);
    unit[j] = 1;
    if (adds_direction(unit)) starts.push_back(std::move(unit));
  }
  return starts;
}

// What a run keeps in memory besides its saved state (rebuilt from it by load()): the problem,
// the current space, and the device data the iteration's Davidson products share (made by its
// first product, gone when Davidson is done: this rank's rows of H's diagonal, and, unless
// Davidson's own vectors are on the backend and there is one rank, the vector multiplied and this
// rank's rows of the product).
struct Memory {
  std::unique_ptr<Problem> problem;
  Space space;
  std::unique_ptr<sci::Davidson> davidson;
  std::unique_ptr<sci::ResidentSpace> resident;
  // The last resident space with H stored (its host rows), kept from its Davidson to the next
  // iteration's, whose H grows from it (gone at convergence: the PT2 needs the memory).
  std::unique_ptr<sci::ResidentSpace> grown_from;
  Buffer x, sigma, diagonal;
  std::unique_ptr<sci::AmplitudeModel> amplitude_model;  // ranks the candidates (the parameter's)
};

// ---------------------------------------------------------------- the semistochastic PT2's draws

// The stochastic part's sources for batches [first, first + count): each batch draws `draws`
// determinants of the space with probability p_i = |c_i| / sum |c| (with replacement), and each
// determinant drawn goes in once, with its weights (kernels::SciSampled), ordered by batch, then
// by index. The draws come from a counter-based generator of (seed, batch, draw), so every rank,
// every resume and every backend draws the same determinants.
struct SampledSources {
  std::vector<Det> dets;
  std::vector<double> coefficients, scale, fold;
  std::vector<std::uint64_t> batch;
};

std::uint64_t mix64(std::uint64_t x) {  // (splitmix64's finalizer)
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double uniform01(std::uint64_t seed, std::uint64_t batch, std::uint64_t draw) {
  const std::uint64_t x = mix64(mix64(mix64(seed + 0x9E3779B97F4A7C15ull) + batch) + draw);
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

SampledSources sample_sources(const std::vector<Det>& space, const std::vector<double>& c, std::uint64_t seed,
                              std::uint64_t first, std::uint64_t count, std::uint64_t draws) {
  std::vector<double> cumulative(c.size());
  double total = 0;
  for (std::size_t i = 0; i < c.size(); ++i) cumulative[i] = total += std::fabs(c[i]);
  SampledSources out;
  std::vector<std::uint64_t> picked(draws);
  const auto n = static_cast<double>(draws);
  for (std::uint64_t b = first; b < first + count; ++b) {
    for (std::uint64_t d = 0; d < draws; ++d) {
      const double target = uniform01(seed, b, d) * total;
      const auto at = std::upper_bound(cumulative.begin(), cumulative.end(), target) - cumulative.begin();
      picked[d] = std::min<std::uint64_t>(static_cast<std::uint64_t>(at), c.size() - 1);
    }
    std::sort(picked.begin(), picked.end());
    for (std::uint64_t d = 0; d < draws;) {
      const std::uint64_t i = picked[d];
      std::uint64_t e = d;
      while (e < draws && picked[e] == i) ++e;
      const double w = static_cast<double>(e - d), p = std::fabs(c[i]) / total;
      out.dets.push_back(space[i]);
      out.coefficients.push_back(c[i]);
      out.scale.push_back(w / p);
      out.fold.push_back(w * (n - 1) / p - w * w / (p * p));
      out.batch.push_back(b);
      d = e;
    }
  }
  return out;
}

// ---------------------------------------------------------------- kernels

template <typename T>
Buffer upload(Backend& backend, Stream& stream, const std::vector<T>& v, const char* what) {
  Buffer b = backend.alloc_device(std::max<std::size_t>(v.size(), 1) * sizeof(T), what);
  backend.copy_to_device(b.data(), v.data(), v.size() * sizeof(T), stream);
  return b;
}

// The scoring's resident data, uploaded in prepare(): the Hamiltonian and the space. (Davidson's
// products share sci::ResidentSpace instead; it is gone by then, so the Hamiltonian and the space
// go up again once an iteration.)
class SpaceKernel : public engine::PassKernel {
 public:
  // sums: how many tile sums the kernel keeps on the device at most (sum_values; 0: none).
  SpaceKernel(const Memory& m, std::uint64_t sums) : m_(m), sum_values_(sums) {}
  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    h_ = std::make_unique<sci::ResidentHamiltonian>(backend, stream, m_.problem->ints, m_.problem->tables);
    space_ = upload(backend, stream, m_.space.dets, "selected-CI space");
    const std::uint64_t bits = kernels::sci_space_filter_bits(m_.space.dets.size());
    filter_ = backend.alloc_device(bits / 8, "selected-CI space filter");
    kernels::sci_space_filter(stream, space_.as<Det>(), m_.space.dets.size(), filter_.as<std::uint32_t>(), bits);
    filter_mask_ = bits - 1;
    if (sum_values_ > 0) sums_ = backend.alloc_device(sum_values_ * 8, "selected-CI tile sums");
    stream.synchronize();
  }
  static std::uint64_t resident_bytes(const Memory& m, std::uint64_t sums = 0) {
    const std::uint64_t n = std::max<std::uint64_t>(m.space.dets.size(), 1);
    return sci::ResidentHamiltonian::bytes(m.problem->ints, m.problem->tables) + n * sizeof(Det) +
           kernels::sci_space_filter_bits(m.space.dets.size()) / 8 + sums * 8;
  }
  // The tile sums of a pass over `rows` rows (batches of whole tiles), `slots` a tile.
  static std::uint64_t sum_values(std::uint64_t rows, std::uint64_t tile_rows, std::uint32_t slots) {
    return (rows + tile_rows - 1) / tile_rows * slots;
  }
  // Device scratch a row: its denominator and whether it is skipped.
  static constexpr std::uint64_t kScratchPerRow = sizeof(double) + 1;
  // Whether process() reads its inputs on the host (BatchView::host_inputs) too.
  virtual bool reads_host_inputs() const = 0;

 protected:
  // The batch's candidates (input 0: rows of `words` uint64, the determinant first) scored on the
  // backend: a denominator and whether it is skipped a row, in the batch's scratch.
  kernels::SciScoreRows score_rows(const engine::BatchView& b, std::uint32_t words, double energy) const {
    const std::uint64_t rows = b.rows.size();
    const Problem& p = *m_.problem;
    auto* denominator = static_cast<double*>(b.scratch);
    const kernels::SciScoreRows scored{h_->view(), space_.as<Det>(), m_.space.dets.size(),
                                       kernels::sci::SpaceFilter{filter_.as<std::uint32_t>(), filter_mask_}, p.symmetry.masks(p.target.irrep),
                                       static_cast<const std::uint64_t*>(b.inputs[0]), words, rows, energy, denominator,
                                       reinterpret_cast<unsigned char*>(denominator + rows)};
    kernels::sci_score_rows(*b.stream, scored);
    return scored;
  }
  // The same, copied into denominator_ and skipped_ on the host (for the host's top-K).
  void score_rows_to_host(const engine::BatchView& b, std::uint32_t words, double energy) {
    const kernels::SciScoreRows scored = score_rows(b, words, energy);
    denominator_.resize(scored.n);
    skipped_.resize(scored.n);
    backend_->copy_to_host(denominator_.data(), scored.denominator, scored.n * sizeof(double), *b.stream);
    backend_->copy_to_host(skipped_.data(), scored.skipped, scored.n, *b.stream);
    b.stream->synchronize();
  }
  // The EN-PT2 terms' sums per tile on the backend (`sums` says which rows and slots; its
  // denominators and skips are score_rows'), copied to `out` on the host: tiles * slots values.
  void tile_sums(const engine::BatchView& b, const kernels::SciScoreRows& scored, kernels::SciTileSums sums, double* out) {
    sums.denominator = scored.denominator;
    sums.skipped = scored.skipped;
    sums.n = scored.n;
    const std::uint64_t values = sum_values(scored.n, sums.tile_rows, sums.slots);
    if (values > sum_values_) throw std::logic_error("sci.solve: a batch has more tile sums than its kernel was made for");
    sums.sums = sums_.as<double>();
    kernels::sci_tile_sums(*b.stream, sums);
    backend_->copy_to_host(out, sums_.data(), values * 8, *b.stream);
    b.stream->synchronize();
  }

  const Memory& m_;
  Backend* backend_ = nullptr;
  std::unique_ptr<sci::ResidentHamiltonian> h_;
  Buffer space_, sums_;
  Buffer filter_;  // (the space's filter: kernels::sci::SpaceFilter's words, filter_mask_ + 1 bits)
  std::uint64_t filter_mask_ = 0;
  std::uint64_t sum_values_;
  std::vector<double> denominator_;
  std::vector<unsigned char> skipped_;
};

// What a generation pass generates from: the space with its eigenvector (Candidate records), or
// the semistochastic PT2's sampled determinants (two TaggedCandidate records a candidate).
struct GenerationSources {
  const std::vector<Det>* dets = nullptr;
  const std::vector<double>* coefficients = nullptr;
  const SampledSources* sampled = nullptr;
  double eps_large = 0;
  std::uint64_t size() const { return dets->size(); }
};

class GenerateKernel final : public engine::PassKernel {
 public:
  GenerateKernel(const Problem& p, GenerationSources sources, double eps) : p_(p), sources_(sources), eps_(eps) {}
  void prepare(Backend& backend, Stream& stream) override {
    h_ = std::make_unique<sci::ResidentHamiltonian>(backend, stream, p_.ints, p_.tables);
    dets_ = upload(backend, stream, *sources_.dets, "selected-CI sources");
    coefficients_ = upload(backend, stream, *sources_.coefficients, "selected-CI coefficients");
    if (const SampledSources* s = sources_.sampled) {
      batch_ = upload(backend, stream, s->batch, "selected-CI sampled batches");
      scale_ = upload(backend, stream, s->scale, "selected-CI sampled scales");
      fold_ = upload(backend, stream, s->fold, "selected-CI sampled folds");
    }
    scan_ = backend.alloc_device(kernels::kSciScanWorkspaceBytes, "selected-CI scan workspace");
    stream.synchronize();
  }
  // (the sources, their coefficients and, sampled, their batches and weights)
  static std::uint64_t resident_bytes(const Problem& p, const GenerationSources& s) {
    const std::uint64_t n = std::max<std::uint64_t>(s.size(), 1);
    return sci::ResidentHamiltonian::bytes(p.ints, p.tables) + n * (sizeof(Det) + 8) + (s.sampled ? n * 24 : 0) +
           kernels::kSciScanWorkspaceBytes;
  }
  void process(const engine::BatchView& b) override {
    const std::uint64_t first = b.rows.begin;
    kernels::SciGenerate g{h_->view(),
                           p_.na,
                           p_.nb,
                           dets_.as<Det>() + first,
                           coefficients_.as<double>() + first,
                           b.rows.size(),
                           eps_,
                           static_cast<Candidate*>(b.outputs[0]),
                           b.appended[0],
                           static_cast<std::uint64_t*>(b.scratch),
                           scan_.data(),
                           {}};
    if (sources_.sampled) {
      g.out = nullptr;
      g.sampled = {batch_.as<std::uint64_t>() + first,
                   scale_.as<double>() + first,
                   fold_.as<double>() + first,
                   sources_.eps_large,
                   static_cast<kernels::sci::TaggedCandidate*>(b.outputs[0]),
                   static_cast<kernels::sci::TaggedCandidate*>(b.outputs[1]),
                   b.appended[1]};
    }
    kernels::sci_generate(*b.stream, g);
  }

 private:
  const Problem& p_;
  GenerationSources sources_;
  double eps_;
  std::unique_ptr<sci::ResidentHamiltonian> h_;
  Buffer dets_, coefficients_, batch_, scale_, fold_, scan_;
};

// ---------------------------------------------------------------- scoring: E_PT2 and the top-K

struct Scored {
  double score = 0;  // |amplitude|
  std::uint64_t alpha = 0, beta = 0;
  double amplitude = 0;  // the AmplitudeModel's (first_order: v / (E - H_aa))
};
// Larger score first; ties by key, so the order is total.
bool better(const Scored& a, const Scored& b) {
  if (a.score != b.score) return a.score > b.score;
  return Det{a.alpha, a.beta} < Det{b.alpha, b.beta};
}

// A tile's partial: E_PT2 of its rows, then up to K entries (count, then entries).
struct ScoreHeader {
  double pt2 = 0;
  std::uint64_t count = 0;
};

class ScoreReduction final : public engine::Reduction {
 public:
  explicit ScoreReduction(std::uint64_t k) : k_(k) {}
  std::unique_ptr<Reduction> empty() const override { return std::make_unique<ScoreReduction>(k_); }
  void fold(std::uint64_t, const std::byte* partial) override {
    ScoreHeader h;
    std::memcpy(&h, partial, sizeof h);
    pt2_ = h.pt2;
    top_.resize(h.count);
    std::memcpy(top_.data(), partial + sizeof h, h.count * sizeof(Scored));
  }
  void merge(const Reduction& right) override {
    const auto& r = static_cast<const ScoreReduction&>(right);
    pt2_ += r.pt2_;
    std::vector<Scored> both;
    both.reserve(top_.size() + r.top_.size());
    std::merge(top_.begin(), top_.end(), r.top_.begin(), r.top_.end(), std::back_inserter(both), better);
    if (both.size() > k_) both.resize(k_);
    top_ = std::move(both);
  }
  std::string save() const override {
    std::string s(reinterpret_cast<const char*>(&pt2_), 8);
    s.append(reinterpret_cast<const char*>(top_.data()), top_.size() * sizeof(Scored));
    return s;
  }
  void load(const std::string& s) override {
    std::memcpy(&pt2_, s.data(), 8);
    top_.resize((s.size() - 8) / sizeof(Scored));
    std::memcpy(top_.data(), s.data() + 8, top_.size() * sizeof(Scored));
  }
  double pt2() const { return pt2_; }
  const std::vector<Scored>& top() const { return top_; }

 private:
  std::uint64_t k_;
  double pt2_ = 0;
  std::vector<Scored> top_;
};

// Per unique candidate outside the space (and of the target's irrep), the EN-PT2 term and the
// model's amplitude; each tile's partial keeps its K best. Whether a candidate counts and its
// denominator E - H_aa come from the backend (kernels/sci/sci_score.hpp: on the GPU, the space and
// the integrals resident for the pass), and so do the sums when no top-K is kept (a final PT2);
// else the sums and the top-K are the host's. Either way per tile in row order, so E_PT2 and the
// top-K have the same bits on every backend and for any batch.
class ScoreKernel final : public SpaceKernel {
 public:
  // rows: the pass's (k == 0: its tile sums are kept on the device)
  ScoreKernel(const Memory& m, const sci::AmplitudeModel& model, double energy, std::uint64_t k, std::uint64_t tile_rows,
              std::uint64_t rows)
      : SpaceKernel(m, k == 0 ? sum_values(rows, tile_rows, 1) : 0), model_(model), energy_(energy), k_(k),
        tile_rows_(tile_rows) {}
  // (the top-K's keys and amplitudes are the host's; E_PT2 alone is summed on the backend)
  bool reads_host_inputs() const override { return k_ > 0; }
  void process(const engine::BatchView& b) override {
    const std::uint64_t rows = b.rows.size(), tiles = (rows + tile_rows_ - 1) / tile_rows_;
    const std::size_t partial_bytes = sizeof(ScoreHeader) + k_ * sizeof(Scored);
    if (k_ == 0) {  // (E_PT2 alone: summed where the rows are, nothing else leaves the device)
      const kernels::SciScoreRows scored = score_rows(b, 2, energy_);
      kernels::SciTileSums sums;
      sums.values = static_cast<const double*>(b.inputs[1]);
      sums.tile_rows = tile_rows_;
      std::vector<double> pt2(tiles);
      tile_sums(b, scored, sums, pt2.data());
      for (std::uint64_t t = 0; t < tiles; ++t) {
        ScoreHeader h;
        h.pt2 = pt2[t];
        std::memcpy(static_cast<std::byte*>(b.partials) + t * partial_bytes, &h, sizeof h);
      }
      return;
    }
    const auto* keys = static_cast<const std::uint64_t*>(b.host_inputs[0]);
    const auto* values = static_cast<const double*>(b.host_inputs[1]);
    score_rows_to_host(b, 2, energy_);
    // (tiles are independent, each summed in row order: one a thread gives the same partials)
    parallel_for(static_cast<std::int64_t>(tiles), [&](std::int64_t tile) {
      const auto t = static_cast<std::uint64_t>(tile);
      const std::uint64_t begin = t * tile_rows_, end = std::min(rows, begin + tile_rows_);
      ScoreHeader h;
      std::vector<Scored> top;  // (grows: a std::bad_alloc leaves the pass as an error)
      for (std::uint64_t r = begin; r < end; ++r) {
        if (skipped_[r]) continue;
        const double den = denominator_[r];
        const double v = values[r];
        h.pt2 += v * v / den;
        if (k_) {
          const double amplitude = model_.amplitude({Det{keys[2 * r], keys[2 * r + 1]}, v, den});
          top.push_back({std::fabs(amplitude), keys[2 * r], keys[2 * r + 1], amplitude});
        }
      }
      if (top.size() > k_) {
        std::nth_element(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(k_), top.end(), better);
        top.resize(k_);
      }
      std::sort(top.begin(), top.end(), better);
      h.count = top.size();
      auto* out = static_cast<std::byte*>(b.partials) + t * partial_bytes;
      std::memcpy(out, &h, sizeof h);
      std::memcpy(out + sizeof h, top.data(), top.size() * sizeof(Scored));
    });
  }

 private:
  const sci::AmplitudeModel& model_;
  double energy_;
  std::uint64_t k_, tile_rows_;
};

// The semistochastic PT2's score of a group of batches [first, first + count): per row outside the
// space (a unique (candidate, tag) key with its summed value, or a diagonal term as generated),
// its term over E - H_aa, summed per batch (kernels::SciSampled says what the tags hold): A^2 for
// tag 3b, -A_large^2 for 3b + 1, B - B_large for 3b + 2. Sums per tile in row order, then the
// engine's tree: the same bits on every backend and rank count.
class SampledScoreKernel final : public SpaceKernel {
 public:
  // records: input 0 holds whole records (alpha, beta, tag, value: the diagonal terms, scored as
  // generated); else the de-duplicated keys (alpha, beta, tag) and input 1 their summed values.
  SampledScoreKernel(const Memory& m, double energy, std::uint64_t first, std::uint64_t count, std::uint64_t tile_rows,
                     bool records, std::uint64_t rows)
      : SpaceKernel(m, sum_values(rows, tile_rows, static_cast<std::uint32_t>(count))), energy_(energy), first_(first),
        count_(count), tile_rows_(tile_rows), records_(records) {}
  void process(const engine::BatchView& b) override {
    const std::uint32_t words = records_ ? 4 : 3;
    const auto* keys = static_cast<const std::uint64_t*>(b.inputs[0]);
    const kernels::SciScoreRows scored = score_rows(b, words, energy_);
    kernels::SciTileSums sums;
    sums.values = records_ ? reinterpret_cast<const double*>(keys + 3) : static_cast<const double*>(b.inputs[1]);
    sums.value_stride = records_ ? 4 : 1;
    sums.tags = keys + 2;
    sums.tag_stride = words;
    sums.first_batch = first_;
    sums.slots = static_cast<std::uint32_t>(count_);
    sums.tile_rows = tile_rows_;
    tile_sums(b, scored, sums, static_cast<double*>(b.partials));  // (a tile's partial: its count_ sums)
  }
  bool reads_host_inputs() const override { return false; }

 private:
  double energy_;
  std::uint64_t first_, count_, tile_rows_;
  bool records_;
};

// The output pass: the final space and coefficients, copied from the host.
class WriteSpaceKernel final : public engine::PassKernel {
 public:
  WriteSpaceKernel(const Memory& m) : m_(m) {}
  void prepare(Backend& backend, Stream&) override { backend_ = &backend; }
  void process(const engine::BatchView& b) override {
    const auto& d = m_.space.dets;
    const auto& c = m_.davidson->eigenvector();
    backend_->copy_to_device(b.outputs[0], d.data() + b.rows.begin, b.rows.size() * sizeof(Det), *b.stream);
    backend_->copy_to_device(b.outputs[1], c.data() + b.rows.begin, b.rows.size() * 8, *b.stream);
  }

 private:
  const Memory& m_;
  Backend* backend_ = nullptr;
};

// ---------------------------------------------------------------- the run

constexpr std::uint64_t kScoreTileMin = 1 << 16;
// A score pass's tile for a top-K of k: room for the K best of 4K rows (the tiles' partials hold K each).
std::uint64_t score_tile_rows(std::uint64_t k) {
  return std::max<std::uint64_t>(kScoreTileMin, std::bit_ceil(4 * std::max<std::uint64_t>(k, 1)));
}

// Chunk rows (and tile rows) for n rows: `most`, or n when fewer, so a chunk divides a tile.
std::uint64_t row_chunk(std::uint64_t n, std::uint64_t most) { return std::min<std::uint64_t>(std::max<std::uint64_t>(n, 1), most); }

// What an iteration found (the history written under iterations/). Absent values stay NaN (or 0
// for counts), as the datasets say.
// A point of the eps_var schedule, once iterated to convergence (and its PT2, if any).
// (the scalars are the lowest root's; the vectors hold every root's, the lowest first)
struct SchedulePoint {
  double eps_var = 0, e_var = 0, e_pt2 = std::nan("");  // (NaN: no PT2 at this point)
  double e_pt2_error = 0;                                 // (semistochastic: E_PT2's error bar)
  std::uint64_t dets = 0;
  std::int32_t iteration = 0;  // its last
  std::vector<double> e_var_roots, e_pt2_roots, e_pt2_error_roots;
  void put(Packer& out) const {
    out.put(eps_var), out.put(e_var), out.put(e_pt2), out.put(e_pt2_error), out.put(dets), out.put(iteration);
    out.put_vector(e_var_roots), out.put_vector(e_pt2_roots), out.put_vector(e_pt2_error_roots);
  }
  void get(Unpacker& in) {
    eps_var = in.get<double>(), e_var = in.get<double>(), e_pt2 = in.get<double>(), e_pt2_error = in.get<double>();
    dets = in.get<std::uint64_t>(), iteration = in.get<std::int32_t>();
    e_var_roots = in.get_vector<double>(), e_pt2_roots = in.get_vector<double>();
    e_pt2_error_roots = in.get_vector<double>();
  }
};

// A semistochastic PT2 (eps_pt2_large set): its deterministic part, each batch's estimate of
// E_PT2 so far (the deterministic part plus that batch's stochastic part), the records its
// groups made, and the group of batches in flight.
struct StochasticPT2 {
  double deterministic = 0;
  std::vector<double> estimates;
  std::uint64_t generated = 0, unique = 0;  // (tagged records, two a candidate; unique (candidate, tag) keys)
  std::uint64_t first = 0, count = 0;
  std::uint64_t diagonal_rows = 0;         // the group's diagonal terms,
  std::vector<double> diagonal_sums;       // and their sums per batch once scored
  double mean() const {
    double sum = 0;
    for (const double e : estimates) sum += e;
    return sum / static_cast<double>(estimates.size());
  }
  // The standard error of the mean (0 below two batches).
  double error() const {
    const std::size_t n = estimates.size();
    if (n < 2) return 0;
    const double m = mean();
    double ss = 0;
    for (const double e : estimates) ss += (e - m) * (e - m);
    return std::sqrt(ss / static_cast<double>(n * (n - 1)));
  }
  void put(Packer& out) const {
    out.put(deterministic), out.put_vector(estimates), out.put(generated), out.put(unique), out.put(first), out.put(count);
    out.put(diagonal_rows), out.put_vector(diagonal_sums);
  }
  void get(Unpacker& in) {
    deterministic = in.get<double>(), estimates = in.get_vector<double>();
    generated = in.get<std::uint64_t>(), unique = in.get<std::uint64_t>();
    first = in.get<std::uint64_t>(), count = in.get<std::uint64_t>();
    diagonal_rows = in.get<std::uint64_t>(), diagonal_sums = in.get_vector<double>();
  }
};
// Batches a group of the stochastic part runs as one generate/dedup/score, at most (its error bar
// is looked at after each group). Once a whole group has given the spread of the estimates, a
// group is no larger than the batches that spread says are still needed, two at least.
constexpr std::uint64_t kBatchesPerGroup = 10, kFewestBatchesPerGroup = 2;
static_assert(kBatchesPerGroup <= kernels::kSciTileSumSlots, "a group's batches are the tile sums' slots");

// Root r's E_var against E_PT2 over the schedule's points that have a PT2, fitted to a line (least
// squares): its value at E_PT2 = 0 is the extrapolated energy, as SHCI codes report it. nullopt
// below 2 points.
struct Extrapolation {
  double energy = 0, slope = 0;
  std::size_t points = 0;
};
std::optional<Extrapolation> extrapolate(const std::vector<SchedulePoint>& points, std::size_t root = 0) {
  std::vector<std::pair<double, double>> xy;
  for (const SchedulePoint& p : points)
    if (root < p.e_pt2_roots.size() && std::isfinite(p.e_pt2_roots[root])) xy.push_back({p.e_pt2_roots[root], p.e_var_roots[root]});
  if (xy.size() < 2) return std::nullopt;
  double mx = 0, my = 0;
  for (const auto& [x, y] : xy) mx += x, my += y;
  mx /= static_cast<double>(xy.size()), my /= static_cast<double>(xy.size());
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : xy) sxx += (x - mx) * (x - mx), sxy += (x - mx) * (y - my);
  if (!(sxx > 0)) return std::nullopt;  // (every point the same E_PT2: no line)
  const double slope = sxy / sxx;
  return Extrapolation{my - slope * mx, slope, xy.size()};
}

// (e_var, e_pt2 and the counts of the lowest root; the roots' energies in e_var_roots and e_pt2_roots)
struct Iteration {
  std::uint64_t dets = 0, generated = 0, unique = 0, selected = 0, davidson_products = 0, pt2_generated = 0, pt2_unique = 0;
  double e_var = std::nan(""), e_pt2 = std::nan("");
  std::vector<double> e_var_roots, e_pt2_roots;
  std::int64_t peak_device_bytes = 0, peak_host_bytes = 0;
  std::map<std::string, double> seconds;  // per phase
  std::vector<std::uint64_t> merge_records_per_rank, pt2_merge_records_per_rank;

  void put(Packer& out) const {
    out.put(dets), out.put(generated), out.put(unique), out.put(selected), out.put(davidson_products);
    out.put(pt2_generated), out.put(pt2_unique), out.put(e_var), out.put(e_pt2), out.put(peak_device_bytes), out.put(peak_host_bytes);
    out.put<std::uint64_t>(seconds.size());
    for (const auto& [phase, s] : seconds) out.put_string(phase), out.put(s);
    out.put_vector(merge_records_per_rank), out.put_vector(pt2_merge_records_per_rank);
    out.put_vector(e_var_roots), out.put_vector(e_pt2_roots);
  }
  void get(Unpacker& in) {
    dets = in.get<std::uint64_t>(), generated = in.get<std::uint64_t>(), unique = in.get<std::uint64_t>();
    selected = in.get<std::uint64_t>(), davidson_products = in.get<std::uint64_t>();
    pt2_generated = in.get<std::uint64_t>(), pt2_unique = in.get<std::uint64_t>();
    e_var = in.get<double>(), e_pt2 = in.get<double>();
    peak_device_bytes = in.get<std::int64_t>(), peak_host_bytes = in.get<std::int64_t>();
    for (auto n = in.get<std::uint64_t>(); n > 0; --n) {
      std::string phase = in.get_string();
      seconds[phase] = in.get<double>();
    }
    merge_records_per_rank = in.get_vector<std::uint64_t>();
    pt2_merge_records_per_rank = in.get_vector<std::uint64_t>();
    e_var_roots = in.get_vector<double>(), e_pt2_roots = in.get_vector<double>();
  }
};

// The phases of an iteration, and of the final PT2 at eps_pt2.
// (sampled_*: the semistochastic PT2's stochastic part, a group of batches at a time)
enum class Phase : std::uint8_t {
  davidson, generate, dedup, score, pt2_generate, pt2_dedup, pt2_score, sampled_generate, sampled_diagonal, sampled_dedup,
  sampled_score, done
};
bool final_pt2(Phase p) { return p == Phase::pt2_generate || p == Phase::pt2_dedup || p == Phase::pt2_score; }
bool sampled(Phase p) { return p >= Phase::sampled_generate && p <= Phase::sampled_score; }
// The name an iteration's seconds are kept under.
std::string timed_phase(Phase p) {
  switch (p) {
    case Phase::davidson: return "davidson";
    case Phase::generate: return "generate";
    case Phase::dedup: return "dedup";
    case Phase::score: return "score";
    default: return "pt2";
  }
}

// What a de-duplication on resident data leaves: the unique keys and their summed values (divided
// between ranks: this rank's, the r-th range of the keys).
struct ResidentUnique {
  Buffer keys, values;
  std::uint64_t unique = 0, records = 0;
};

// Rows held end to end in rank order, moved so that every rank holds whole tiles and about as
// many as any other: rank r held rows [held[r], held[r + 1]) and holds [to[r], to[r + 1]), the
// r-th of equal shares of them, rounded up to a tile (the last rank's may end in a partial one).
struct TileShares {
  std::vector<std::uint64_t> held, to;
  TileShares(const comm::Communicator& ranks, std::uint64_t rows, std::uint64_t tile_rows);
  // This rank's rows after the move (row_words uint64 each), from `data` (its rows before).
  Buffer move(comm::Communicator& ranks, Stream& stream, const Buffer& data, std::uint64_t row_words,
              const std::function<Buffer(std::uint64_t)>& take) const;
};

// The passes' kernels on resident data, within half of the device budget left (`room`); see
// "passes on resident data" below.
struct ResidentWork {
  struct Generated {
    Buffer records, diagonal;  // Candidate (TaggedCandidate sampled) records; sampled: the diagonal terms
    std::uint64_t rows = 0, diagonal_rows = 0;
  };
  // (with several ranks the room is the least any rank has, so that every decision that depends on
  // it is the same on all)
  ResidentWork(Backend& backend, Stream& stream, const mpi::Comm& comm);
  // The most device bytes a dedup of `rows` records of `words` key words (the records given
  // included) or the score after it holds at once, and the dedup kernels' workspace among them.
  std::uint64_t dedup_bytes(std::uint64_t rows, std::uint32_t words) const;
  // nullopt once the records and held_after(records) would pass the room, or (cuda) the score's
  // copies of its inputs on the host (copied(records), at most) the host budget's. Divided: from
  // this rank's share of the sources, and nullopt on every rank when it is so on one.
  std::optional<Generated> generate(const Problem& p, const GenerationSources& sources, double eps,
                                    const std::function<std::uint64_t(std::uint64_t)>& held_after,
                                    const std::function<std::uint64_t(std::uint64_t)>& copied);
  // Divided: this rank's records moved to whole tiles, then keys::unique_over_ranks within the
  // room less `beside` (nullopt on every rank when a rank's bucket would not fit).
  std::optional<ResidentUnique> dedup(Buffer records, std::uint64_t rows, std::uint32_t words,
                                      std::uint64_t beside = 0);
  // Divided: the unique keys (and values) moved so that this rank holds whole score tiles; returns
  // the pass's index of its first tile (0 undivided).
  std::uint64_t share_tiles(ResidentUnique& u, std::uint32_t words, std::uint64_t tile_rows, bool with_values = true);
  // (inputs the kernel reads on the host too, SpaceKernel::reads_host_inputs: copied there on cuda)
  // Divided: the rows are this rank's from first_tile on, and every rank folds every rank's nodes.
  std::unique_ptr<engine::Reduction> score(SpaceKernel& kernel, const engine::Reduction& kind, std::uint64_t rows,
                                           std::uint64_t tile_rows, std::size_t partial_bytes, const Buffer& input,
                                           std::uint32_t words, const Buffer* values, std::uint64_t first_tile = 0);
  // A count summed over the ranks (itself undivided).
  std::uint64_t summed(std::uint64_t mine) const;
  // A device buffer of at least `bytes`, rounded up by at most an eighth: the sizes a unit asks
  // for change little from one unit to the next (a semistochastic PT2's groups), so the backend's
  // pool hands the last unit's blocks out again instead of fresh memory (on the CPU backend fresh
  // pages are cleared by the kernel: a third of a group's time).
  Buffer take(std::uint64_t bytes, const char* what) const;
  Backend& backend;
  Stream& stream;
  bool cuda = false;
  // Half of what the device budget has left, and of the host budget's (the score's host copies:
  // charged to the host budget on cuda, to the device budget, host memory, on cpu).
  std::uint64_t room = 0, host_room = 0;
  // Set (several ranks): the unit is divided between them. Each generates from its share of the
  // sources, the ranks de-duplicate together (their buckets exchanged) and each scores its share of
  // the unique keys; the bytes are one rank's. Unset: every rank runs the whole unit.
  comm::Communicator* ranks = nullptr;
};

// What a root's generation, de-duplication and scoring gave (on resident data).
struct Selection {
  std::uint64_t generated = 0, unique = 0;
  std::vector<std::uint64_t> records;  // the records each rank's merge de-duplicated
  double pt2 = 0;
  std::vector<Scored> top;
  double generate_seconds = 0, dedup_seconds = 0, score_seconds = 0;
};

class SolveRun final : public StepRun {
 public:
  explicit SolveRun(const StepContext& ctx) : ctx_(ctx), params_(SolveParams::from_json(ctx.params)) {
    m_.problem = std::make_unique<Problem>(ctx.files.at("/fcidump"), params_.state);
    if (ctx.comm->root()) sci::log_target(*m_.problem, "sci.solve");
    m_.amplitude_model = sci::make_amplitude_model(params_.amplitude_model);
    begin_iteration(initial_space(ctx, *m_.problem));
  }

  bool done() const override { return phase_ == Phase::done; }
  // An iteration's passes read only that iteration's: the candidates, the sample sort's buckets,
  // the merged candidates (the output pass reads none of them).
  // (a group's diagonal terms are scored before its candidates are de-duplicated: the generation's)
  int first_live_pass() const override {
    if (phase_ == Phase::sampled_diagonal) return generated_pass_;
    return dedup_ ? dedup_->first_live_pass(*ctx_.passes_done) : *ctx_.passes_done;
  }
  std::optional<StepPass> next() override;
  void finished(StepPass& pass) override;
  // (after a Davidson product: the iterations done; in a semistochastic PT2, its batches done. The
  // commits' points.)
  HostProgress progress() const override {
    if (stochastic_)
      return {stochastic_->estimates.size(), params_.pt2_batches, "PT2 batches"};
    return {static_cast<std::uint64_t>(iteration_), static_cast<std::uint64_t>(params_.max_iterations), "iterations"};
  }
  StepPass output(StagePlan& plan) override {
    const std::uint64_t n = m_.space.dets.size();
    const std::uint64_t chunk = row_chunk(n, 1 << 14);
    plan.pass.rows = n;
    plan.pass.tile_rows = chunk;
    plan.pass.outputs = {engine::OutputDecl{"dets", Layout{DType::uint64, {n, 2}, {chunk, 2}}},
                         engine::OutputDecl{"coefficients", Layout{DType::float64, {n}, {chunk}}}};
    plan.pass.progress_unit = "determinants";
    s_squared_.clear();
    for (int r = 0; r < roots(); ++r) s_squared_.push_back(sci::spin_squared(m_.space.dets, m_.davidson->eigenvector(r)));
    return planned_pass(plan, std::make_unique<WriteSpaceKernel>(m_));
  }
  void write(const StagePlan& plan, const StepPass& pass, h5::File& out) const override;
  std::string describe(const StagePlan& plan, const StepPass& pass) const override;
  std::string save() const override;
  void load(std::string_view state) override;

 private:
  Iteration& now() {
    while (history_.size() <= static_cast<std::size_t>(iteration_)) history_.emplace_back();
    return history_[static_cast<std::size_t>(iteration_)];
  }
  // The roots Davidson finds in this space (nroots, or fewer while the space is smaller).
  int roots() const { return m_.davidson->roots(); }
  // Root r's final E_PT2: the PT2 at eps_pt2, or, when none ran (eps_pt2 >= eps_var), the last
  // iteration's at eps_var; and its error bar (semistochastic; else 0).
  double final_e_pt2(int r = 0) const {
    const auto i = static_cast<std::size_t>(r);
    return i < final_pt2_.size() ? final_pt2_[i] : history_.back().e_pt2_roots.at(i);
  }
  double final_e_pt2_error(int r = 0) const {
    const auto i = static_cast<std::size_t>(r);
    return i < stochastic_roots_.size() ? stochastic_roots_[i].error() : 0.0;
  }
  // The seed of root r's draws (root 0's is pt2_seed).
  std::uint64_t pt2_seed(int r) const { return params_.pt2_seed + static_cast<std::uint64_t>(r); }
  // Pass names say the root when there are several.
  std::string named(std::string name) const {
    return params_.nroots > 1 ? fmt::format("{} root {}", name, root_) : name;
  }
  // Generation, de-duplication and scoring of root_'s candidates at eps (top-K of k) as one unit of
  // host work on data that stays in device memory (host memory on cpu); nullopt when they would
  // take more than half of the device budget left (the passes run them instead). See the .cpp.
  std::optional<Selection> select_on_resident_data(double eps, std::uint64_t k);
  // Its result, as the passes' would be taken.
  void selected(Selection s);
  // Phases run on resident data whenever they fit, on either backend (the same kernels the passes
  // call, device buffers throughout). With several ranks every rank runs the whole unit on its own
  // device (the space and the Davidson vectors are every rank's): no exchange, the same bits, and
  // no rank waits for another's files; the passes, which spread the de-duplication over the
  // ranks, run what does not fit.
  // A semistochastic group (sampled_) the same way, ended (end_group); false: it does not fit.
  bool sampled_group_on_resident_data();
  // With several ranks, a unit on resident data is divided between them (ResidentWork::ranks).
  void divide(ResidentWork& work) {
    if (ctx_.comm->size() < 2) return;
    if (!ranks_) ranks_.emplace(*ctx_.comm, ctx_.backend);
    work.ranks = &*ranks_;
  }
  void say_through_files(const char* what, std::uint64_t room);
  // The next root's passes from `first` (false: every root's are done).
  bool next_root(Phase first);
  // A root's generate/dedup/score at eps_var is done (its PT2 there and its best candidates): the
  // next root's, or the iteration's end.
  void root_selected(double pt2, std::vector<Scored> top);
  // A root's final PT2 is done: the next root's, or the point's end.
  void root_pt2_done(double pt2);
  // The final PT2 at eps_pt2 is done (deterministically, or the deterministic part at eps_pt2_large
  // of a semistochastic one, which then goes on with its stochastic part).
  void deterministic_pt2_done(double pt2);
  void start_group();
  void dedup_group();
  void end_group(const std::vector<double>& sums);
  double eps_var() const { return params_.eps_schedule[static_cast<std::size_t>(point_)]; }
  void end_point();
  // Iteration iteration_'s space, a fresh Davidson from its guesses (nroots of them, or as many
  // as the space has determinants). One root keeps the single-vector start: the same bits as ever.
  void begin_iteration(Space space) {
    m_.space = std::move(space);
    release_resident_space();
    const int roots = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(params_.nroots), m_.space.dets.size()));
    if (roots == 1 && params_.nroots == 1) {
      m_.davidson = std::make_unique<sci::Davidson>(m_.space.guesses.front(), sci::DavidsonOptions{params_.davidson_tolerance, 24, 400});
    } else {  // (a basis of 4 vectors a root, and products to match)
      m_.davidson = std::make_unique<sci::Davidson>(
          start_vectors(*m_.problem, m_.space, roots),
          sci::DavidsonOptions{params_.davidson_tolerance, std::max(24, 4 * roots + 8), 400 * roots});
    }
  }
  void product();
  void make_resident_space();
  void release_resident_space() {
    if (m_.resident && m_.resident->can_seed_growth()) {
      m_.resident->keep_only_growth_seed();
      m_.grown_from = std::move(m_.resident);
    }
    m_.resident.reset();
    m_.x.reset(), m_.sigma.reset(), m_.diagonal.reset();
  }
  // Adds to the iteration's seconds of `phase` and its peak memory (the largest over ranks).
  void account(const std::string& phase, double seconds);
  void finish_iteration();
  keys::DedupSource dedup_source() const {
    keys::DedupSource src;
    src.keys = earlier_pass_input(generated_pass_, "candidates");
    src.rows = generated_rows_;
    src.words = sampled(phase_) ? 3 : 2;  // (the sampled records' key: the determinant and a tag)
    src.interleaved_value = true;
    return src;
  }

  const StepContext& ctx_;
  const SolveParams params_;
  Memory m_;
  // The state (saved): where the iteration is, what its passes made, and the history.
  Phase phase_ = Phase::davidson;
  int iteration_ = 0;
  std::vector<double> e_var_;      // this iteration's, a root, once Davidson is done
  int root_ = 0;                   // the root whose passes run
  std::vector<double> root_pt2_;   // the iteration's roots done: their E_PT2 at eps_var
  std::vector<std::vector<Scored>> root_top_;  // and their best candidates
  int generated_pass_ = -1;
  std::uint64_t generated_rows_ = 0;
  std::optional<keys::DedupRun> dedup_;
  std::vector<Iteration> history_;
  std::vector<double> final_pt2_;  // the roots' whose final PT2 is done
  std::string stop_reason_;
  bool converged_ = false;
  int point_ = 0, point_first_iteration_ = 0;  // where the eps_var schedule is, and its first iteration
  std::vector<SchedulePoint> points_;           // the schedule's points done
  std::optional<StochasticPT2> stochastic_;     // the semistochastic PT2's, once its deterministic part is done
  bool told_through_files_ = false;             // (say_through_files said it)
  std::vector<StochasticPT2> stochastic_roots_; // the roots' whose semistochastic PT2 is done
  SampledSources sampled_;                      // (not saved: its group's draws, drawn again by load())
  // (not saved)
  std::optional<comm::Communicator> ranks_;  // (the products' rows gathered on every rank; divided units)
  std::unique_ptr<Stream> stream_;           // (the products')
  std::chrono::steady_clock::time_point pass_started_;
  // An iteration's Davidson seconds, for the log: storing H, the products (and their copies),
  // Davidson's own arithmetic (on the device once its vectors are placed there).
  struct DavidsonSeconds {
    double build = 0, device = 0, arithmetic = 0;
    bool placed = false;  // (Davidson's vectors on the backend)
  } davidson_seconds_;
  std::vector<double> s_squared_;  // of the final states (output())
};

// A generation pass over `sources`: its candidates appended as Candidate records (three words) or,
// sampled, as TaggedCandidate records (four words; kernels::SciSampled): in "candidates" (two a
// candidate at most) and "diagonal terms" (one), as many as the sources could make at most.
StepPass generation_pass(const Problem& problem, std::string name, const GenerationSources& sources, double eps,
                         const char* unit) {
  const std::uint64_t rows = sources.size(), most = problem.max_per_source;
  StepPass p;
  p.name = std::move(name);
  p.pass.rows = rows;
  p.pass.tile_rows = 16;
  auto append = [&](const char* output, std::uint64_t per_candidate, std::uint64_t columns) {
    engine::OutputDecl out;
    out.name = output;
    out.kind = engine::OutputKind::appended;
    out.layout = Layout{DType::uint64, {rows * most * per_candidate, columns}, {1 << 16, columns}};
    out.max_rows_per_row = most * per_candidate;
    p.pass.outputs.push_back(out);
  };
  if (sources.sampled) {
    append("candidates", 2, 4);
    append("diagonal terms", 1, 4);
  } else {
    append("candidates", 1, 3);
  }
  p.pass.scratch_device_bytes_per_row = sources.sampled ? 32 : 16;  // (the kernel's counts and offsets)
  p.pass.progress_unit = unit;
  p.pass.resident_device_bytes = GenerateKernel::resident_bytes(problem, sources);
  p.kernel = std::make_unique<GenerateKernel>(problem, sources, eps);
  return p;
}

// A scoring pass over a de-duplication's result (keys of `words` words and their summed values):
// the keys on the device for the kernel and in pinned memory for the host's share; the values on
// the device too when the kernel sums there (`sums`: its tile sums, SpaceKernel::sum_values), else
// on the host only. The kernel and the reduction are the caller's.
StepPass score_pass(const Memory& m, std::string name, const keys::DedupResult& r, std::uint32_t words,
                    std::uint64_t tile_rows, std::size_t tile_partial_bytes, std::uint64_t sums) {
  StepPass p;
  p.name = std::move(name);
  p.pass.rows = r.unique;
  p.pass.tile_rows = tile_rows;
  p.pass.inputs.push_back({"unique keys", nullptr, words * 8ull});
  p.pass.inputs.push_back({"summed values", nullptr, 8});
  if (sums == 0) p.pass.inputs[1].place = engine::StreamedInput::Place::host;
  p.pass.resident_device_bytes = SpaceKernel::resident_bytes(m, sums);
  p.pass.scratch_device_bytes_per_row = SpaceKernel::kScratchPerRow;
  p.streamed_inputs = {earlier_pass_input(r.pass, r.keys), earlier_pass_input(r.pass, r.values)};
  p.pass.tile_partial_bytes = tile_partial_bytes;
  p.pass.partials_on_host = true;
  return p;
}

std::optional<StepPass> SolveRun::next() {
  pass_started_ = std::chrono::steady_clock::now();
  const Memory& m = m_;
  if (phase_ == Phase::davidson) {
    product();
    return std::nullopt;
  }
  if (phase_ == Phase::generate || phase_ == Phase::pt2_generate) {
    // (a semistochastic PT2's deterministic part: at eps_pt2_large)
    const double eps = phase_ == Phase::generate ? eps_var() : params_.eps_pt2_large.value_or(params_.eps_pt2);
    // On resident data when it fits (the passes' bytes, without their files).
    if (std::optional<Selection> s = select_on_resident_data(eps, phase_ == Phase::generate ? params_.max_new_dets : 0)) {
      selected(std::move(*s));
      return std::nullopt;
    }
    return generation_pass(*m.problem, named(fmt::format("generate {}", iteration_)),
                           {&m.space.dets, &m.davidson->eigenvector(root_)}, eps, "determinants");
  }
  if (phase_ == Phase::sampled_generate) {
    if (sampled_group_on_resident_data()) return std::nullopt;
    const StochasticPT2& st = *stochastic_;
    return generation_pass(*m.problem, named(fmt::format("sampled generate {}-{}", st.first, st.first + st.count - 1)),
                           {&sampled_.dets, &sampled_.coefficients, &sampled_, *params_.eps_pt2_large}, params_.eps_pt2,
                           "sampled determinants");
  }
  if (phase_ == Phase::dedup || phase_ == Phase::pt2_dedup || phase_ == Phase::sampled_dedup) return dedup_->next();
  if (phase_ == Phase::score || phase_ == Phase::pt2_score) {
    const std::uint64_t k = phase_ == Phase::score ? params_.max_new_dets : 0;
    const std::uint64_t tile_rows = score_tile_rows(k);
    const std::uint64_t rows = dedup_->result().unique;
    StepPass p = score_pass(m, named(fmt::format("score {}", iteration_)), dedup_->result(), 2, tile_rows,
                            sizeof(ScoreHeader) + k * sizeof(Scored), k == 0 ? SpaceKernel::sum_values(rows, tile_rows, 1) : 0);
    p.kernel = std::make_unique<ScoreKernel>(m, *m.amplitude_model, e_var_.at(root_), k, tile_rows, rows);
    p.reduction = std::make_unique<ScoreReduction>(k);
    return p;
  }
  if (phase_ == Phase::sampled_score) {
    const StochasticPT2& st = *stochastic_;
    const std::uint64_t rows = dedup_->result().unique;
    StepPass p = score_pass(m, named(fmt::format("sampled score {}-{}", st.first, st.first + st.count - 1)),
                            dedup_->result(), 3, kScoreTileMin, st.count * 8,
                            SpaceKernel::sum_values(rows, kScoreTileMin, static_cast<std::uint32_t>(st.count)));
    p.kernel = std::make_unique<SampledScoreKernel>(m, e_var_.at(root_), st.first, st.count, kScoreTileMin, false, rows);
    p.reduction = std::make_unique<engine::ElementwiseSums>(st.count);
    return p;
  }
  if (phase_ == Phase::sampled_diagonal) {  // (the generation's diagonal terms as they are: no de-duplication)
    const StochasticPT2& st = *stochastic_;
    StepPass p;
    p.name = named(fmt::format("sampled diagonal terms {}-{}", st.first, st.first + st.count - 1));
    p.pass.rows = st.diagonal_rows;
    p.pass.tile_rows = kScoreTileMin;
    p.pass.inputs.push_back({"diagonal terms", nullptr, 32});
    const std::uint64_t sums = SpaceKernel::sum_values(st.diagonal_rows, kScoreTileMin, static_cast<std::uint32_t>(st.count));
    p.pass.resident_device_bytes = SpaceKernel::resident_bytes(m, sums);
    p.pass.scratch_device_bytes_per_row = SpaceKernel::kScratchPerRow;
    p.streamed_inputs = {earlier_pass_input(generated_pass_, "diagonal terms")};
    p.pass.tile_partial_bytes = st.count * 8;
    p.pass.partials_on_host = true;
    p.kernel = std::make_unique<SampledScoreKernel>(m, e_var_.at(root_), st.first, st.count, kScoreTileMin, true,
                                                    st.diagonal_rows);
    p.reduction = std::make_unique<engine::ElementwiseSums>(st.count);
    return p;
  }
  throw std::logic_error("sci.solve: next() after the last pass");
}

void SolveRun::finished(StepPass& pass) {
  const int index = *ctx_.passes_done;  // this pass's
  account(timed_phase(phase_), std::chrono::duration<double>(std::chrono::steady_clock::now() - pass_started_).count());
  Iteration& now = this->now();
  if (phase_ == Phase::sampled_generate) {
    StochasticPT2& st = *stochastic_;
    generated_pass_ = index;
    generated_rows_ = pass.outputs.at(0).rows;
    st.diagonal_rows = pass.outputs.at(1).rows;
    st.generated += generated_rows_ + st.diagonal_rows;
    st.diagonal_sums.assign(st.count, 0.0);
    if (st.diagonal_rows > 0) phase_ = Phase::sampled_diagonal;
    else dedup_group();
    return;
  }
  if (phase_ == Phase::sampled_diagonal) {
    stochastic_->diagonal_sums = static_cast<const engine::ElementwiseSums&>(*pass.reduction).sums();
    return dedup_group();
  }
  if (phase_ == Phase::sampled_dedup) {
    dedup_->finished(pass);
    if (dedup_->done()) {
      stochastic_->unique += dedup_->result().unique;
      phase_ = Phase::sampled_score;
    }
    return;
  }
  if (phase_ == Phase::sampled_score) return end_group(static_cast<const engine::ElementwiseSums&>(*pass.reduction).sums());
  const bool pt2 = final_pt2(phase_);
  if (phase_ == Phase::generate || phase_ == Phase::pt2_generate) {
    generated_pass_ = index;
    generated_rows_ = pass.outputs.at(0).rows;
    (pt2 ? now.pt2_generated : now.generated) += generated_rows_;  // (summed over the roots)
    if (generated_rows_ == 0) {  // nothing to de-duplicate: no candidate passed the screening
      if (pt2) {
        deterministic_pt2_done(0.0);
      } else {
        root_selected(0.0, {});
      }
      return;
    }
    dedup_.emplace(ctx_, dedup_source());
    phase_ = pt2 ? Phase::pt2_dedup : Phase::dedup;
    return;
  }
  if (phase_ == Phase::dedup || phase_ == Phase::pt2_dedup) {
    dedup_->finished(pass);
    if (dedup_->done()) {
      (pt2 ? now.pt2_unique : now.unique) += dedup_->result().unique;
      // How evenly the sample sort spread the merge over the ranks (seed 004's Table 1; the lowest root's).
      if (root_ == 0)
        (pt2 ? now.pt2_merge_records_per_rank : now.merge_records_per_rank) = dedup_->merge_rows_per_rank(ctx_.comm->size());
      phase_ = pt2 ? Phase::pt2_score : Phase::score;
    }
    return;
  }
  const auto& r = static_cast<const ScoreReduction&>(*pass.reduction);
  if (pt2) return deterministic_pt2_done(r.pt2());
  root_selected(r.pt2(), r.top());
}

// ---------------------------------------------------------------- passes on resident data
//
// One rank runs a root's generate, dedup and score passes (and a semistochastic group's) as
// kernels on data that stays in device memory (host memory on cpu) when it fits: the same bytes as
// the passes, because the passes' results do not depend on their batches and this is one batch
// of each.
//   generate  GenerateKernel over chunks of sources (each chunk's outputs sized, as a batch's, for
//             the most candidates a source can make), the records kept in order;
//   dedup     keys.dedup's kernels on all of them: tile_unique over its tiles (DedupSource's
//             tile_rows: the sums' shape), bucket_split into one bucket, bucket_merge (on cpu their
//             bytes from one radix sort, kernels::cpu::RadixUnique);
//   score     the score pass's kernel over its rows as one batch, its tiles' partials folded in the
//             engine's tree (engine/tree_fold.hpp), as the pass folds them.
// No file, no journal, no pinned buffer: the unit is redone whole if the run stops inside it. It
// declines (nullopt) once what it would hold passes half of the device budget left; the passes
// run instead.

ResidentWork::ResidentWork(Backend& backend, Stream& stream, const mpi::Comm& comm)
    : backend(backend), stream(stream), cuda(backend.kind() == BackendKind::cuda) {
  const auto half_left = [](const MemoryBudget& b) { return b.left() / 2; };
  room = half_left(backend.device_budget());
  host_room = half_left(backend.host_budget());
  if (comm.size() > 1) {  // (the least over ranks: the largest of the negated)
    const std::vector<std::int64_t> least =
        comm.max({-static_cast<std::int64_t>(std::min<std::uint64_t>(room, INT64_MAX)),
                  -static_cast<std::int64_t>(std::min<std::uint64_t>(host_room, INT64_MAX))});
    room = static_cast<std::uint64_t>(-least[0]), host_room = static_cast<std::uint64_t>(-least[1]);
  }
}

Buffer ResidentWork::take(std::uint64_t bytes, const char* what) const {
  const std::uint64_t granule = std::max<std::uint64_t>(std::bit_floor(std::max<std::uint64_t>(bytes, 1)) / 8, 1);
  return backend.alloc_device((bytes + granule - 1) / granule * granule, what);
}

// (the GPU kernels' largest workspace; the CPU twins use host temporaries)
std::uint64_t ResidentWork::dedup_bytes(std::uint64_t rows, std::uint32_t words) const {
  const kernels::RecordLayout layout{words, true, false};
  const std::uint64_t record = layout.cols() * 8, merged = words * 8 + 16;
  const std::uint64_t tile_rows = keys::DedupSource{}.tile_rows, tiles = kernels::tiles_of(rows, tile_rows);
  // (dedup, cuda: keys::ResidentChain's, the records given being freed once tiled (they take the
  // place of its split). On cpu: the records given, the radix sort's other half and the values;
  // then one of those halves, the values and the output. score: the keys, values and scratch.
  // Rounded as take rounds.)
  const std::uint64_t dedup = cuda ? keys::ResidentChain::peak_bytes(true, layout, rows, tile_rows, tiles * tile_rows)
                                   : std::max(2 * record, record + merged) * rows + tiles * 8 + 8;
  const std::uint64_t score = rows * (words * 8 + 8 + SpaceKernel::kScratchPerRow);
  return std::max(dedup, score) / 8 * 9 + 64;
}

// The generation's records (Candidate, or sampled TaggedCandidate and diagonal terms), end to end.
std::optional<ResidentWork::Generated> ResidentWork::generate(const Problem& p, const GenerationSources& sources, double eps,
                                                             const std::function<std::uint64_t(std::uint64_t)>& held_after,
                                                             const std::function<std::uint64_t(std::uint64_t)>& copied) {
  const bool sampled = sources.sampled != nullptr;
  const std::uint64_t record = sampled ? sizeof(kernels::sci::TaggedCandidate) : sizeof(Candidate);
  const std::uint64_t n = sources.size(), most = std::max<std::uint64_t>(p.max_per_source, 1);
  // (divided: this rank's share of the sources, so the ranks' records are the whole's end to end)
  const auto share = [&](int r) {
    return ranks ? n * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(ranks->size()) : (r ? n : 0);
  };
  const std::uint64_t begin = share(ranks ? ranks->rank() : 0), end = share(ranks ? ranks->rank() + 1 : 1);
  // (a chunk's outputs, as a batch's: room for the most a source makes, two records a candidate
  // and a diagonal term sampled; an eighth of the room at most, one source at least)
  const std::uint64_t per_source = most * (sampled ? 3 * record : record) + (sampled ? 32 : 16);
  const std::uint64_t chunk =
      std::min(std::max<std::uint64_t>(n, 1), room / 8 / per_source);  // (the same on every rank)
  if (chunk == 0) return std::nullopt;
  const std::uint64_t fixed = GenerateKernel::resident_bytes(p, sources) + chunk * per_source;
  // The chunks' records gather in blocks of one size (the pool hands them out again, chunk after
  // chunk and unit after unit; blocks of each chunk's size were fresh memory each time).
  const std::uint64_t block = std::clamp<std::uint64_t>(std::bit_floor(std::max<std::uint64_t>(room / 16, 1)), 1 << 20, 64 << 20);
  // The most held at once, over the unit's phases, once `rows` records and `diagonal` terms are
  // made: the chunk's buffers and the chunks' records; the records joined end to end, one output
  // at a time, the other's chunks freed first; the diagonal terms scored beside the records; what
  // comes after (held_after: the records' dedup and score). Rounded as take rounds.
  const auto too_much = [&](std::uint64_t rows, std::uint64_t diagonal) {
    const std::uint64_t made = (rows + diagonal) * record + 2 * block;  // (a block partly filled an output)
    const std::uint64_t device = std::max({fixed + made, made + std::max(rows, diagonal) * record,
                                           made + diagonal * SpaceKernel::kScratchPerRow + held_after(0)}) / 8 * 9 +
                                 64;
    return std::max(device, held_after(rows)) > room || (cuda && copied(rows) > host_room);
  };
  if (too_much(0, 0)) return std::nullopt;
  bool declined = false;
  Generated out;
  std::vector<Buffer> parts[2];  // (each full but the last: bytes[o] in all)
  std::uint64_t bytes[2] = {0, 0};
  {
    GenerateKernel kernel(p, sources, eps);
    kernel.prepare(backend, stream);
    Buffer records = take(chunk * most * (sampled ? 2 : 1) * record, "selected-CI candidates (resident)");
    Buffer diagonal = sampled ? take(chunk * most * record, "selected-CI diagonal terms (resident)") : Buffer{};
    Buffer scratch = take(chunk * (sampled ? 32 : 16), "selected-CI generation scratch (resident)");
    Buffer counts = take(16, "selected-CI candidate counts (resident)");
    for (std::uint64_t first = begin; first < end && !declined; first += chunk) {
      engine::BatchView b;
      b.rows = {first, std::min(end, first + chunk)};
      b.outputs = {records.data(), diagonal.data()};
      b.appended = {counts.as<std::uint64_t>(), counts.as<std::uint64_t>() + 1};
      b.scratch = scratch.data();
      b.stream = &stream;
      kernel.process(b);
      std::uint64_t made[2] = {0, 0};
      backend.copy_to_host(made, counts.data(), sampled ? 16 : 8, stream);
      stream.synchronize();
      out.rows += made[0], out.diagonal_rows += made[1];
      if (too_much(out.rows, out.diagonal_rows)) {
        declined = true;
        break;
      }
      const Buffer* from[2] = {&records, &diagonal};
      for (int o = 0; o < 2; ++o)
        for (std::uint64_t done = 0; done < made[o] * record;) {
          if (bytes[o] == parts[o].size() * block) parts[o].push_back(take(block, "selected-CI candidates (resident)"));
          const std::uint64_t at = bytes[o] % block, n = std::min(made[o] * record - done, block - at);
          backend.copy_on_device(static_cast<char*>(parts[o].back().data()) + at, static_cast<const char*>(from[o]->data()) + done,
                                 n, stream);
          done += n, bytes[o] += n;
        }
    }
    stream.synchronize();
  }
  if (summed(declined ? 1 : 0)) return std::nullopt;
  Buffer* joined[2] = {&out.records, &out.diagonal};
  const std::uint64_t total[2] = {out.rows, out.diagonal_rows};
  for (int o : {1, 0}) {  // (the diagonal terms' chunks freed before the candidates' are joined)
    if (total[o] == 0) continue;
    if (parts[o].size() == 1) {  // (one block holds them all: already end to end)
      *joined[o] = std::move(parts[o].front());
      continue;
    }
    *joined[o] = take(total[o] * record, "selected-CI candidates (resident)");
    for (std::size_t i = 0; i < parts[o].size(); ++i)
      backend.copy_on_device(static_cast<char*>(joined[o]->data()) + i * block, parts[o][i].data(),
                             std::min(block, bytes[o] - i * block), stream);
    parts[o].clear();  // (the stream's order keeps a block reused next safe)
  }
  stream.synchronize();
  return out;
}

// keys.dedup's partition into one bucket and its merge, over `rows` records of `words` key words
// and an interleaved value (consumed).
std::optional<ResidentUnique> ResidentWork::dedup(Buffer records_in, std::uint64_t rows, std::uint32_t words,
                                                  std::uint64_t beside) {
  const kernels::RecordLayout layout{words, true, false};
  const std::uint64_t tile_rows = keys::DedupSource{}.tile_rows, tiles = kernels::tiles_of(rows, tile_rows);
  const auto taker = [this](std::uint64_t bytes, const char* what) { return take(bytes, what); };
  ResidentUnique out;
  if (ranks) {
    const TileShares shares(*ranks, rows, tile_rows);
    const std::uint64_t me = static_cast<std::uint64_t>(ranks->rank()), mine_rows = shares.to[me + 1] - shares.to[me];
    // (a rank may get more rows than it made: what it then holds, the move's two buffers or the
    // chain's, checked on every rank before any is taken)
    const std::uint64_t need = std::max(dedup_bytes(mine_rows, words), (rows + mine_rows) * (words + 1) * 8);
    if (summed(need > (room > beside ? room - beside : 0) ? 1 : 0)) return std::nullopt;
    Buffer mine = shares.move(*ranks, stream, records_in, words + 1, [this](std::uint64_t bytes) {
      return take(bytes, "selected-CI candidates (resident, this rank's tiles)");
    });
    records_in.reset();
    const keys::DedupSource defaults;
    const kernels::KeyRows rows_in = kernels::KeyRows::interleaved_rows(mine.as<std::uint64_t>(), words, mine_rows);
    std::optional<keys::ResidentChain::Unique> u =
        keys::unique_over_ranks(backend, stream, *ranks, {rows_in, std::move(mine), shares.to[me]}, tile_rows,
                                defaults.samples, false, room > beside ? room - beside : 0, taker);
    if (!u) return std::nullopt;
    out.keys = std::move(u->keys), out.values = std::move(u->values);
    out.unique = u->unique, out.records = u->records;
    return out;
  }
  if (!cuda) {  // (the same bytes in one radix sort: kernels::cpu::RadixUnique)
    Buffer spare = take(rows * (words + 1) * 8, "selected-CI records (resident)");
    Buffer values = take(rows * 8, "selected-CI values (resident)");
    const kernels::cpu::RadixUnique sorted(
        {records_in.as<std::uint64_t>(), spare.as<std::uint64_t>(), values.as<double>(), rows, words, tile_rows});
    (sorted.sorted_in_spare() ? records_in : spare).reset();
    out.records = sorted.tile_records(), out.unique = sorted.unique();
    out.keys = take(out.records * words * 8, "selected-CI unique keys (resident)");
    Buffer key_counts = take(out.records * 8, "selected-CI unique counts (resident)");
    out.values = take(out.records * 8, "selected-CI summed values (resident)");
    sorted.write(out.keys.as<std::uint64_t>(), key_counts.as<std::uint64_t>(), out.values.as<double>());
    return out;
  }
  keys::ResidentChain chain(backend, stream, layout, rows, tile_rows, tiles * tile_rows, taker);
  chain.add(kernels::KeyRows::interleaved_rows(records_in.as<std::uint64_t>(), words, rows), 0);
  records_in.reset();  // (each buffer freed once read, so dedup_bytes holds; the stream orders reuse)
  keys::ResidentChain::Unique u = chain.finish();
  out.keys = std::move(u.keys), out.values = std::move(u.values);
  out.unique = u.unique, out.records = u.records;
  return out;
}

// One batch of a score pass over `rows` rows: input 0 (`words` words a row) and input 1 (values),
// if any, on the device and, if the kernel reads them there, on the host; its tiles' partials
// folded in the tree.
std::unique_ptr<engine::Reduction> ResidentWork::score(SpaceKernel& kernel, const engine::Reduction& kind,
                                                       std::uint64_t rows, std::uint64_t tile_rows,
                                                       std::size_t partial_bytes, const Buffer& input,
                                                       std::uint32_t words, const Buffer* values,
                                                       std::uint64_t first_tile) {
  // (cuda: the host's copies, charged to the host budget while they live; cpu: the data itself)
  const std::uint64_t copies = cuda && kernel.reads_host_inputs() ? rows * words * 8 + (values ? rows * 8 : 0) : 0;
  const BudgetHold held = backend.hold_host(copies, "selected-CI score inputs on the host (resident)");
  std::vector<std::uint64_t> host_input(copies ? rows * words : 0);
  std::vector<double> host_values(copies && values ? rows : 0);
  if (copies) {
    backend.copy_to_host(host_input.data(), input.data(), rows * words * 8, stream);
    if (values) backend.copy_to_host(host_values.data(), values->data(), rows * 8, stream);
  }
  const void* host_keys = cuda ? static_cast<const void*>(host_input.data()) : input.data();
  const void* host_sums = cuda ? static_cast<const void*>(host_values.data()) : values ? values->data() : nullptr;
  const std::uint64_t tiles = (rows + tile_rows - 1) / tile_rows;
  std::vector<std::byte> partials(tiles * partial_bytes);
  if (rows) {  // (divided, a rank may hold no rows)
    Buffer scratch = take(rows * SpaceKernel::kScratchPerRow, "selected-CI score scratch (resident)");
    kernel.prepare(backend, stream);
    engine::BatchView b;
    b.rows = {0, rows};
    b.inputs = {input.data(), values ? values->data() : nullptr};
    b.host_inputs = {host_keys, host_sums};
    b.scratch = scratch.data();
    b.partials = partials.data();
    b.stream = &stream;
    kernel.process(b);
  }
  std::vector<engine::FoldNode> nodes = engine::batch_nodes(kind, first_tile, tiles, partials.data(), partial_bytes);
  engine::FoldStack fold(kind);
  if (ranks) {  // (every rank's nodes, in rank order: tile order)
    std::string mine;
    engine::append_nodes(mine, nodes);
    const comm::Received<char> all = ranks->allgatherv(comm::HostSpan<const char>(mine.data(), mine.size()));
    std::uint64_t at = 0;
    for (const std::uint64_t bytes : all.counts) {
      for (engine::FoldNode& node : engine::read_nodes(kind, std::string(all.data.data() + at, bytes), 0))
        fold.push(std::move(node));
      at += bytes;
    }
    return fold.result();
  }
  for (engine::FoldNode& node : nodes) fold.push(std::move(node));
  return fold.result();
}

std::uint64_t ResidentWork::share_tiles(ResidentUnique& u, std::uint32_t words, std::uint64_t tile_rows,
                                        bool with_values) {
  if (!ranks) return 0;
  const TileShares shares(*ranks, u.unique, tile_rows);
  const std::uint64_t me = static_cast<std::uint64_t>(ranks->rank());
  const auto taker = [this](std::uint64_t bytes) {
    return take(bytes, "selected-CI unique keys (resident, this rank's tiles)");
  };
  u.keys = shares.move(*ranks, stream, u.keys, words, taker);
  if (with_values) u.values = shares.move(*ranks, stream, u.values, 1, taker);
  u.unique = shares.to[me + 1] - shares.to[me];
  return shares.to[me] / tile_rows;
}

std::uint64_t ResidentWork::summed(std::uint64_t mine) const {
  if (!ranks) return mine;
  std::uint64_t total = 0;
  for (const std::uint64_t x : ranks->allgather(mine)) total += x;
  return total;
}

TileShares::TileShares(const comm::Communicator& ranks, std::uint64_t rows, std::uint64_t tile_rows) {
  const std::vector<std::uint64_t> each = ranks.allgather(rows);
  held.assign(each.size() + 1, 0);
  for (std::size_t r = 0; r < each.size(); ++r) held[r + 1] = held[r] + each[r];
  to.resize(held.size());
  const std::uint64_t total = held.back(), shares = each.size();  // (total * r: rows below 2^40)
  for (std::size_t r = 0; r <= shares; ++r)
    to[r] = std::min(total, (total * r / shares + tile_rows - 1) / tile_rows * tile_rows);
}

Buffer TileShares::move(comm::Communicator& ranks, Stream& stream, const Buffer& data, std::uint64_t row_words,
                        const std::function<Buffer(std::uint64_t)>& take) const {
  const auto me = static_cast<std::size_t>(ranks.rank());
  const auto overlap = [](std::uint64_t a0, std::uint64_t a1, std::uint64_t b0, std::uint64_t b1) {
    return std::max(a0, b0) < std::min(a1, b1) ? std::min(a1, b1) - std::max(a0, b0) : 0;
  };
  comm::Counts send(held.size() - 1), receive(held.size() - 1);
  for (std::size_t p = 0; p + 1 < held.size(); ++p) {
    send[p] = overlap(held[me], held[me + 1], to[p], to[p + 1]) * row_words;
    receive[p] = overlap(held[p], held[p + 1], to[me], to[me + 1]) * row_words;
  }
  const std::uint64_t rows = to[me + 1] - to[me];
  Buffer out = take(std::max<std::uint64_t>(rows, 1) * row_words * 8);
  ranks.alltoallv(
      comm::DeviceSpan<const std::uint64_t>(data.as<std::uint64_t>(), (held[me + 1] - held[me]) * row_words), send,
      comm::DeviceSpan<std::uint64_t>(out.as<std::uint64_t>(), rows * row_words), receive, stream);
  return out;
}

std::optional<Selection> SolveRun::select_on_resident_data(double eps, std::uint64_t k) {
  using clock = std::chrono::steady_clock;
  const auto seconds_since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  if (!stream_) stream_ = ctx_.backend->make_stream(false);
  ResidentWork work(*ctx_.backend, *stream_, *ctx_.comm);
  divide(work);
  const std::uint64_t space = SpaceKernel::resident_bytes(m_);
  if (phase_ == Phase::pt2_generate && ctx_.comm->root())  // (the longest unit: said when it starts)
    spdlog::info("sci.solve: final PT2{} at eps {:g} from {} determinants", named(""), eps, m_.space.dets.size());
  const auto started = clock::now();
  std::optional<ResidentWork::Generated> g =
      work.generate(*m_.problem, {&m_.space.dets, &m_.davidson->eigenvector(root_)}, eps,
                    [&](std::uint64_t rows) { return work.dedup_bytes(rows, 2) + space; },
                    [k](std::uint64_t rows) { return k ? rows * 24 : 0; });  // (the top-K's unique keys and values)
  if (!g) {
    say_through_files(phase_ == Phase::pt2_generate ? "the final PT2" : "a selection", work.room);
    return std::nullopt;
  }
  Selection out;
  out.generated = work.summed(g->rows);
  out.generate_seconds = seconds_since(started);
  if (out.generated == 0) return out;  // (no candidate passed the screening: E_PT2 0, nothing to add)
  const auto dedup_started = clock::now();
  std::optional<ResidentUnique> u = work.dedup(std::move(g->records), g->rows, 2, space);
  if (!u) {
    say_through_files(phase_ == Phase::pt2_generate ? "the final PT2" : "a selection", work.room);
    return std::nullopt;
  }
  out.unique = work.summed(u->unique);
  out.records = work.ranks ? work.ranks->allgather(u->records) : std::vector<std::uint64_t>{u->records};
  out.dedup_seconds = seconds_since(dedup_started);
  const auto score_started = clock::now();
  const std::uint64_t tile_rows = score_tile_rows(k);
  const std::uint64_t first_tile = work.share_tiles(*u, 2, tile_rows);
  ScoreKernel kernel(m_, *m_.amplitude_model, e_var_.at(root_), k, tile_rows, u->unique);
  const std::unique_ptr<engine::Reduction> folded =
      work.score(kernel, ScoreReduction(k), u->unique, tile_rows, sizeof(ScoreHeader) + k * sizeof(Scored), u->keys, 2,
                 &u->values, first_tile);
  const auto& scored = static_cast<const ScoreReduction&>(*folded);
  out.pt2 = scored.pt2();
  out.top = scored.top();
  out.score_seconds = seconds_since(score_started);
  return out;
}

// A semistochastic group's passes on resident data (its draws in sampled_): generation, its
// diagonal terms scored as they are, the rest de-duplicated by (candidate, tag) and scored; false
// when it does not fit (the passes run it).
// Once a run: a unit that would have run on resident data goes through the passes and their
// files instead (slower several times over; on the CPU backend often only for want of budget).
void SolveRun::say_through_files(const char* what, std::uint64_t room) {
  if (told_through_files_ || !ctx_.comm->root()) return;
  told_through_files_ = true;
  spdlog::info(
      "sci.solve: {}{} does not fit half of what the device budget has left ({}): it runs through the passes and "
      "their files, several times slower; a larger budget (--device-memory; on the CPU backend the memory the run "
      "may keep its data in) keeps it in memory",
      what, named(""), format_bytes(static_cast<double>(room)));
}

bool SolveRun::sampled_group_on_resident_data() {
  const auto started = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
  if (!stream_) stream_ = ctx_.backend->make_stream(false);
  ResidentWork work(*ctx_.backend, *stream_, *ctx_.comm);
  divide(work);
  StochasticPT2& st = *stochastic_;
  const std::uint64_t space = SpaceKernel::resident_bytes(m_);
  std::optional<ResidentWork::Generated> g =
      work.generate(*m_.problem, {&sampled_.dets, &sampled_.coefficients, &sampled_, *params_.eps_pt2_large}, params_.eps_pt2,
                    [&](std::uint64_t rows) { return work.dedup_bytes(rows, 3) + space; },
                    [](std::uint64_t) { return 0; });  // (summed on the device)
  if (!g) {
    say_through_files("a semistochastic group", work.room);
    return false;
  }
  const double generate_seconds = elapsed();
  const std::uint64_t generated = work.summed(g->rows), diagonal_rows = work.summed(g->diagonal_rows);
  const double energy = e_var_.at(root_);
  std::vector<double> diagonal_sums(st.count, 0.0);
  if (diagonal_rows > 0) {  // (divided: this rank's whole score tiles of them)
    ResidentUnique diagonal;
    diagonal.keys = std::move(g->diagonal), diagonal.unique = g->diagonal_rows;
    const std::uint64_t first_tile = work.share_tiles(diagonal, 4, kScoreTileMin, false);
    SampledScoreKernel kernel(m_, energy, st.first, st.count, kScoreTileMin, true, diagonal.unique);
    const auto folded = work.score(kernel, engine::ElementwiseSums(st.count), diagonal.unique, kScoreTileMin,
                                   st.count * 8, diagonal.keys, 4, nullptr, first_tile);
    diagonal_sums = static_cast<const engine::ElementwiseSums&>(*folded).sums();
  }
  g->diagonal.reset();
  const double diagonal_seconds = elapsed();
  std::vector<double> sums(st.count, 0.0);
  double dedup_seconds = diagonal_seconds;
  std::uint64_t unique = 0;
  if (generated > 0) {
    std::optional<ResidentUnique> u = work.dedup(std::move(g->records), g->rows, 3, space);
    if (!u) {  // (divided, and a rank's bucket would not fit: the passes run the group, nothing kept)
      say_through_files("a semistochastic group", work.room);
      return false;
    }
    dedup_seconds = elapsed();
    unique = work.summed(u->unique);
    const std::uint64_t first_tile = work.share_tiles(*u, 3, kScoreTileMin);
    SampledScoreKernel kernel(m_, energy, st.first, st.count, kScoreTileMin, false, u->unique);
    const auto folded = work.score(kernel, engine::ElementwiseSums(st.count), u->unique, kScoreTileMin, st.count * 8,
                                   u->keys, 3, &u->values, first_tile);
    sums = static_cast<const engine::ElementwiseSums&>(*folded).sums();
  }
  st.generated += generated + diagonal_rows;
  st.diagonal_rows = diagonal_rows;
  st.diagonal_sums = std::move(diagonal_sums);
  st.unique += unique;
  const double seconds = elapsed();
  account("pt2", seconds);
  if (ctx_.comm->root())
    spdlog::debug(
        "sci.solve: semistochastic batches {}-{}{} on resident data: {} candidates and {} diagonal terms from {} "
        "determinants, {} unique ({:.2f} s: generate {:.2f}, diagonal terms {:.2f}, dedup {:.2f}, score {:.2f})",
        st.first, st.first + st.count - 1, named(""), generated, diagonal_rows, sampled_.dets.size(), unique, seconds,
        generate_seconds, diagonal_seconds - generate_seconds, dedup_seconds - diagonal_seconds,
        seconds - dedup_seconds);
  end_group(sums);
  return true;
}

void SolveRun::selected(Selection s) {
  const bool pt2 = phase_ == Phase::pt2_generate;
  Iteration& now = this->now();
  if (pt2) {  // (a final PT2's seconds are all "pt2", its de-duplication's also "pt2_dedup")
    account("pt2", s.generate_seconds + s.dedup_seconds + s.score_seconds);
    now.seconds["pt2_dedup"] += s.dedup_seconds;
  } else {
    account("generate", s.generate_seconds);
    account("dedup", s.dedup_seconds);
    account("score", s.score_seconds);
  }
  (pt2 ? now.pt2_generated : now.generated) += s.generated;
  (pt2 ? now.pt2_unique : now.unique) += s.unique;
  if (root_ == 0 && s.generated > 0) (pt2 ? now.pt2_merge_records_per_rank : now.merge_records_per_rank) = s.records;
  if (ctx_.comm->root())
    spdlog::info(
        "sci.solve iteration {}{}: {} on resident data{}: {} candidates, {} unique ({:.2f} s: generate {:.2f}, dedup "
        "{:.2f}, score {:.2f})",
        iteration_, named(""), pt2 ? "final PT2" : "selection",
        s.records.size() > 1 ? fmt::format(" (divided between {} ranks)", s.records.size()) : "", s.generated, s.unique,
        s.generate_seconds + s.dedup_seconds + s.score_seconds, s.generate_seconds, s.dedup_seconds, s.score_seconds);
  if (pt2) return deterministic_pt2_done(s.pt2);
  root_selected(s.pt2, std::move(s.top));
}

bool SolveRun::next_root(Phase first) {
  dedup_.reset();
  if (root_ + 1 >= roots()) return false;
  root_ += 1;
  phase_ = first;
  return true;
}

void SolveRun::root_selected(double pt2, std::vector<Scored> top) {
  root_pt2_.push_back(pt2);
  root_top_.push_back(std::move(top));
  if (!next_root(Phase::generate)) finish_iteration();
}

void SolveRun::root_pt2_done(double pt2) {
  final_pt2_.push_back(pt2);
  if (stochastic_) {
    stochastic_roots_.push_back(std::move(*stochastic_));
    stochastic_.reset();
  }
  if (!next_root(Phase::pt2_generate)) end_point();
}

void SolveRun::deterministic_pt2_done(double pt2) {
  if (!params_.semistochastic()) return root_pt2_done(pt2);
  stochastic_.emplace();
  stochastic_->deterministic = pt2;
  if (ctx_.comm->root())
    spdlog::info("sci.solve: semistochastic PT2{}: deterministic part at eps_pt2_large {:g}: {:.10f}; the stochastic part at "
                 "eps_pt2 {:g}, {} draws a batch", named(""), *params_.eps_pt2_large, pt2, params_.eps_pt2, params_.pt2_samples);
  start_group();
}

// The next group of batches of the stochastic part: its draws, then its passes. (The error bar
// falls as 1/sqrt(n): n batches with error e reach the target t at n (e/t)^2. The estimates are
// the same bits on every rank, backend and resume, so is every group's size.)
void SolveRun::start_group() {
  StochasticPT2& st = *stochastic_;
  st.first = st.estimates.size();
  std::uint64_t count = kBatchesPerGroup;
  const double error = st.error(), target = params_.pt2_target_error;
  if (st.first >= kBatchesPerGroup && target > 0 && error > target) {
    const double needed =
        std::ceil(static_cast<double>(st.first) * (error / target) * (error / target)) - static_cast<double>(st.first);
    count = static_cast<std::uint64_t>(
        std::clamp(needed, static_cast<double>(kFewestBatchesPerGroup), static_cast<double>(kBatchesPerGroup)));
  }
  st.count = std::min<std::uint64_t>(count, params_.pt2_batches - st.first);
  sampled_ = sample_sources(m_.space.dets, m_.davidson->eigenvector(root_), pt2_seed(root_), st.first, st.count,
                            params_.pt2_samples);
  dedup_.reset();
  phase_ = Phase::sampled_generate;
}

// The group's candidates (its diagonal terms scored) to de-duplicate, if any.
void SolveRun::dedup_group() {
  if (generated_rows_ == 0) return end_group(std::vector<double>(stochastic_->count, 0.0));
  phase_ = Phase::sampled_dedup;
  dedup_.emplace(ctx_, dedup_source());
}

// A group's per-batch sums (its candidates', then its diagonal terms') become its batches'
// estimates; the PT2 is done once the error bar is below pt2_target_error (two batches at least)
// or pt2_batches are done.
void SolveRun::end_group(const std::vector<double>& sums) {
  StochasticPT2& st = *stochastic_;
  const auto n = static_cast<double>(params_.pt2_samples);
  for (std::size_t b = 0; b < sums.size(); ++b)
    st.estimates.push_back(st.deterministic + (sums[b] + st.diagonal_sums.at(b)) / (n * (n - 1)));
  dedup_.reset();
  const bool met = st.estimates.size() >= 2 && st.error() < params_.pt2_target_error;
  if (ctx_.comm->root())
    spdlog::info("sci.solve: semistochastic PT2{}, {} batches: E_PT2 {:.10f} +- {:.2e}", named(""), st.estimates.size(),
                 st.mean(), st.error());
  if (!met && st.estimates.size() < params_.pt2_batches) return start_group();
  if (!met && ctx_.comm->root())
    spdlog::warn("sci.solve: semistochastic PT2{}: its error bar {:.2e} is above pt2_target_error {:.2e} after pt2_batches = {} "
                 "batches; raise pt2_batches or pt2_samples for a tighter one", named(""), st.error(), params_.pt2_target_error,
                 st.estimates.size());
  root_pt2_done(st.mean());
}

void SolveRun::account(const std::string& phase, double seconds) {
  Iteration& now = this->now();
  now.seconds[phase] += seconds;
  if (phase_ == Phase::pt2_dedup) now.seconds["pt2_dedup"] += seconds;  // (also inside "pt2")
  // The iteration's peak memory, the largest over ranks (every rank runs this).
  const auto peaks = ctx_.comm->max({static_cast<std::int64_t>(ctx_.backend->device_budget().take_interval_peak()),
                                     static_cast<std::int64_t>(ctx_.backend->host_budget().take_interval_peak())});
  now.peak_device_bytes = std::max(now.peak_device_bytes, peaks[0]);
  now.peak_host_bytes = std::max(now.peak_host_bytes, peaks[1]);
}

// One Davidson product H x on the iteration's resident space: this rank's share of the rows on
// the backend, every rank's gathered on all (each row's value does not depend on who computes
// it: the same bits on any rank count), then Davidson's step. (With the first product comes H's
// diagonal, Davidson's preconditioner.)
void SolveRun::product() {
  const auto started = std::chrono::steady_clock::now();
  Backend& backend = *ctx_.backend;
  const std::uint64_t n = m_.space.dets.size();
  const auto ranks = static_cast<std::uint64_t>(ctx_.comm->size()), rank = static_cast<std::uint64_t>(ctx_.comm->rank());
  const std::uint64_t first = n * rank / ranks, rows = n * (rank + 1) / ranks - first;
  if (!stream_) stream_ = backend.make_stream(false);
  if (ranks > 1 && !ranks_) ranks_.emplace(*ctx_.comm, ctx_.backend);
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  if (!m_.resident) {
    davidson_seconds_ = {};
    make_resident_space();
    davidson_seconds_.build = since(started);
    davidson_seconds_.placed = m_.davidson->place(backend, *stream_);  // (after H: storing H saves more than placing the vectors)
    if (!m_.davidson->on_backend()) m_.x = backend.alloc_device(std::max<std::uint64_t>(n, 1) * 8, "selected-CI Davidson vector");
    if (!m_.davidson->on_backend() || ranks > 1)
      m_.sigma = backend.alloc_device(std::max<std::uint64_t>(rows, 1) * 8, "selected-CI Davidson product");
    m_.diagonal = backend.alloc_device(std::max<std::uint64_t>(rows, 1) * 8, "selected-CI Davidson diagonal");
  }
  const auto device_started = std::chrono::steady_clock::now();
  // (with the vectors on the backend and one rank, the products are written where Davidson reads
  // them, those of every vector waiting for one at once: H is read once for them)
  const bool in_place = m_.davidson->on_backend() && ranks == 1;
  const int vectors = in_place ? std::min(m_.davidson->pending(), kernels::kSciSigmaVectors) : 1;
  const double* x = m_.davidson->next().data();
  if (!m_.davidson->on_backend()) {
    backend.copy_to_device(m_.x.data(), x, n * 8, *stream_);
    x = m_.x.as<double>();
  }
  double* product = in_place ? m_.davidson->product_slot() : m_.sigma.as<double>();
  m_.resident->sigma(*stream_, x, first, rows, product, m_.diagonal.as<double>(), vectors);
  const bool first_product = m_.davidson->products() == 0;
  std::vector<double> sigma(in_place ? 0 : rows), diagonal(first_product ? rows : 0);
  if (!in_place) backend.copy_to_host(sigma.data(), product, rows * 8, *stream_);
  if (first_product) backend.copy_to_host(diagonal.data(), m_.diagonal.data(), rows * 8, *stream_);
  stream_->synchronize();
  auto everyone = [&](std::vector<double>& mine) {
    if (ranks_) mine = ranks_->allgatherv(comm::HostSpan<const double>(mine.data(), mine.size())).data;
  };
  if (!in_place) everyone(sigma);
  if (first_product) {
    everyone(diagonal);
    m_.davidson->set_diagonal(std::move(diagonal));
  }
  const auto arithmetic_started = std::chrono::steady_clock::now();
  davidson_seconds_.device += std::chrono::duration<double>(arithmetic_started - device_started).count();
  if (in_place) m_.davidson->take_in_place(vectors);
  else m_.davidson->take(sigma);
  davidson_seconds_.arithmetic += since(arithmetic_started);
  account("davidson", since(started));
  if (!m_.davidson->done()) return;
  Iteration& now = this->now();
  e_var_.clear();
  for (int r = 0; r < roots(); ++r) e_var_.push_back(m_.davidson->eigenvalue(r));
  now.e_var = e_var_.front();
  now.e_var_roots = e_var_;
  now.davidson_products = static_cast<std::uint64_t>(m_.davidson->products());
  phase_ = Phase::generate;
  root_ = 0;
  release_resident_space();
  if (ctx_.comm->root()) {
    std::string energies = fmt::format("{:.10f}", e_var_.front());
    for (std::size_t r = 1; r < e_var_.size(); ++r) energies += fmt::format(", {:.10f}", e_var_[r]);
    spdlog::info("sci.solve iteration {}: {} determinants, E_var {} ({} products)", iteration_, m_.space.dets.size(),
                 energies, m_.davidson->products());
    spdlog::debug("sci.solve iteration {}: Davidson {:.3f} s: H stored {:.3f} s, products and their copies {:.3f} s, its "
                  "arithmetic {:.3f} s (vectors on the {})", iteration_,
                  davidson_seconds_.build + davidson_seconds_.device + davidson_seconds_.arithmetic, davidson_seconds_.build,
                  davidson_seconds_.device, davidson_seconds_.arithmetic, davidson_seconds_.placed ? "backend" : "host");
  }
  if (!m_.davidson->converged() && ctx_.comm->root()) {
    double residual = 0;
    for (int r = 0; r < roots(); ++r) residual = std::max(residual, m_.davidson->residual_norm(r));
    spdlog::warn("sci.solve iteration {}: Davidson stopped after {} products with a residual of {:.2e} (davidson_tolerance "
                 "{:.1e}): E_var may be off by about its square", iteration_, m_.davidson->products(), residual,
                 params_.davidson_tolerance);
  }
}

// The iteration's resident space for its Davidson products: H within the space is stored when
// it takes at most half of the device memory the budget has left (the passes' buffers, and the
// generation after Davidson, need the rest); otherwise products enumerate.
void SolveRun::make_resident_space() {
  // (idle pooled memory counts as free: the pool gives it up to make room)
  MemoryBudget& budget = ctx_.backend->device_budget();
  const std::uint64_t left = budget.left();
  const Problem& p = *m_.problem;
  m_.resident = std::make_unique<sci::ResidentSpace>(*ctx_.backend, p.ints, p.tables, p.na, p.nb, m_.space.dets, left / 2,
                                                     std::move(m_.grown_from));
  const sci::ResidentSpace& r = *m_.resident;
  if (ctx_.comm->root())
    spdlog::info("sci.solve iteration {}: {} ({} determinants, {:.2f} s)", iteration_,
                 r.stored() ? fmt::format("H within the space stored {}, {} entries, {}{}",
                                          ctx_.backend->kind() == BackendKind::cpu ? "in host memory"
                                          : r.rows_found_on_host() ? "on the device (rows found on the host)"
                                                                   : "on the device (rows found by enumeration)",
                                          r.entries(), format_bytes(static_cast<double>(r.bytes())),
                                          r.grown() ? fmt::format(", grown from the last iteration's by {} determinants{}",
                                                                  r.grown_by(), r.inserted() ? " (inserted)" : "")
                                                    : "")
                            : std::string("H within the space does not fit half the device budget left; "
                                          "each product enumerates"),
                 m_.space.dets.size(), r.build_seconds());
}

// Ends iteration k: history, convergence, and (unless converged) the next space: the roots' best
// candidates merged (the largest |amplitude| first, each determinant once), up to max_new_dets.
void SolveRun::finish_iteration() {
  Iteration& now = this->now();
  std::vector<std::vector<Scored>> tops = std::move(root_top_);
  now.dets = m_.space.dets.size();
  now.e_pt2_roots = std::move(root_pt2_);
  now.e_pt2 = now.e_pt2_roots.front();
  root_top_.clear(), root_pt2_.clear();
  const int k = iteration_;
  // The candidates to add: one root's list as it is (sorted, each determinant once), or the
  // roots' merged, a determinant where it scores best.
  std::vector<Scored> top = std::move(tops.front());
  if (tops.size() > 1) {
    for (std::size_t r = 1; r < tops.size(); ++r) top.insert(top.end(), tops[r].begin(), tops[r].end());
    std::sort(top.begin(), top.end(), better);
    std::set<Det> seen;  // (a determinant's entries are apart in that order: keep its first, best)
    std::vector<Scored> unique;
    for (const Scored& c : top)
      if (unique.size() < params_.max_new_dets && seen.insert(Det{c.alpha, c.beta}).second) unique.push_back(c);
    top = std::move(unique);
  }
  now.selected = top.size();
  std::string reason;
  // (within the schedule's point: its first iteration is the space the one before converged to;
  // every root's E_var must settle, and the roots be all there are to find)
  const auto settled = [&] {
    if (k <= point_first_iteration_) return false;
    const Iteration& before = history_[static_cast<std::size_t>(k - 1)];
    if (before.e_var_roots.size() != now.e_var_roots.size()) return false;
    for (std::size_t r = 0; r < now.e_var_roots.size(); ++r)
      if (!(std::fabs(now.e_var_roots[r] - before.e_var_roots[r]) < params_.energy_tolerance)) return false;
    return true;
  };
  if (settled()) reason = "energy converged";
  else if (top.empty()) reason = "no new determinant";
  else if (m_.space.dets.size() >= params_.max_dets) reason = "max_dets reached";
  else if (k + 1 - point_first_iteration_ >= params_.max_iterations) reason = "max_iterations reached";
  if (!reason.empty()) {
    stop_reason_ = reason;
    converged_ = reason == "energy converged" || reason == "no new determinant";
    dedup_.reset();
    m_.grown_from.reset();
    if (ctx_.comm->root()) spdlog::info("sci.solve: {} after iteration {} (eps_var {:g})", reason, k, eps_var());
    if (roots() < params_.nroots && ctx_.comm->root())
      spdlog::warn("sci.solve: the space has {} determinants: {} of nroots = {} roots found", m_.space.dets.size(), roots(),
                   params_.nroots);
    root_ = 0;
    if (params_.eps_pt2 < eps_var()) phase_ = Phase::pt2_generate;
    else end_point();
    return;
  }
  // S_{k+1}: S_k (its coefficients as the start) and the selected (their first-order amplitudes;
  // a root that did not list a determinant starts at 0 there).
  const std::size_t known = static_cast<std::size_t>(roots());
  std::vector<std::pair<Det, std::size_t>> all;  // (a determinant, and its place: < n in S_k, else in top)
  const std::size_t n = m_.space.dets.size();
  all.reserve(n + top.size());
  for (std::size_t i = 0; i < n; ++i) all.push_back({m_.space.dets[i], i});
  std::uint64_t room = params_.max_dets - std::min<std::uint64_t>(params_.max_dets, n);
  for (std::size_t t = 0; t < top.size() && room > 0; ++t, --room) all.push_back({Det{top[t].alpha, top[t].beta}, n + t});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Each root's amplitude of each selected determinant (its own list's).
  std::vector<std::map<Det, double>> amplitudes(known);
  if (known > 1)
    for (std::size_t r = 0; r < known; ++r)
      for (const Scored& c : tops[r]) amplitudes[r].emplace(Det{c.alpha, c.beta}, c.amplitude);
  Space next;
  next.guesses.assign(known, {});
  for (const auto& [det, place] : all) {
    next.dets.push_back(det);
    for (std::size_t r = 0; r < known; ++r) {
      double start = 0;
      if (place < n) start = m_.davidson->eigenvector(static_cast<int>(r))[place];
      else if (known == 1) start = top[place - n].amplitude;
      else if (const auto it = amplitudes[r].find(det); it != amplitudes[r].end()) start = it->second;
      next.guesses[r].push_back(start);
    }
    next.joined.push_back(place < n ? m_.space.joined[place] : k + 1);
  }
  // (written before the state that names it is committed: a resumed run reads it from there)
  if (ctx_.comm->root()) fsutil::write_file_atomic(space_file(ctx_, k + 1), encode(next));
  ctx_.comm->barrier();
  iteration_ = k + 1;
  phase_ = Phase::davidson;
  dedup_.reset();
  begin_iteration(std::move(next));
}

// A point of the schedule is done: recorded, then the next one starts from this space (its
// coefficients as Davidson's start), or the run's work is done.
void SolveRun::end_point() {
  const Iteration& last = history_.back();
  SchedulePoint point{eps_var(), last.e_var, std::nan(""), 0.0, m_.space.dets.size(), iteration_, last.e_var_roots, {}, {}};
  for (int r = 0; r < roots(); ++r) {
    const bool has_pt2 = static_cast<std::size_t>(r) < final_pt2_.size();
    point.e_pt2_roots.push_back(has_pt2 ? final_pt2_[static_cast<std::size_t>(r)] : std::nan(""));
    point.e_pt2_error_roots.push_back(final_e_pt2_error(r));
  }
  point.e_pt2 = point.e_pt2_roots.front();
  point.e_pt2_error = point.e_pt2_error_roots.front();
  points_.push_back(point);
  if (ctx_.comm->root() && params_.eps_schedule.size() > 1)
    for (int r = 0; r < roots(); ++r) {
      const auto i = static_cast<std::size_t>(r);
      spdlog::info("sci.solve: eps_var {:g} done{}: {} determinants, E_var {:.10f}{}", eps_var(),
                   params_.nroots > 1 ? fmt::format(" (root {})", r) : "", last.dets, point.e_var_roots[i],
                   i < final_pt2_.size()
                       ? fmt::format(", E_PT2 {:.10f}{}, total {:.10f}", final_pt2_[i],
                                     params_.semistochastic() ? fmt::format(" +- {:.2e}", point.e_pt2_error_roots[i]) : "",
                                     point.e_var_roots[i] + final_pt2_[i])
                       : "");
    }
  if (static_cast<std::size_t>(point_ + 1) >= params_.eps_schedule.size()) {
    phase_ = Phase::done;
    return;
  }
  Space next{m_.space.dets, {}, m_.space.joined};
  for (int r = 0; r < roots(); ++r) next.guesses.push_back(m_.davidson->eigenvector(r));
  const int k = iteration_;
  if (ctx_.comm->root()) fsutil::write_file_atomic(space_file(ctx_, k + 1), encode(next));
  ctx_.comm->barrier();
  point_ += 1;
  point_first_iteration_ = k + 1;
  final_pt2_.clear();
  stochastic_.reset();
  stochastic_roots_.clear();
  stop_reason_.clear();
  converged_ = false;
  iteration_ = k + 1;
  phase_ = Phase::davidson;
  dedup_.reset();
  begin_iteration(std::move(next));
}

std::string SolveRun::save() const {
  Packer out;
  out.put(phase_), out.put(iteration_);
  m_.davidson->save(out);
  out.put_vector(e_var_), out.put(generated_pass_), out.put(generated_rows_);
  out.put(root_), out.put_vector(root_pt2_);
  out.put<std::uint64_t>(root_top_.size());
  for (const auto& top : root_top_) out.put_vector(top);
  out.put<std::uint8_t>(dedup_.has_value());
  if (dedup_) dedup_->save(out);
  out.put<std::uint64_t>(history_.size());
  for (const Iteration& h : history_) h.put(out);
  out.put_vector(final_pt2_);
  out.put_string(stop_reason_);
  out.put<std::uint8_t>(converged_);
  out.put(point_), out.put(point_first_iteration_);
  out.put<std::uint64_t>(points_.size());
  for (const SchedulePoint& p : points_) p.put(out);
  out.put<std::uint8_t>(stochastic_.has_value());
  if (stochastic_) stochastic_->put(out);
  out.put<std::uint64_t>(stochastic_roots_.size());
  for (const StochasticPT2& st : stochastic_roots_) st.put(out);
  return out.take();
}

void SolveRun::load(std::string_view state) {
  Unpacker in(state);
  phase_ = in.get<Phase>();
  if (phase_ > Phase::done) throw std::runtime_error("a saved state of another layout");
  iteration_ = in.get<int>();
  // The memory of that state: iteration k's space (written before the state naming it) and
  // Davidson's state.
  if (iteration_ > 0) {
    const fs::path f = space_file(ctx_, iteration_);
    begin_iteration(decode(fsutil::read_file(f), f));
  } else {
    begin_iteration(initial_space(ctx_, *m_.problem));
  }
  m_.davidson->load(in);
  e_var_ = in.get_vector<double>(), generated_pass_ = in.get<int>(), generated_rows_ = in.get<std::uint64_t>();
  root_ = in.get<int>(), root_pt2_ = in.get_vector<double>();
  root_top_.resize(in.get<std::uint64_t>());
  for (auto& top : root_top_) top = in.get_vector<Scored>();
  if (root_ < 0 || root_ >= roots()) throw std::runtime_error("a saved state of another nroots");
  dedup_.reset();
  if (in.get<std::uint8_t>()) {
    dedup_.emplace(ctx_, dedup_source());
    dedup_->load(in);
  }
  history_.resize(in.get<std::uint64_t>());
  for (Iteration& h : history_) h.get(in);
  final_pt2_ = in.get_vector<double>();
  stop_reason_ = in.get_string();
  converged_ = in.get<std::uint8_t>() != 0;
  point_ = in.get<int>(), point_first_iteration_ = in.get<int>();
  if (point_ < 0 || static_cast<std::size_t>(point_) >= params_.eps_schedule.size())
    throw std::runtime_error("a saved state of another eps_var schedule");
  points_.resize(in.get<std::uint64_t>());
  for (SchedulePoint& p : points_) p.get(in);
  stochastic_.reset();
  if (in.get<std::uint8_t>()) stochastic_.emplace().get(in);
  stochastic_roots_.resize(in.get<std::uint64_t>());
  for (StochasticPT2& st : stochastic_roots_) st.get(in);
  in.finish();
  if (sampled(phase_)) {  // (the group's draws, as start_group() drew them)
    if (!stochastic_) throw std::runtime_error("a saved state of another layout");
    sampled_ = sample_sources(m_.space.dets, m_.davidson->eigenvector(root_), pt2_seed(root_), stochastic_->first,
                              stochastic_->count, params_.pt2_samples);
  }
}

// Dataset `name`: (rows, roots) from each row's vector of the roots' values, NaN where a row has
// fewer roots (an early iteration whose space was smaller than nroots).
template <typename Row>
void write_root_columns(h5::File& out, const char* name, const std::vector<Row>& rows, std::vector<double> Row::*field,
                        std::size_t roots, const char* doc) {
  std::vector<double> v(rows.size() * roots, std::nan(""));
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t r = 0; r < std::min(roots, (rows[i].*field).size()); ++r) v[i * roots + r] = (rows[i].*field)[r];
  detail::write_array(out, name, h5::DType::float64, {rows.size(), roots}, v.data(), doc);
}

// The state's five largest coefficients and their determinants, one a line.
std::string leading_determinants(const std::vector<double>& c, const std::vector<Det>& dets, int norb) {
  std::vector<std::size_t> order(c.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const std::size_t shown = std::min<std::size_t>(5, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(), [&](std::size_t a, std::size_t b) {
    return std::fabs(c[a]) > std::fabs(c[b]) || (std::fabs(c[a]) == std::fabs(c[b]) && a < b);
  });
  std::string leading;
  for (std::size_t i = 0; i < shown; ++i)
    leading += fmt::format("{}{:+.6f} {}", i ? "\n" : "", c[order[i]], sci::describe(dets[order[i]], norb));
  return leading;
}

void SolveRun::write(const StagePlan&, const StepPass&, h5::File& out) const {
  const std::vector<Iteration>& hist = history_;
  const auto found = static_cast<std::size_t>(roots());
  // One value per iteration from the history.
  auto column = [&](const char* key, h5::DType type, auto field, const char* doc) {
    detail::write_column(out, "iterations", hist, key, type, field, doc);
  };
  column("dets", h5::DType::uint64, &Iteration::dets, "determinants in the variational space of each iteration");
  column("e_var", h5::DType::float64, &Iteration::e_var, "variational energy (Ha) of each iteration's space");
  column("e_pt2", h5::DType::float64, &Iteration::e_pt2, "Epstein-Nesbet PT2 (Ha) over the candidates generated at eps_var");
  column("generated", h5::DType::uint64, &Iteration::generated, "candidates generated (|H_ai c_i| > eps_var), duplicates included");
  column("unique", h5::DType::uint64, &Iteration::unique, "unique candidates after de-duplication");
  column("selected", h5::DType::uint64, &Iteration::selected, "candidates added to the space");
  column("davidson_products", h5::DType::uint64, &Iteration::davidson_products, "H x products Davidson took");
  if (params_.nroots > 1) {
    write_root_columns(out, "iterations/e_var_roots", hist, &Iteration::e_var_roots, found,
                       "(iterations, roots): each root's E_var (Ha), the lowest first (NaN: the space had fewer determinants)");
    write_root_columns(out, "iterations/e_pt2_roots", hist, &Iteration::e_pt2_roots, found,
                       "(iterations, roots): each root's EN-PT2 (Ha) over its candidates at eps_var");
  }
  // The eps_var schedule's points and the extrapolation over them (a schedule of two or more).
  if (params_.eps_schedule.size() > 1) {
    auto point_column = [&](const char* key, h5::DType type, auto field, const char* doc) {
      detail::write_column(out, "schedule", points_, key, type, field, doc);
    };
    point_column("eps_var", h5::DType::float64, &SchedulePoint::eps_var, "the schedule's thresholds, in the order run");
    point_column("e_var", h5::DType::float64, &SchedulePoint::e_var, "E_var (Ha) converged at each threshold");
    point_column("e_pt2", h5::DType::float64, &SchedulePoint::e_pt2,
                 "E_PT2 (Ha) at eps_pt2 from each threshold's space (NaN: no PT2, eps_pt2 >= that eps_var)");
    if (params_.semistochastic())
      point_column("e_pt2_error", h5::DType::float64, &SchedulePoint::e_pt2_error, "each semistochastic E_PT2's error bar (Ha)");
    point_column("dets", h5::DType::uint64, &SchedulePoint::dets, "determinants at each threshold");
    point_column("iteration", h5::DType::int32, &SchedulePoint::iteration, "each threshold's last iteration");
    if (params_.nroots > 1) {
      write_root_columns(out, "schedule/e_var_roots", points_, &SchedulePoint::e_var_roots, found,
                         "(thresholds, roots): each root's E_var (Ha) converged at each threshold");
      write_root_columns(out, "schedule/e_pt2_roots", points_, &SchedulePoint::e_pt2_roots, found,
                         "(thresholds, roots): each root's E_PT2 (Ha) at eps_pt2 (NaN: no PT2)");
      std::vector<double> extrapolated(found, std::nan(""));
      for (std::size_t r = 0; r < found; ++r)
        if (const auto x = extrapolate(points_, r)) extrapolated[r] = x->energy;
      detail::write_array(out, "roots/e_extrapolated", h5::DType::float64, {found}, extrapolated.data(),
                          "each root's E_var extrapolated linearly against its E_PT2 to E_PT2 = 0 over the schedule (Ha; NaN: "
                          "fewer than two thresholds with a PT2)");
    }
    if (const auto x = extrapolate(points_)) {
      out.set_attribute("e_extrapolated", x->energy);
      out.set_attribute("extrapolation_slope", x->slope);
      out.set_attribute("extrapolation_points", static_cast<std::int64_t>(x->points));
    }
  }
  const Iteration& last = hist.back();
  const double e_var = last.e_var;
  const double e_pt2 = final_e_pt2();
  detail::write_scalar(out, "energy", h5::DType::float64, &e_var, "final variational energy E_var (Ha)");
  detail::write_scalar(out, "e_pt2", h5::DType::float64, &e_pt2, "final Epstein-Nesbet PT2 correction (Ha)");
  const double total = e_var + e_pt2;
  detail::write_scalar(out, "e_total", h5::DType::float64, &total, "E_var + E_PT2 (Ha)");
  // The final PT2's candidates (at eps_pt2; 0 when it did not run): the largest set a run streams.
  detail::write_scalar(out, "pt2_generated", h5::DType::uint64, &last.pt2_generated,
                       "candidates the final PT2 generated at eps_pt2, duplicates included (0: no final PT2)");
  detail::write_scalar(out, "pt2_unique", h5::DType::uint64, &last.pt2_unique, "unique candidates of the final PT2");
  // A semistochastic PT2: its error bar, its parts and every batch's estimate.
  if (!stochastic_roots_.empty()) {  // (the lowest root's; roots/e_pt2_error has every root's error bar)
    const StochasticPT2& st = stochastic_roots_.front();
    const double error = st.error();
    detail::write_scalar(out, "e_pt2_error", h5::DType::float64, &error,
                         "the semistochastic E_PT2's error bar (Ha): the standard error of the mean over its batches "
                         "(also e_total's)");
    detail::write_scalar(out, "pt2_stochastic/deterministic_e_pt2", h5::DType::float64, &st.deterministic,
                         "the deterministic part: E_PT2 at eps_pt2_large (Ha)");
    detail::write_array(out, "pt2_stochastic/batch_e_pt2", h5::DType::float64, {st.estimates.size()}, st.estimates.data(),
                        "each batch's estimate of E_PT2 (Ha): the deterministic part plus that batch's unbiased estimate of "
                        "E_PT2(eps_pt2) - E_PT2(eps_pt2_large); e_pt2 is their mean");
    detail::write_scalar(out, "pt2_stochastic/generated", h5::DType::uint64, &st.generated,
                         "the stochastic part's records (two a candidate generated from a sampled determinant)");
    detail::write_scalar(out, "pt2_stochastic/unique", h5::DType::uint64, &st.unique,
                         "the stochastic part's unique (candidate, batch, kind) records, over its groups");
    out.set_attribute("pt2_samples", static_cast<std::int64_t>(params_.pt2_samples));
    out.set_attribute("pt2_seed", static_cast<std::int64_t>(params_.pt2_seed));
    out.set_attribute("eps_pt2_large", *params_.eps_pt2_large);
    out.set_attribute("pt2_target_met", static_cast<std::int64_t>(st.estimates.size() >= 2 && error < params_.pt2_target_error));
  }
  detail::write_array(out, "joined_iteration", h5::DType::int32, {m_.space.joined.size()}, m_.space.joined.data(),
                      "iteration each determinant joined the space (dets[joined <= k] is iteration k's space)");
  // Which state this is: its irrep and spin, where it started, and its largest determinants.
  const sci::TargetState& t = m_.problem->target;
  out.set_attribute("irrep", static_cast<std::int64_t>(t.irrep));
  out.set_attribute("irrep_from", t.irrep_from);
  out.set_attribute("ms2", static_cast<std::int64_t>(t.ms2));
  out.set_attribute("s_squared", s_squared_.front());
  out.set_attribute("reference_determinant", sci::describe(t.reference, m_.problem->ints.norb));
  out.set_attribute("reference_diagonal", t.reference_diagonal);
  if (t.lower_elsewhere)
    out.set_attribute("warning", fmt::format("a determinant of irrep {} ({}) has a lower diagonal ({:.10f}) than this "
                                             "state's reference: the lowest state may be of another irrep",
                                             t.lower_elsewhere_irrep, sci::describe(*t.lower_elsewhere, m_.problem->ints.norb),
                                             t.lower_elsewhere_diagonal));
  const int norb = m_.problem->ints.norb;
  out.set_attribute("leading_determinants", leading_determinants(m_.davidson->eigenvector(), m_.space.dets, norb));
  // Several roots: each one's energies and state (the scalars above are the lowest's).
  if (params_.nroots > 1) {
    std::vector<double> e_vars, e_pt2s, totals, errors, coefficients;
    for (std::size_t r = 0; r < found; ++r) {
      const int root = static_cast<int>(r);
      e_vars.push_back(m_.davidson->eigenvalue(root));
      e_pt2s.push_back(final_e_pt2(root));
      totals.push_back(e_vars.back() + e_pt2s.back());
      errors.push_back(final_e_pt2_error(root));
      const auto& c = m_.davidson->eigenvector(root);
      coefficients.insert(coefficients.end(), c.begin(), c.end());
    }
    detail::write_array(out, "roots/energy", h5::DType::float64, {found}, e_vars.data(),
                        "each root's E_var (Ha), the lowest first (roots found: nroots, or the space's size if smaller)");
    detail::write_array(out, "roots/e_pt2", h5::DType::float64, {found}, e_pt2s.data(), "each root's EN-PT2 (Ha)");
    detail::write_array(out, "roots/e_total", h5::DType::float64, {found}, totals.data(), "each root's E_var + E_PT2 (Ha)");
    if (params_.semistochastic() && !stochastic_roots_.empty())
      detail::write_array(out, "roots/e_pt2_error", h5::DType::float64, {found}, errors.data(),
                          "each root's semistochastic E_PT2 error bar (Ha)");
    detail::write_array(out, "roots/s_squared", h5::DType::float64, {found}, s_squared_.data(), "each root's <S^2>");
    h5::Dataset c = detail::write_array(out, "roots/coefficients", h5::DType::float64, {found, m_.space.dets.size()},
                                        coefficients.data(), "(roots, determinants): each root's coefficients over /dets");
    for (std::size_t r = 0; r < found; ++r)
      c.set_attribute(fmt::format("leading_determinants_{}", r),
                      leading_determinants(m_.davidson->eigenvector(static_cast<int>(r)), m_.space.dets, norb));
    out.set_attribute("nroots", static_cast<std::int64_t>(params_.nroots));
  }
  out.set_attribute("converged", static_cast<std::int64_t>(converged_));
  out.set_attribute("stop_reason", stop_reason_);
  if (params_.reference_energy) out.set_attribute("reference_energy", *params_.reference_energy);
  // Seconds per phase and peak memory per iteration, as attributes (they differ between runs;
  // the datasets do not).
  std::vector<std::uint64_t> device_peaks, host_peaks;
  for (std::size_t k = 0; k < hist.size(); ++k) {
    for (const auto& [phase, s] : hist[k].seconds) out.set_attribute(fmt::format("seconds_{}_{}", k, phase), s);
    device_peaks.push_back(static_cast<std::uint64_t>(hist[k].peak_device_bytes));
    host_peaks.push_back(static_cast<std::uint64_t>(hist[k].peak_host_bytes));
  }
  out.set_attribute("peak_device_bytes", device_peaks);
  out.set_attribute("peak_host_bytes", host_peaks);
  // The dedup's merged records per rank (they depend on the rank count: attributes).
  for (std::size_t k = 0; k < hist.size(); ++k)
    if (!hist[k].merge_records_per_rank.empty())
      out.set_attribute(fmt::format("merge_records_per_rank_{}", k), hist[k].merge_records_per_rank);
  if (!last.pt2_merge_records_per_rank.empty()) out.set_attribute("pt2_merge_records_per_rank", last.pt2_merge_records_per_rank);
}

std::string SolveRun::describe(const StagePlan&, const StepPass&) const {
  const Iteration& last = history_.back();
  const double e_pt2 = final_e_pt2();
  const sci::TargetState& t = m_.problem->target;
  const auto x = params_.eps_schedule.size() > 1 ? extrapolate(points_) : std::nullopt;
  const bool semistochastic = !stochastic_roots_.empty();
  const std::string error = semistochastic ? fmt::format(" +- {:.1e}", final_e_pt2_error(0)) : "";
  std::string more;  // (the other roots: E_var + E_PT2 and <S^2> each)
  for (int r = 1; r < roots(); ++r)
    more += fmt::format("{} {}: {:.10f}{}, <S^2> {:.4f}", r == 1 ? "; roots" : ",", r,
                        m_.davidson->eigenvalue(r) + final_e_pt2(r),
                        semistochastic ? fmt::format(" +- {:.1e}", final_e_pt2_error(r)) : "",
                        s_squared_.at(static_cast<std::size_t>(r)));
  if (roots() < params_.nroots) more += fmt::format(" ({} of nroots = {}: the space is that small)", roots(), params_.nroots);
  return fmt::format("{} determinants, E_var {:.10f}, E_PT2 {:.10f}{}, total {:.10f}{} ({}){}; irrep {}, MS2 {}, <S^2> {:.4f}{}{}",
                     last.dets, last.e_var, e_pt2, error, last.e_var + e_pt2, error, stop_reason_,
                     x ? fmt::format("; extrapolated to E_PT2 = 0 over {} thresholds: {:.10f}", x->points, x->energy) : "",
                     t.irrep, t.ms2, s_squared_.front(), more,
                     t.lower_elsewhere ? " (a lower determinant is of another irrep: see the log)" : "");
}

class SolveStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "sci.solve", 1,
        "heat-bath selected CI from an FCIDUMP: Davidson energies, EN-PT2, iterated to convergence, every phase streamed",
        {{"space", "optional uint64 (n, 2): the determinants to start from (an earlier run's `dets`: a restart, e.g. at a "
                   "tighter eps_var)", true},
         {"guess", "optional float64 (n,): Davidson's start on input `space` (that run's `coefficients`)", true}},
        "- id: sci\n  stage: sci.solve\n  params: {fcidump: N2_sto6g_FCIDUMP, eps_var: 1.0e-3, eps_pt2: 1.0e-5}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return {"/fcidump"}; }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const SolveParams p = SolveParams::from_json(params);
    const auto space = in.find("space"), guess = in.find("guess");
    check_restart_inputs(space != in.end() ? &space->second.layout : nullptr,
                         guess != in.end() ? &guess->second.layout : nullptr);
    for (std::size_t i = 0; i < p.eps_schedule.size(); ++i)
      if (!(p.eps_schedule[i] > 0) || (i > 0 && !(p.eps_schedule[i] < p.eps_schedule[i - 1])))
        throw InputError(fmt::format("parameter 'eps_var' is {}; expected a threshold > 0, or a schedule of decreasing "
                                     "thresholds > 0 (each iterated to convergence in turn)", params.at("eps_var").dump()));
    sci::make_amplitude_model(p.amplitude_model);  // (an unknown model is refused before any work)
    if (p.eps_pt2 < 0) throw InputError("parameter 'eps_pt2' must be >= 0");
    if (p.eps_pt2_large && !(*p.eps_pt2_large > p.eps_pt2))
      throw InputError(fmt::format("parameter 'eps_pt2_large' is {:g}, not above eps_pt2 {:g}; expected the semistochastic "
                                   "PT2's deterministic threshold, larger than eps_pt2 (e.g. 1e-5 with eps_pt2 1e-7)",
                                   *p.eps_pt2_large, p.eps_pt2));
    if (p.pt2_samples < 2 || p.pt2_batches < 2)
      throw InputError(fmt::format("parameters 'pt2_samples' {} and 'pt2_batches' {}; expected at least 2 of each (the "
                                   "estimate needs two draws a batch, the error bar two batches)", p.pt2_samples, p.pt2_batches));
    if (!(p.pt2_target_error >= 0)) throw InputError("parameter 'pt2_target_error' must be >= 0 (Ha)");
    if (p.nroots < 1 || p.nroots > SolveParams::kMostRoots)
      throw InputError(fmt::format("parameter 'nroots' is {}; expected 1 to {} (the lowest states of the irrep and MS2)",
                                   p.nroots, SolveParams::kMostRoots));
    StagePlan plan;
    plan.pass.rows = 0;  // the run's output(): the final space
    plan.pass.tile_rows = 1 << 14;
    plan.primary_output = "energy";
    plan.results = {{"energy", DatasetInfo{Layout{DType::float64, {}, {}}}},
                    {"dets", DatasetInfo{Layout{DType::uint64, {}, {}}}},  // (shapes known once it ran)
                    {"coefficients", DatasetInfo{Layout{DType::float64, {}, {}}}}};
    plan.summary = {{"eps_var", p.eps_var}, {"eps_pt2", p.eps_pt2}, {"max_new_dets", p.max_new_dets}};
    if (p.eps_schedule.size() > 1) plan.summary["eps_var_schedule"] = p.eps_schedule;
    if (p.eps_pt2_large) plan.summary["eps_pt2_large"] = *p.eps_pt2_large;
    if (p.nroots > 1) plan.summary["nroots"] = p.nroots;
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<SolveRun>(ctx); }
};

}  // namespace

const Stage& sci_solve() {
  static const SolveStage stage;
  return stage;
}

}  // namespace qstage::stages
