// sci.solve: heat-bath selected CI, iterated to convergence, every phase a streamed pass.
//
// Iteration k holds a sorted space S_k (k = 0: the determinant of lowest diagonal energy reached
// from aufbau by single moves) and runs these passes, each batched, checkpointed and resumed by
// the engine like any other:
//   sigma     (several)  H x over the rows of S_k for Davidson (kernels::sci_sigma: the column
//                        of each coupled determinant found by binary search in S_k);
//   generate             from each determinant i of S_k, every excitation a with |H_ai c_i| >
//                        eps_var (kernels::sci_generate), appended as {a, H_ai c_i};
//   dedup    (several)   keys.dedup's passes on those candidates: unique, sorted, H_ai c_i summed;
//   score                per unique candidate outside S_k: the Epstein–Nesbet term v^2 / (E - H_aa)
//                        (summed in a fixed tree: E_PT2) and the amplitude of the model
//                        (sci/amplitude_model.hpp; first_order: v / (E - H_aa)), the largest
//                        max_new_dets of which (a two-level top-K: per tile, then merged) join S_k
//                        to make S_{k+1}.
// Once converged (|dE| < energy_tolerance, no new determinant, max_dets or max_iterations), a
// final generate/dedup/score at eps_pt2 gives E_PT2 when eps_pt2 < eps_var. The output pass
// writes the final space and coefficients; the history goes into `iterations/`.
//
// Resume: the pass state records which passes made what; a new space is written (atomically, by
// rank 0) into the work directory before the state saying so is committed. Davidson's basis is
// not saved: it is replayed from the committed sigma outputs (sci/davidson.hpp), so a resumed run
// continues with the same bits, for any rank count.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/parallel.hpp"
#include "core/units.hpp"
#include "kernels/sci_generate.hpp"
#include "kernels/sci_score.hpp"
#include "stages/keys/dedup_passes.hpp"
#include "stages/sci/amplitude_model.hpp"
#include "stages/sci/davidson.hpp"
#include "stages/sci/excitation_tables.hpp"
#include "stages/sci/fcidump.hpp"
#include "stages/sci/resident_space.hpp"
#include "stages/sci/sci_stages.hpp"
#include "stages/sci/target_state.hpp"
#include "stages/tensor/common.hpp"

namespace qstage::stages {
namespace {

namespace fs = std::filesystem;
using kernels::sci::Candidate;
using kernels::sci::Det;
using nlohmann::json;

struct SolveParams {
  double eps_var = 1e-4, eps_pt2 = 1e-6;
  std::uint64_t max_new_dets = 100000, max_dets = 10000000;
  int max_iterations = 20;
  double energy_tolerance = 1e-6, davidson_tolerance = 1e-5;
  std::optional<double> reference_energy;
  std::string amplitude_model = "first_order";
  // The state (sci/target_state.hpp): the FCIDUMP's ISYM and MS2 unless these say otherwise.
  std::optional<int> irrep, ms2;
  std::optional<std::vector<int>> occupation;

  static SolveParams from_json(const json& p) {
    SolveParams s;
    s.amplitude_model = p.value("amplitude_model", s.amplitude_model);
    s.eps_var = p.value("eps_var", s.eps_var);
    s.eps_pt2 = p.value("eps_pt2", s.eps_pt2);
    s.max_new_dets = p.value("max_new_dets", s.max_new_dets);
    s.max_dets = p.value("max_dets", s.max_dets);
    s.max_iterations = p.value("max_iterations", s.max_iterations);
    s.energy_tolerance = p.value("energy_tolerance", s.energy_tolerance);
    s.davidson_tolerance = p.value("davidson_tolerance", s.davidson_tolerance);
    if (p.contains("reference_energy")) s.reference_energy = p.at("reference_energy").get<double>();
    if (p.contains("irrep")) s.irrep = p.at("irrep").get<int>();
    if (p.contains("ms2")) s.ms2 = p.at("ms2").get<int>();
    if (p.contains("occupation")) s.occupation = p.at("occupation").get<std::vector<int>>();
    return s;
  }
};

// ---------------------------------------------------------------- the problem and the space

// The FCIDUMP with the MS2 the step asked for.
sci::Integrals integrals_of(const fs::path& fcidump, std::optional<int> ms2) {
  sci::Integrals ints = sci::read_fcidump(fcidump);
  if (ms2) {
    if ((ints.nelec + *ms2) % 2 != 0 || (ints.nelec + *ms2) / 2 > ints.norb || (ints.nelec - *ms2) / 2 > ints.norb ||
        std::abs(*ms2) > ints.nelec)
      throw InputError(fmt::format("parameter 'ms2' is {}, which NELEC={} in NORB={} orbitals cannot have; expected "
                                   "NELEC + MS2 even and at most NORB electrons of each spin", *ms2, ints.nelec, ints.norb));
    ints.ms2 = *ms2;
  }
  return ints;
}

struct Problem {
  sci::Integrals ints;
  sci::ExcitationTables tables;
  kernels::sci::HamiltonianView host;
  int na = 0, nb = 0;
  std::uint64_t max_per_source = 0;
  sci::OrbitalSymmetry symmetry;
  sci::TargetState target;  // the state looked for, and the determinant the space grows from
  Problem(const fs::path& fcidump, const SolveParams& params)
      : ints(integrals_of(fcidump, params.ms2)), tables(sci::build_excitation_tables(ints)), symmetry(ints.orbsym) {
    host = sci::host_view(ints, tables);
    na = ints.nalpha();
    nb = ints.nbeta();
    max_per_source = sci::max_candidates_per_source(tables, na, nb);
    // Selection needs determinants that couple to others (NELEC=0 ended in an internal error).
    if (max_per_source == 0)
      throw InputError(fmt::format("FCIDUMP '{}': NELEC={}, MS2={} in NORB={} orbitals couple no determinant to another "
                                   "(no electron, or no integral that moves one); expected at least one electron that an "
                                   "integral can excite", fcidump.filename().string(), ints.nelec, ints.ms2, ints.norb));
    target = sci::find_target(host, ints, params.irrep, params.occupation);
  }
};

// A space: sorted determinants, a start vector for Davidson, and the iteration each joined in.
struct Space {
  std::vector<Det> dets;
  std::vector<double> guess;
  std::vector<std::int32_t> joined;
};

fs::path space_file(const KernelContext& ctx, int iteration) { return ctx.work_dir / fmt::format("stage-space-{}.bin", iteration); }

std::string encode(const Space& s) {
  std::string out;
  const std::uint64_t n = s.dets.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(reinterpret_cast<const char*>(s.dets.data()), n * sizeof(Det));
  out.append(reinterpret_cast<const char*>(s.guess.data()), n * 8);
  out.append(reinterpret_cast<const char*>(s.joined.data()), n * 4);
  return out;
}

Space decode(const std::string& bytes, const fs::path& file) {
  Space s;
  std::uint64_t n = 0;
  if (bytes.size() < 8) throw RuntimeFailure(fmt::format("{}: truncated", file.string()));
  std::memcpy(&n, bytes.data(), 8);
  if (bytes.size() != 8 + n * (sizeof(Det) + 12)) throw RuntimeFailure(fmt::format("{}: truncated", file.string()));
  s.dets.resize(n);
  s.guess.resize(n);
  s.joined.resize(n);
  std::memcpy(s.dets.data(), bytes.data() + 8, n * sizeof(Det));
  std::memcpy(s.guess.data(), bytes.data() + 8 + n * sizeof(Det), n * 8);
  std::memcpy(s.joined.data(), bytes.data() + 8 + n * (sizeof(Det) + 8), n * 4);
  return s;
}

// Reads a float64 dataset of an earlier pass's output (every rank reads it whole).
std::vector<double> read_pass_doubles(const KernelContext& ctx, int pass, const std::string& name) {
  h5::File f = h5::File::open(prior_pass_output(ctx, pass), h5::Mode::read_only);
  h5::Dataset d = f.open_dataset(name);
  std::vector<double> v(d.shape().empty() ? 1 : d.shape()[0]);
  if (!v.empty()) d.read_all(v.data());
  return v;
}

std::uint64_t pass_rows(const KernelContext& ctx, int pass, const std::string& name) {
  h5::File f = h5::File::open(prior_pass_output(ctx, pass), h5::Mode::read_only);
  return f.open_dataset(name).shape().at(0);
}

// What a step keeps in memory between its passes (per step key): the problem, the current
// space, and Davidson replayed up to the committed sigma passes.
struct Memory {
  std::unique_ptr<Problem> problem;
  int iteration = -1;
  Space space;
  std::unique_ptr<sci::Davidson> davidson;
  // The device data this iteration's Davidson products share (made by its first sigma pass,
  // gone when its Davidson is done).
  std::unique_ptr<sci::ResidentSpace> resident;
  std::unique_ptr<sci::AmplitudeModel> amplitude_model;  // ranks the candidates (the parameter's)
  std::size_t products = 0;  // sigma passes taken
  std::chrono::steady_clock::time_point pass_started;
  std::optional<double> s_squared;  // of the final state, once asked
};

// What the log says of the state a run looks for (rank 0), and of a lower determinant elsewhere.
void log_target(const Problem& p) {
  const sci::TargetState& t = p.target;
  if (!t.symmetry_known)
    spdlog::warn("sci.solve: ORBSYM's labels are not Molpro's irreps 1-8: the space is not kept to one irrep");
  spdlog::info("sci.solve: looking for the lowest state of irrep {} ({}), MS2 {}, from {} (diagonal {:.10f})", t.irrep,
               t.irrep_from, t.ms2, sci::describe(t.reference, p.ints.norb), t.reference_diagonal);
  if (t.lower_elsewhere)
    spdlog::warn("sci.solve: a lower determinant is of irrep {} ({}, diagonal {:.10f}, {:.1f} mHa below the reference): the "
                 "lowest state may be of another irrep than {}; set 'irrep' (or 'occupation') to look there",
                 t.lower_elsewhere_irrep, sci::describe(*t.lower_elsewhere, p.ints.norb), t.lower_elsewhere_diagonal,
                 1e3 * (t.reference_diagonal - t.lower_elsewhere_diagonal), t.irrep);
}

// <S^2> of the final state (computed once).
double final_spin_squared(Memory& m) {
  if (!m.s_squared) m.s_squared = sci::spin_squared(m.space.dets, m.davidson->eigenvector());
  return *m.s_squared;
}

// ---------------------------------------------------------------- kernels

// The generation's resident data, uploaded in prepare(): the Hamiltonian, the space and the
// coefficients. (Davidson's products share sci::ResidentSpace instead; it is gone by then, so
// the Hamiltonian and the space go up again once an iteration.)
class SpaceKernel : public engine::PassKernel {
 public:
  SpaceKernel(const Memory& m, const std::vector<double>* vector) : m_(m), vector_(vector) {}
  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    h_ = std::make_unique<sci::ResidentHamiltonian>(backend, stream, m_.problem->ints, m_.problem->tables);
    const auto n = m_.space.dets.size();
    space_ = backend.alloc_device(std::max<std::size_t>(n, 1) * sizeof(Det), "selected-CI space");
    backend.copy_to_device(space_.data(), m_.space.dets.data(), n * sizeof(Det), stream);
    if (vector_) {
      vector_buffer_ = backend.alloc_device(std::max<std::size_t>(n, 1) * 8, "selected-CI vector");
      backend.copy_to_device(vector_buffer_.data(), vector_->data(), n * 8, stream);
    }
    stream.synchronize();
  }
  static std::uint64_t resident_bytes(const Memory& m, bool vector) {
    const std::uint64_t n = std::max<std::uint64_t>(m.space.dets.size(), 1);
    return sci::ResidentHamiltonian::bytes(m.problem->ints, m.problem->tables) + n * sizeof(Det) + (vector ? n * 8 : 0);
  }

 protected:
  const Memory& m_;
  const std::vector<double>* vector_;
  Backend* backend_ = nullptr;
  std::unique_ptr<sci::ResidentHamiltonian> h_;
  Buffer space_, vector_buffer_;
};

// A Davidson product over the iteration's resident space: only the vector goes to the device.
class SigmaKernel final : public engine::PassKernel {
 public:
  SigmaKernel(const Memory& m, const std::vector<double>& x) : m_(m), x_(x) {}
  void prepare(Backend& backend, Stream& stream) override {
    x_buffer_ = backend.alloc_device(std::max<std::size_t>(x_.size(), 1) * 8, "selected-CI vector");
    backend.copy_to_device(x_buffer_.data(), x_.data(), x_.size() * 8, stream);
    stream.synchronize();
  }
  void process(const engine::BatchView& b) override {
    m_.resident->sigma(*b.stream, x_buffer_.as<double>(), b.rows.begin, b.rows.size(), static_cast<double*>(b.outputs[0]),
                       static_cast<double*>(b.outputs[1]));
  }

 private:
  const Memory& m_;
  const std::vector<double>& x_;
  Buffer x_buffer_;
};

class GenerateKernel final : public SpaceKernel {
 public:
  GenerateKernel(const Memory& m, const std::vector<double>* c, double eps) : SpaceKernel(m, c), eps_(eps) {}
  void prepare(Backend& backend, Stream& stream) override {
    SpaceKernel::prepare(backend, stream);
    scan_ = backend.alloc_device(kernels::kSciScanWorkspaceBytes, "selected-CI scan workspace");
  }
  void process(const engine::BatchView& b) override {
    const Problem& p = *m_.problem;
    kernels::SciGenerate g{h_->view(),
                           p.na,
                           p.nb,
                           space_.as<Det>() + b.rows.begin,
                           vector_buffer_.as<double>() + b.rows.begin,
                           b.rows.size(),
                           eps_,
                           static_cast<Candidate*>(b.outputs[0]),
                           b.appended[0],
                           static_cast<std::uint64_t*>(b.scratch),
                           scan_.data()};
    kernels::sci_generate(*b.stream, g);
  }

 private:
  double eps_;
  Buffer scan_;
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
// denominator E - H_aa come from the backend (kernels/sci_score.hpp: on the GPU, the space and
// the integrals resident for the pass); the sums and the top-K are the host's, per tile in row
// order, so E_PT2 and the top-K have the same bits on every backend and for any batch.
class ScoreKernel final : public SpaceKernel {
 public:
  ScoreKernel(const Memory& m, const sci::AmplitudeModel& model, double energy, std::uint64_t k, std::uint64_t tile_rows)
      : SpaceKernel(m, nullptr), model_(model), energy_(energy), k_(k), tile_rows_(tile_rows) {}
  // Device scratch a row: its denominator and whether it is skipped.
  static constexpr std::uint64_t kScratchPerRow = sizeof(double) + 1;

  void process(const engine::BatchView& b) override {
    const auto* keys = static_cast<const std::uint64_t*>(b.host_inputs[0]);
    const auto* values = static_cast<const double*>(b.host_inputs[1]);
    const std::uint64_t rows = b.rows.size(), tiles = (rows + tile_rows_ - 1) / tile_rows_;
    const std::size_t partial_bytes = sizeof(ScoreHeader) + k_ * sizeof(Scored);
    const Problem& p = *m_.problem;
    auto* device_denominator = static_cast<double*>(b.scratch);
    auto* device_skipped = reinterpret_cast<unsigned char*>(device_denominator + rows);
    kernels::sci_score_rows(*b.stream, {h_->view(), space_.as<Det>(), m_.space.dets.size(),
                                        p.symmetry.masks(p.target.irrep), static_cast<const Det*>(b.inputs[0]), rows,
                                        energy_, device_denominator, device_skipped});
    denominator_.resize(rows);
    skipped_.resize(rows);
    backend_->copy_to_host(denominator_.data(), device_denominator, rows * sizeof(double), *b.stream);
    backend_->copy_to_host(skipped_.data(), device_skipped, rows, *b.stream);
    b.stream->synchronize();
    for (std::uint64_t t = 0; t < tiles; ++t) {
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
    }
  }

 private:
  const sci::AmplitudeModel& model_;
  double energy_;
  std::uint64_t k_, tile_rows_;
  std::vector<double> denominator_;
  std::vector<unsigned char> skipped_;
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

// ---------------------------------------------------------------- the stage

constexpr std::uint64_t kScoreTileMin = 1 << 16;

class SolveStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "sci.solve", 1,
        "heat-bath selected CI from an FCIDUMP: Davidson energies, EN-PT2, iterated to convergence, every phase streamed",
        {},
        "- id: sci\n  stage: sci.solve\n  params: {fcidump: N2_sto6g_FCIDUMP, eps_var: 1.0e-3, eps_pt2: 1.0e-5}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return {"/fcidump"}; }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>&) const override {
    const SolveParams p = SolveParams::from_json(params);
    if (!(p.eps_var > 0)) throw InputError("parameter 'eps_var' must be > 0");
    sci::make_amplitude_model(p.amplitude_model);  // (an unknown model is refused before any work)
    if (p.eps_pt2 < 0) throw InputError("parameter 'eps_pt2' must be >= 0");
    StagePlan plan;
    plan.pass.rows = 0;  // refine_plan: the final space
    plan.pass.tile_rows = 1 << 14;
    plan.primary_output = "energy";
    plan.results = {{"energy", DatasetInfo{Layout{DType::float64, {}, {}}}}};
    plan.summary = {{"eps_var", p.eps_var}, {"eps_pt2", p.eps_pt2}, {"max_new_dets", p.max_new_dets}};
    return plan;
  }

  std::optional<PriorPass> prior_pass(const KernelContext& ctx, const PassState& state) const override {
    Memory& m = memory(ctx, state);
    const SolveParams params = SolveParams::from_json(ctx.params);
    const json& d = state.data;
    const std::string phase = d.value("phase", "davidson");
    m.pass_started = std::chrono::steady_clock::now();
    const std::uint64_t n = m.space.dets.size();
    if (phase == "davidson") {
      PriorPass p;
      p.name = fmt::format("sigma {}.{}", m.iteration, m.products + 1);
      p.pass.rows = n;
      p.pass.tile_rows = row_chunk(n, 256);
      p.pass.outputs.push_back(row_output("sigma", n));
      p.pass.outputs.push_back(row_output("diagonal", n));
      if (!m.resident) make_resident_space(ctx, m);
      p.pass.resident_device_bytes = m.resident->bytes() + std::max<std::uint64_t>(n, 1) * 8;
      p.pass.progress_unit = "determinants";
      p.kernel = std::make_unique<SigmaKernel>(m, m.davidson->next());
      return p;
    }
    if (phase == "generate" || phase == "pt2_generate") {
      const double eps = phase == "generate" ? params.eps_var : params.eps_pt2;
      PriorPass p;
      p.name = fmt::format("generate {}", m.iteration);
      p.pass.rows = n;
      p.pass.tile_rows = 16;
      engine::OutputDecl out;
      out.name = "candidates";
      out.kind = engine::OutputKind::appended;
      out.layout = Layout{DType::uint64, {n * m.problem->max_per_source, 3}, {1 << 16, 3}};
      out.max_rows_per_row = m.problem->max_per_source;
      p.pass.outputs.push_back(out);
      p.pass.resident_device_bytes = SpaceKernel::resident_bytes(m, true) + kernels::kSciScanWorkspaceBytes;
      p.pass.scratch_device_bytes_per_row = 16;
      p.pass.progress_unit = "determinants";
      p.kernel = std::make_unique<GenerateKernel>(m, &m.davidson->eigenvector(), eps);
      return p;
    }
    if (phase == "dedup" || phase == "pt2_dedup") {
      auto next = dedup_of(ctx, d).next(ctx, d.at("dedup"), d.at("dedup_first").get<int>());
      if (!next) throw std::logic_error("sci.solve: dedup finished without saying so");
      return next;
    }
    if (phase == "score" || phase == "pt2_score") {
      const keys::DedupResult r = keys::DedupPasses::result(d.at("dedup"));
      const std::uint64_t k = phase == "score" ? params.max_new_dets : 0;
      PriorPass p;
      p.name = fmt::format("score {}", m.iteration);
      p.pass.rows = r.unique;
      p.pass.tile_rows = std::max<std::uint64_t>(kScoreTileMin, std::bit_ceil(4 * std::max<std::uint64_t>(k, 1)));
      // (the keys on the device for the kernel, and in pinned memory for the host's sums; the
      // values only there)
      p.pass.inputs.push_back({"unique keys", nullptr, 16});
      p.pass.inputs.push_back({"summed H c", nullptr, 8});
      p.pass.inputs[1].place = engine::StreamedInput::Place::host;
      p.pass.resident_device_bytes = SpaceKernel::resident_bytes(m, false);
      p.pass.scratch_device_bytes_per_row = ScoreKernel::kScratchPerRow;
      p.streamed_inputs = {earlier_pass_input(r.pass, r.keys), earlier_pass_input(r.pass, r.values)};
      p.pass.tile_partial_bytes = sizeof(ScoreHeader) + k * sizeof(Scored);
      p.pass.partials_on_host = true;
      p.kernel = std::make_unique<ScoreKernel>(m, *m.amplitude_model, d.at("e_var").get<double>(), k, p.pass.tile_rows);
      p.reduction = std::make_unique<ScoreReduction>(k);
      return p;
    }
    return std::nullopt;  // "done"
  }

  void after_prior_pass(const KernelContext& ctx, PriorPass& pass, PassState& state) const override {
    Memory& m = memory(ctx, state);
    const SolveParams params = SolveParams::from_json(ctx.params);
    json& d = state.data;
    const std::string phase = d.value("phase", "davidson");
    const int index = state.done;  // this pass's
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - m.pass_started).count();
    json& now = current(d);
    json& spent = now["seconds"];
    if (!spent.is_object()) spent = json::object();
    const std::string timed = phase.starts_with("pt2_") ? "pt2" : phase;
    spent[timed] = spent.value(timed, 0.0) + seconds;
    if (phase == "pt2_dedup") spent[phase] = spent.value(phase, 0.0) + seconds;  // (also inside "pt2")
    // The iteration's peak memory, the largest over ranks (every rank runs this).
    const auto peaks = ctx.comm->max({static_cast<std::int64_t>(ctx.backend->device_budget().take_interval_peak()),
                                      static_cast<std::int64_t>(ctx.backend->host_budget().take_interval_peak())});
    now["peak_device_bytes"] = std::max<std::int64_t>(now.value("peak_device_bytes", std::int64_t{0}), peaks[0]);
    now["peak_host_bytes"] = std::max<std::int64_t>(now.value("peak_host_bytes", std::int64_t{0}), peaks[1]);
    if (phase == "davidson") {
      d["sigma"].push_back(index);
      take_product(ctx, m, index);
      if (m.davidson->done()) {
        d["e_var"] = m.davidson->eigenvalue();
        now["e_var"] = m.davidson->eigenvalue();
        now["davidson_products"] = m.davidson->products();
        now["davidson_converged"] = m.davidson->converged();
        d["phase"] = "generate";
        m.resident.reset();
        if (ctx.comm->root())
          spdlog::info("sci.solve iteration {}: {} determinants, E_var {:.10f} ({} products)", m.iteration,
                       m.space.dets.size(), m.davidson->eigenvalue(), m.davidson->products());
      }
      return;
    }
    const bool final_pt2 = phase.starts_with("pt2_");
    if (phase == "generate" || phase == "pt2_generate") {
      d["generated_pass"] = index;
      const std::uint64_t generated = pass_rows(ctx, index, "candidates");
      d["generated_rows"] = generated;
      now[final_pt2 ? "pt2_generated" : "generated"] = generated;
      d["dedup"] = json::object();
      d["dedup_first"] = index + 1;
      d["phase"] = final_pt2 ? "pt2_dedup" : "dedup";
      if (generated == 0) {  // nothing to de-duplicate: no candidate passed the screening
        if (final_pt2) {
          d["final_pt2"] = 0.0;
          d["phase"] = "done";
        } else {
          finish_iteration(ctx, m, d, params, 0.0, {});
        }
      }
      return;
    }
    if (phase == "dedup" || phase == "pt2_dedup") {
      dedup_of(ctx, d).after(ctx, pass, d["dedup"]);
      if (keys::DedupPasses::done(d["dedup"])) {
        now[final_pt2 ? "pt2_unique" : "unique"] = keys::DedupPasses::result(d["dedup"]).unique;
        // How evenly the sample sort spread the merge over the ranks (seed 004's Table 1).
        now[final_pt2 ? "pt2_merge_records_per_rank" : "merge_records_per_rank"] =
            keys::DedupPasses::merge_rows_per_rank(d["dedup"], ctx.comm->size());
        d["phase"] = final_pt2 ? "pt2_score" : "score";
      }
      return;
    }
    if (phase == "score" || phase == "pt2_score") {
      const auto& r = static_cast<const ScoreReduction&>(*pass.reduction);
      if (final_pt2) {
        d["final_pt2"] = r.pt2();
        d["phase"] = "done";
        return;
      }
      finish_iteration(ctx, m, d, params, r.pt2(), r.top());
    }
  }

  void refine_plan(StagePlan& plan, const KernelContext& ctx) const override {
    Memory& m = memory(ctx, *ctx.passes);
    const std::uint64_t n = m.space.dets.size();
    const std::uint64_t chunk = row_chunk(n, 1 << 14);
    plan.pass.rows = n;
    plan.pass.tile_rows = chunk;
    plan.pass.outputs = {engine::OutputDecl{"dets", Layout{DType::uint64, {n, 2}, {chunk, 2}}},
                         engine::OutputDecl{"coefficients", Layout{DType::float64, {n}, {chunk}}}};
    plan.pass.progress_unit = "determinants";
  }

  std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const override {
    return std::make_unique<WriteSpaceKernel>(memory(ctx, *ctx.passes));
  }

  void write_results(const StagePlan&, const StepResults& r, h5::File& out) const override {
    const json& d = r.context->passes->data;
    const json& hist = d.at("history");
    Memory& m = memory(*r.context, *r.context->passes);
    // One value per iteration from the history (`missing` where an iteration has none).
    auto column = [&](const char* key, h5::DType type, auto missing, const char* doc) {
      std::vector<decltype(missing)> v;
      for (const auto& h : hist) v.push_back(h.value(key, missing));
      detail::write_array(out, fmt::format("iterations/{}", key).c_str(), type, {v.size()}, v.data(), doc);
    };
    auto series = [&](const char* key, const char* doc) { column(key, h5::DType::float64, std::nan(""), doc); };
    auto counts = [&](const char* key, const char* doc) { column(key, h5::DType::uint64, std::uint64_t{0}, doc); };
    counts("dets", "determinants in the variational space of each iteration");
    series("e_var", "variational energy (Ha) of each iteration's space");
    series("e_pt2", "Epstein-Nesbet PT2 (Ha) over the candidates generated at eps_var");
    counts("generated", "candidates generated (|H_ai c_i| > eps_var), duplicates included");
    counts("unique", "unique candidates after de-duplication");
    counts("selected", "candidates added to the space");
    counts("davidson_products", "H x products Davidson took");
    const json& last = hist.back();
    const double e_var = last.at("e_var").get<double>();
    const double e_pt2 = d.contains("final_pt2") ? d.at("final_pt2").get<double>() : last.value("e_pt2", 0.0);
    detail::write_scalar(out, "energy", h5::DType::float64, &e_var, "final variational energy E_var (Ha)");
    detail::write_scalar(out, "e_pt2", h5::DType::float64, &e_pt2, "final Epstein-Nesbet PT2 correction (Ha)");
    const double total = e_var + e_pt2;
    detail::write_scalar(out, "e_total", h5::DType::float64, &total, "E_var + E_PT2 (Ha)");
    // The final PT2's candidates (at eps_pt2; 0 when it did not run): the largest set a run streams.
    const std::uint64_t pt2_generated = last.value("pt2_generated", std::uint64_t{0}),
                        pt2_unique = last.value("pt2_unique", std::uint64_t{0});
    detail::write_scalar(out, "pt2_generated", h5::DType::uint64, &pt2_generated,
                         "candidates the final PT2 generated at eps_pt2, duplicates included (0: no final PT2)");
    detail::write_scalar(out, "pt2_unique", h5::DType::uint64, &pt2_unique, "unique candidates of the final PT2");
    detail::write_array(out, "joined_iteration", h5::DType::int32, {m.space.joined.size()}, m.space.joined.data(),
                        "iteration each determinant joined the space (dets[joined <= k] is iteration k's space)");
    // Which state this is: its irrep and spin, where it started, and its largest determinants.
    const sci::TargetState& t = m.problem->target;
    out.set_attribute("irrep", static_cast<std::int64_t>(t.irrep));
    out.set_attribute("irrep_from", t.irrep_from);
    out.set_attribute("ms2", static_cast<std::int64_t>(t.ms2));
    out.set_attribute("s_squared", final_spin_squared(m));
    out.set_attribute("reference_determinant", sci::describe(t.reference, m.problem->ints.norb));
    out.set_attribute("reference_diagonal", t.reference_diagonal);
    if (t.lower_elsewhere)
      out.set_attribute("warning", fmt::format("a determinant of irrep {} ({}) has a lower diagonal ({:.10f}) than this "
                                               "state's reference: the lowest state may be of another irrep",
                                               t.lower_elsewhere_irrep, sci::describe(*t.lower_elsewhere, m.problem->ints.norb),
                                               t.lower_elsewhere_diagonal));
    {
      const auto& c = m.davidson->eigenvector();
      std::vector<std::size_t> order(c.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      const std::size_t shown = std::min<std::size_t>(5, order.size());
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shown), order.end(),
                        [&](std::size_t a, std::size_t b) { return std::fabs(c[a]) > std::fabs(c[b]) || (std::fabs(c[a]) == std::fabs(c[b]) && a < b); });
      std::string leading;
      for (std::size_t i = 0; i < shown; ++i)
        leading += fmt::format("{}{:+.6f} {}", i ? "\n" : "", c[order[i]], sci::describe(m.space.dets[order[i]], m.problem->ints.norb));
      out.set_attribute("leading_determinants", leading);
    }
    out.set_attribute("converged", static_cast<std::int64_t>(d.value("converged", false)));
    out.set_attribute("stop_reason", d.value("stop_reason", std::string()));
    const SolveParams params = SolveParams::from_json(r.context->params);
    if (params.reference_energy) out.set_attribute("reference_energy", *params.reference_energy);
    // Seconds per phase and peak memory per iteration, as attributes (they differ between runs;
    // the datasets do not).
    std::vector<std::uint64_t> device_peaks, host_peaks;
    for (std::size_t k = 0; k < hist.size(); ++k) {
      const json spent = hist[k].value("seconds", json::object());
      for (const auto& [phase, s] : spent.items()) out.set_attribute(fmt::format("seconds_{}_{}", k, phase), s.get<double>());
      device_peaks.push_back(hist[k].value("peak_device_bytes", std::uint64_t{0}));
      host_peaks.push_back(hist[k].value("peak_host_bytes", std::uint64_t{0}));
    }
    out.set_attribute("peak_device_bytes", device_peaks);
    out.set_attribute("peak_host_bytes", host_peaks);
    // The dedup's merged records per rank (they depend on the rank count: attributes).
    for (std::size_t k = 0; k < hist.size(); ++k)
      if (hist[k].contains("merge_records_per_rank"))
        out.set_attribute(fmt::format("merge_records_per_rank_{}", k),
                          hist[k].at("merge_records_per_rank").get<std::vector<std::uint64_t>>());
    if (last.contains("pt2_merge_records_per_rank"))
      out.set_attribute("pt2_merge_records_per_rank", last.at("pt2_merge_records_per_rank").get<std::vector<std::uint64_t>>());
  }

  std::string describe_results(const StagePlan&, const StepResults& r) const override {
    const json& d = r.context->passes->data;
    const json& last = d.at("history").back();
    const double e_pt2 = d.contains("final_pt2") ? d.at("final_pt2").get<double>() : last.value("e_pt2", 0.0);
    Memory& m = memory(*r.context, *r.context->passes);
    return fmt::format("{} determinants, E_var {:.10f}, E_PT2 {:.10f}, total {:.10f} ({}); irrep {}, MS2 {}, <S^2> {:.4f}{}",
                       last.at("dets").get<std::uint64_t>(), last.at("e_var").get<double>(), e_pt2,
                       last.at("e_var").get<double>() + e_pt2, d.value("stop_reason", std::string()), m.problem->target.irrep,
                       m.problem->target.ms2, final_spin_squared(m),
                       m.problem->target.lower_elsewhere ? " (a lower determinant is of another irrep: see the log)" : "");
  }

 private:
  // Chunk rows (and tile rows) for n rows: `most`, or n when fewer, so a chunk divides a tile.
  static std::uint64_t row_chunk(std::uint64_t n, std::uint64_t most) {
    return std::min<std::uint64_t>(std::max<std::uint64_t>(n, 1), most);
  }
  static engine::OutputDecl row_output(const std::string& name, std::uint64_t n) {
    return {name, Layout{DType::float64, {n}, {row_chunk(n, 256)}}};
  }

  static json& current(json& d) {
    json& h = d["history"];
    if (!h.is_array()) h = json::array();
    const int it = d.value("iteration", 0);
    while (static_cast<int>(h.size()) <= it) h.push_back(json::object());
    return h[it];
  }

  keys::DedupPasses dedup_of(const KernelContext& ctx, const json& d) const {
    const int gen = d.at("generated_pass").get<int>();
    keys::DedupSource src;
    src.keys = earlier_pass_input(gen, "candidates");
    src.rows = d.at("generated_rows").get<std::uint64_t>();
    src.words = 2;
    src.interleaved_value = true;
    return keys::DedupPasses(src);
  }

  // Davidson takes the committed product of sigma pass `index` (the first also gives the diagonal).
  // The iteration's resident space for its Davidson products: H within the space is stored when
  // it takes at most half of the device memory the budget has left (the passes' buffers, and the
  // generation after Davidson, need the rest); otherwise products enumerate.
  static void make_resident_space(const KernelContext& ctx, Memory& m) {
    // (idle pooled memory counts as free: the pool gives it up to make room)
    MemoryBudget& budget = ctx.backend->device_budget();
    const std::uint64_t left = budget.limit() > budget.in_use() ? budget.limit() - budget.in_use() : 0;
    const Problem& p = *m.problem;
    m.resident = std::make_unique<sci::ResidentSpace>(*ctx.backend, p.ints, p.tables, p.na, p.nb, m.space.dets, left / 2);
    if (ctx.comm->root())
      spdlog::info("sci.solve iteration {}: {} ({} determinants, {:.2f} s)", m.iteration,
                   m.resident->stored() ? fmt::format("H within the space stored on the device, {} entries, {}",
                                                      m.resident->entries(),
                                                      format_bytes(static_cast<double>(m.resident->bytes())))
                                        : std::string("H within the space does not fit half the device budget left; "
                                                      "each product enumerates"),
                   m.space.dets.size(), m.resident->build_seconds());
  }

  static void take_product(const KernelContext& ctx, Memory& m, int index) {
    if (m.products == 0) m.davidson->set_diagonal(read_pass_doubles(ctx, index, "diagonal"));
    m.davidson->take(read_pass_doubles(ctx, index, "sigma"));
    ++m.products;
  }

  // Ends iteration k: history, convergence, and (unless converged) the next space.
  void finish_iteration(const KernelContext& ctx, Memory& m, json& d, const SolveParams& params, double pt2,
                        const std::vector<Scored>& top) const {
    json& now = current(d);
    now["dets"] = m.space.dets.size();
    now["e_pt2"] = pt2;
    now["selected"] = top.size();
    const json& hist = d["history"];
    const int k = m.iteration;
    std::string reason;
    const double e = now.at("e_var").get<double>();
    if (k > 0 && std::fabs(e - hist[k - 1].at("e_var").get<double>()) < params.energy_tolerance) reason = "energy converged";
    else if (top.empty()) reason = "no new determinant";
    else if (m.space.dets.size() >= params.max_dets) reason = "max_dets reached";
    else if (k + 1 >= params.max_iterations) reason = "max_iterations reached";
    if (!reason.empty()) {
      d["stop_reason"] = reason;
      d["converged"] = reason == "energy converged" || reason == "no new determinant";
      d["phase"] = params.eps_pt2 < params.eps_var ? "pt2_generate" : "done";
      if (ctx.comm->root()) spdlog::info("sci.solve: {} after iteration {}", reason, k);
      return;
    }
    // S_{k+1}: S_k (its coefficients as the start) and the selected (their first-order amplitudes).
    Space next;
    const auto& c = m.davidson->eigenvector();
    std::vector<std::pair<Det, std::pair<double, std::int32_t>>> all;
    all.reserve(m.space.dets.size() + top.size());
    for (std::size_t i = 0; i < m.space.dets.size(); ++i) all.push_back({m.space.dets[i], {c[i], m.space.joined[i]}});
    std::uint64_t room = params.max_dets - std::min<std::uint64_t>(params.max_dets, m.space.dets.size());
    for (const Scored& s : top) {
      if (room == 0) break;
      all.push_back({Det{s.alpha, s.beta}, {s.amplitude, k + 1}});
      --room;
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [det, v] : all) {
      next.dets.push_back(det);
      next.guess.push_back(v.first);
      next.joined.push_back(v.second);
    }
    if (ctx.comm->root()) fsutil::write_file_atomic(space_file(ctx, k + 1), encode(next));
    ctx.comm->barrier();
    d["iteration"] = k + 1;
    d["phase"] = "davidson";
    d["sigma"] = json::array();
    d.erase("dedup");
    m.iteration = -1;  // memory() loads S_{k+1} when next asked
  }

  // The step's memory, brought in line with the committed state (loaded or replayed on resume).
  Memory& memory(const KernelContext& ctx, const PassState& state) const {
    std::lock_guard lock(mutex_);
    Memory& m = memories_[ctx.step_key];
    if (!m.problem) {
      m.problem = std::make_unique<Problem>(ctx.files.at("/fcidump"), SolveParams::from_json(ctx.params));
      if (!ctx.comm || ctx.comm->root()) log_target(*m.problem);
    }
    if (!m.amplitude_model) m.amplitude_model = sci::make_amplitude_model(SolveParams::from_json(ctx.params).amplitude_model);
    const int k = state.data.value("iteration", 0);
    if (m.iteration != k) {
      if (k == 0) {
        m.space = Space{{m.problem->target.reference}, {1.0}, {0}};
      } else {
        const fs::path f = space_file(ctx, k);
        m.space = decode(fsutil::read_file(f), f);
      }
      m.iteration = k;
      m.resident.reset();
      const SolveParams params = SolveParams::from_json(ctx.params);
      m.davidson = std::make_unique<sci::Davidson>(m.space.guess, sci::DavidsonOptions{params.davidson_tolerance, 24, 400});
      m.products = 0;
    }
    const json sigma = state.data.value("sigma", json::array());
    while (m.products < sigma.size()) take_product(ctx, m, sigma[m.products].get<int>());
    return m;
  }

  mutable std::mutex mutex_;
  mutable std::map<std::string, Memory> memories_;
};

}  // namespace

const Stage& sci_solve() {
  static const SolveStage stage;
  return stage;
}

}  // namespace qstage::stages
