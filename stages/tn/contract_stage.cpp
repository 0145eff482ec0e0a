// tn.contract: executes a plan. Work items (rows of the pass) are (bitstring, slice) pairs, rows
// bitstring-major; each is one contraction into the arena the plan laid out. The plan's
// invariant steps (the prologue) run once per bitstring on each rank, into the persistent region
// the slices then read (Contractor). Results are summed over slices in row order on rank 0
// (complex128), so the answer is the same for any rank count, and completed slices are
// checkpointed like any other batch. In a reduced compute mode (or with reference_check), the
// first result is contracted again in complex128 after the pass, and its measured error is
// written beside it.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <numeric>
#include <optional>

#include "engine/stream_engine.hpp"
#include "core/error.hpp"
#include "core/serial.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "kernels/linalg/tropical.hpp"
#include "spec/schema.hpp"
#include "stages/common/params.hpp"
#include "comm/communicator.hpp"
#include "core/mpi.hpp"
#include "core/signals.hpp"
#include "stages/tn/contractor.hpp"
#include "stages/tn/distributed_contractor.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/plan.hpp"
#include "stages/tn/sources.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using cd = std::complex<double>;

struct Loaded {
  tn::Network net;
  tn::Plan plan;                     // with its prediction (rates, predicted seconds), where the plan file's is usable
  std::string no_prediction;         // else why not: the step profile is then left out, the result is not
  std::optional<json> distribution;  // tn.plan's ranks: P (with the plan for P ranks)
  std::vector<std::vector<std::uint8_t>> bitstrings;  // amplitude networks (else one empty)
};

Loaded load_inputs(const StepContext& ctx) {
  Loaded l;
  h5::File nf = h5::File::open(ctx.inputs.at("network")->where().file, h5::Mode::read_only);
  l.net = tn::load_network(nf);
  h5::File pf = h5::File::open(ctx.inputs.at("plan")->where().file, h5::Mode::read_only);
  const std::shared_ptr<const tn::PlanOutput> out = tn::read_plan_output(pf);
  const json& plan = out->plan;
  try {
    if (out->prediction.is_null()) throw InputError("the plan file has no prediction (a tn.plan before version 9)");
    l.plan = tn::Plan::from_json(plan, out->prediction);
  } catch (const std::exception& e) {
    l.no_prediction = e.what();
    l.plan = tn::Plan::from_json(plan);
  }
  if (plan.contains("distribution")) {
    if (!plan.at("distribution").contains("plan"))
      throw InputError("the plan's distribution has no plan for its ranks (tn.plan before version 8); expected the plan "
                       "made again by this qstage");
    l.distribution = plan.at("distribution");
  }
  if (l.plan.input_layouts.size() != l.net.tensors.size())
    throw InputError(fmt::format("the plan has {} input tensors and the network {}; expected a plan of this network",
                                 l.plan.input_layouts.size(), l.net.tensors.size()));
  if (l.net.kind == "amplitude") l.bitstrings = tn::read_bitstrings(nf);
  if (l.bitstrings.empty()) l.bitstrings.emplace_back();
  return l;
}

h5::DType dtype_of_plan(const tn::Plan& p) { return p.element_bytes == 16 ? h5::DType::complex128 : h5::DType::complex64; }

struct Params {
  kernels::Compute compute;  // (compute: auto resolved by resolve_auto)
  bool compute_auto = false;
  std::optional<double> max_error;
  bool time_steps;
  std::optional<bool> reference_check;  // none: check where compute or compress_spilled loses precision
  std::filesystem::path scratch_dir;    // for spilled intermediates' scratch files
  std::optional<codec::Settings> compress_spilled;
  static Params from_json(const json& p) {
    Params r;
    const std::string compute = p.at("compute").get<std::string>();
    r.compute_auto = compute == "auto";
    r.compute = r.compute_auto ? kernels::Compute::full : *kernels::parse_compute(compute);  // (the schema's enum)
    r.max_error = params::optional<double>(p, "max_error");
    if (r.compute_auto && !r.max_error)
      throw InputError("parameter 'compute': auto picks the fastest mode whose predicted error is within max_error; "
                       "expected max_error too (a relative error, such as 1.0e-3)");
    r.time_steps = p.at("time_steps").get<bool>();
    r.reference_check = params::optional<bool>(p, "reference_check");
    const std::string dir = p.value("scratch_dir", "");
    r.scratch_dir = dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(dir);
    if (p.contains("compress_spilled")) {  // the codec's settings, their defaults filled in
      const json& schema = parameter_schema(tn_contract()).at("properties").at("compress_spilled");
      r.compress_spilled = h5::codec_settings(spec::with_defaults(schema, p.at("compress_spilled")), "compress_spilled");
    }
    return r;
  }
};

// Device memory a slot has for the reduced modes' staging: the budget left after the resident
// data and the BLAS streams' workspaces, shared by the engine's slots (its default count), less
// the slot's arena and result.
std::uint64_t staging_left(const tn::Contractor& c, Backend& be) {
  const int slots = engine::EngineOptions{}.slots;
  const std::uint64_t left = be.device_budget().left(), resident = c.resident_bytes() + c.persistent_bytes();
  const std::uint64_t per_slot = left > resident ? (left - resident) / static_cast<std::uint64_t>(slots) : 0;
  const std::uint64_t fixed = be.blas_stream_bytes() + (c.work_bytes() - c.staging_bytes()) + 256 +
                              c.result_elements() * c.element_bytes();
  return per_slot > fixed ? per_slot - fixed : 0;
}

// Steps that would run in a reduced mode (compute-bound, complex64; none for a tropical network).
int reduced_step_count(const Loaded& l) {
  if (dtype_of_plan(l.plan) != h5::DType::complex64 || l.net.semiring == "tropical") return 0;
  const tn::Contractor probe(l.net, l.plan, h5::DType::complex64, kernels::Compute::tf32);
  int count = 0;
  for (const tn::PlanStep& st : l.plan.steps) count += probe.reduced_step(st) ? 1 : 0;
  return count;
}

// compute: auto: the fastest mode (on the GPU: bf16, tf32, 3xtf32, full) whose predicted error
// (kernels::predicted_relative_error over the plan's reduced steps) is within max_error, else
// full; below 1e-6 with a warning that complex64 may not reach it. The choice depends on the
// plan only, so the CPU (which emulates the modes) makes the same one.
Params resolve_auto(Params p, const Loaded& l) {
  if (!p.compute_auto) return p;
  const int steps = reduced_step_count(l);
  p.compute = kernels::Compute::full;
  if (steps > 0) {
    for (kernels::Compute c : {kernels::Compute::bf16, kernels::Compute::tf32, kernels::Compute::tf32x3})
      if (kernels::predicted_relative_error(c, steps) <= *p.max_error) {
        p.compute = c;
        break;
      }
  }
  if (*p.max_error < 1e-6)
    spdlog::warn("tn.contract: max_error {:.3g} is below complex64's own rounding (about 1e-7 to 1e-6): compute auto "
                 "runs in full FP32, which may not reach it; a tn.plan of precision complex128 would",
                 *p.max_error);
  spdlog::info("tn.contract: compute auto chose {} ({} compute-bound step(s), max_error {:.3g})",
               kernels::compute_name(p.compute), steps, *p.max_error);
  return p;
}

// Each work item's partial: its result, the measured step seconds, then these counts.
struct RowCounts {
  std::uint64_t raw = 0, stored = 0;  // spilled bytes it coded and their streams' bytes (compress_spilled)
  std::uint64_t prologues = 0;        // prologues it ran (0 or 1)
};

class ContractKernel final : public engine::PassKernel {
 public:
  ContractKernel(Loaded loaded, kernels::Compute compute, std::uint64_t staging_cap, std::filesystem::path scratch_dir,
                 std::optional<codec::Settings> spill, bool time_steps)
      : l_(std::move(loaded)),
        time_steps_(time_steps),
        contractor_(l_.net, l_.plan, dtype_of_plan(l_.plan), compute, std::move(scratch_dir), spill) {
    contractor_.limit_staging(staging_cap);
  }
  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    contractor_.upload(backend, stream);
  }
  // The partials live in pinned host memory (partials_on_host): each row's result goes there by
  // an asynchronous copy from the end of the row's scratch, and its seconds and counts, known
  // once the row is queued, are written directly. Nothing waits for the device, so the next
  // row's launches (about one per step: hundreds on a circuit) overlap this row's kernels.
  void process(const engine::BatchView& b) override {
    const auto S = static_cast<std::uint64_t>(l_.plan.slices);
    char* partial = static_cast<char*>(b.partials);
    char* result = static_cast<char*>(b.scratch) + result_offset(contractor_);
    for (std::uint64_t r = b.rows.begin; r < b.rows.end; ++r) {
      // The first item of each run is timed step by step (synchronizing; unless time_steps is
      // off); the others run freely.
      const bool timed = time_steps_ && !timed_once_;
      timed_once_ = true;
      std::vector<double> seconds(l_.plan.steps.size(), -1.0);
      const RowCounts before{contractor_.spilled_raw_bytes(), contractor_.spilled_stored_bytes(),
                             contractor_.prologue_runs()};
      contractor_.contract(*b.stream, r % S, l_.bitstrings.at(r / S), b.scratch, result, timed ? &seconds : nullptr);
      const RowCounts counts{contractor_.spilled_raw_bytes() - before.raw,
                             contractor_.spilled_stored_bytes() - before.stored,
                             contractor_.prologue_runs() - before.prologues};
      const std::uint64_t result_bytes = contractor_.result_elements() * contractor_.element_bytes();
      const std::uint64_t seconds_bytes = seconds.size() * sizeof(double);
      backend_->copy_to_host(partial, result, result_bytes, *b.stream);
      std::memcpy(partial + result_bytes, seconds.data(), seconds_bytes);
      std::memcpy(partial + result_bytes + seconds_bytes, &counts, sizeof counts);
      partial += result_bytes + seconds_bytes + sizeof counts;
    }
  }
  // Where a row's result goes in its scratch: after the contractor's work memory, 256-byte aligned.
  static std::uint64_t result_offset(const tn::Contractor& c) { return (c.work_bytes() + 255) / 256 * 256; }

 private:
  Loaded l_;
  bool time_steps_;
  tn::Contractor contractor_;
  Backend* backend_ = nullptr;
  bool timed_once_ = false;
};

// Sums each bitstring's slices (complex128) and the measured step times. A fold covers rows
// [first_, end_) (a row is one slice of one bitstring) and holds the sums of the bitstrings
// those rows touch; merging the next rows' fold adds its first bitstring to this one's last
// where they are the same and appends the rest. The engine merges in a fixed tree, so a
// bitstring's slices are summed pairwise.
class ContractReduction final : public engine::Reduction {
 public:
  // single: complex64 results; tropical: slices add in the tropical semiring (kernels/linalg/tropical.hpp)
  ContractReduction(std::uint64_t bitstrings, std::uint64_t slices, std::uint64_t elements, std::uint64_t steps, bool single,
                    bool tropical)
      : bitstrings_(bitstrings), slices_(slices), elements_(elements), steps_(steps), single_(single),
        tropical_(tropical), seconds_(steps, 0.0) {}
  std::unique_ptr<engine::Reduction> empty() const override {
    return std::make_unique<ContractReduction>(bitstrings_, slices_, elements_, steps_, single_, tropical_);
  }
  void fold(std::uint64_t row, const std::byte* p) override {
    first_ = row;
    end_ = row + 1;
    acc_.assign(elements_, 0.0);
    for (std::uint64_t i = 0; i < elements_; ++i) {
      if (single_) {
        std::complex<float> f;
        std::memcpy(&f, p + i * sizeof f, sizeof f);
        acc_[i] = f;
      } else {
        std::memcpy(&acc_[i], p + i * sizeof(cd), sizeof(cd));
      }
    }
    const std::byte* t = p + elements_ * (single_ ? 8 : 16);
    std::memcpy(&counts_, t + steps_ * sizeof(double), sizeof counts_);
    double first;
    std::memcpy(&first, t, sizeof first);
    if (steps_ && first >= 0) {
      for (std::uint64_t s = 0; s < steps_; ++s) std::memcpy(&seconds_[s], t + s * sizeof(double), sizeof(double));
      timed_ = 1;
    }
  }
  void merge(const engine::Reduction& other) override {
    const auto& right = static_cast<const ContractReduction&>(other);
    if (right.first_ == right.end_) return;
    if (first_ == end_) {
      *this = right;
      return;
    }
    if (right.first_ != end_) throw std::logic_error("tn.contract: folds merged out of row order");
    std::size_t skip = 0;  // the right's first bitstring continues this one's last
    if ((end_ - 1) / slices_ == right.first_ / slices_) {
      for (std::uint64_t i = 0; i < elements_; ++i) {
        cd& sum = acc_[acc_.size() - elements_ + i];
        sum = tropical_ ? tropical_plus(sum, right.acc_[i]) : sum + right.acc_[i];
      }
      skip = elements_;
    }
    acc_.insert(acc_.end(), right.acc_.begin() + static_cast<std::ptrdiff_t>(skip), right.acc_.end());
    end_ = right.end_;
    for (std::uint64_t s = 0; s < steps_; ++s) seconds_[s] += right.seconds_[s];
    timed_ += right.timed_;
    counts_.raw += right.counts_.raw;
    counts_.stored += right.counts_.stored;
    counts_.prologues += right.counts_.prologues;
  }
  std::string save() const override {
    std::string s;
    auto put = [&](const void* d, size_t n) { s.append(static_cast<const char*>(d), n); };
    put(&first_, 8);
    put(&end_, 8);
    put(&timed_, 8);
    put(acc_.data(), acc_.size() * sizeof(cd));
    put(seconds_.data(), seconds_.size() * sizeof(double));
    put(&counts_, sizeof counts_);
    return s;
  }
  void load(const std::string& s) override {
    size_t at = 0;
    auto get = [&](void* d, size_t n) {
      if (at + n > s.size()) throw std::runtime_error("tn.contract: a saved fold is truncated");
      std::memcpy(d, s.data() + at, n);
      at += n;
    };
    get(&first_, 8);
    get(&end_, 8);
    get(&timed_, 8);
    const std::uint64_t touched = end_ > first_ ? (end_ - 1) / slices_ - first_ / slices_ + 1 : 0;
    acc_.assign(touched * elements_, 0.0);
    get(acc_.data(), acc_.size() * sizeof(cd));
    get(seconds_.data(), seconds_.size() * sizeof(double));
    get(&counts_, sizeof counts_);
  }
  const RowCounts& counts() const { return counts_; }
  // Every bitstring's sums, once the fold covers the pass.
  const std::vector<cd>& result() const {
    if (first_ != 0 || end_ != bitstrings_ * slices_) throw std::logic_error("tn.contract: the fold does not cover the pass");
    return acc_;
  }
  std::vector<double> mean_seconds() const {
    std::vector<double> m(seconds_.size(), std::nan(""));
    if (timed_)
      for (size_t s = 0; s < m.size(); ++s) m[s] = seconds_[s] / static_cast<double>(timed_);
    return m;
  }

 private:
  // (x + i n read as the pair (x, n))
  static cd tropical_plus(cd a, cd b) {
    const kernels::Tropical t = kernels::tropical_plus({a.real(), a.imag()}, {b.real(), b.imag()});
    return {t.x, t.n};
  }
  std::uint64_t bitstrings_, slices_, elements_, steps_;
  bool single_, tropical_;
  std::uint64_t first_ = 0, end_ = 0;  // the rows folded
  std::vector<cd> acc_;                // per bitstring touched, elements_ sums
  std::vector<double> seconds_;
  std::uint64_t timed_ = 0;
  RowCounts counts_;  // summed over rows
};

// The first bitstring (or the value) contracted again in complex128 in full precision, after the
// pass, in what the device budget has left: the run's precision error, measured. The path and
// its sliced modes are the plan's; tn.plan adds slices if the complex128 arena needs them.
// Throws InputError when the budget leaves too little.
struct Reference {
  std::vector<cd> value;
  std::int64_t slices = 0;
  double seconds = 0;
};

Reference reference_contraction(const Loaded& l, Backend& be) {
  const auto start = std::chrono::steady_clock::now();
  tn::Path path;
  for (const auto& st : l.plan.steps) path.ssa.push_back({st.a, st.b});
  path.sliced = l.plan.sliced;
  tn::PlanOptions o;
  o.element_bytes = 16;  // (in core: the predictions' rates change nothing of the plan)
  const tn::Contractor probe(l.net, l.plan, h5::DType::complex128, kernels::Compute::full);
  const std::uint64_t result_bytes = probe.result_elements() * 16;
  const std::uint64_t fixed = probe.resident_bytes() + be.blas_stream_bytes() + result_bytes;
  const std::uint64_t free_bytes = be.device_budget().left();
  if (free_bytes <= fixed)
    throw InputError(fmt::format("its inputs need {} and the device budget has {} free",
                                 format_bytes(static_cast<double>(fixed)), format_bytes(static_cast<double>(free_bytes))));
  o.budget_bytes = free_bytes - fixed;
  const tn::Plan plan = tn::make_plan(l.net, path, o);
  tn::Contractor c(l.net, plan, h5::DType::complex128, kernels::Compute::full);
  auto stream = be.make_stream(true);
  c.upload(be, *stream);
  Buffer arena = be.alloc_device(std::max<std::uint64_t>(c.work_bytes(), 1), "tn: complex128 reference arena");
  Buffer out = be.alloc_device(result_bytes, "tn: complex128 reference result");
  Reference ref{std::vector<cd>(probe.result_elements(), 0.0), plan.slices, 0};
  std::vector<cd> part(ref.value.size());
  for (std::int64_t slice = 0; slice < plan.slices; ++slice) {
    c.contract(*stream, static_cast<std::uint64_t>(slice), l.bitstrings.front(), arena.data(), out.data(), nullptr);
    be.copy_to_host(part.data(), out.data(), result_bytes, *stream);
    stream->synchronize();
    for (size_t i = 0; i < part.size(); ++i) ref.value[i] += part[i];
  }
  ref.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ref;
}

// Each plan step against its roofline (tn::roofline_seconds at the rates the plan was made with,
// its `prediction`): step_bytes, step_flops, step_roofline_seconds, and step_of_roofline, the
// roofline's seconds over the measured ones (1: at the roofline; above 1 where a reduced compute
// mode outruns the plan's full-precision rate). The log names the step furthest below its roofline
// among those that took a tenth of the timed item or more.
void write_step_rooflines(const Loaded& l, const std::vector<double>& seconds, h5::File& out) {
  if (!l.no_prediction.empty()) {
    spdlog::warn("tn.contract: no step profile against the roofline: the plan's prediction could not be read ({})",
                 l.no_prediction);
    return;
  }
  const tn::Plan& plan = l.plan;
  if (plan.steps.size() != seconds.size()) return;  // (a plan for several ranks run on one: its own steps)
  const std::size_t n = plan.steps.size();
  std::vector<std::uint64_t> bytes(n);
  std::vector<double> flops(n), roofline(n), fraction(n);
  double timed = 0;
  for (double t : seconds) timed += std::isnan(t) ? 0 : t;
  std::size_t worst = n;
  for (std::size_t i = 0; i < n; ++i) {
    const tn::PlanStep& st = plan.steps[i];
    bytes[i] = tn::moved_bytes(st);
    flops[i] = st.flops;
    roofline[i] = tn::roofline_seconds(st, plan.bandwidth, plan.gemm_rate);
    fraction[i] = seconds[i] > 0 ? roofline[i] / seconds[i] : std::nan("");
    if (seconds[i] >= 0.1 * timed && !std::isnan(fraction[i]) && (worst == n || fraction[i] < fraction[worst])) worst = i;
  }
  auto column = [&](const char* name, h5::DType dtype, const void* data, const std::string& description) {
    h5::Dataset d = out.create_dataset(name, {{dtype, {n}, {}}, false});
    if (n) d.write_all(data);
    d.set_attribute("description", description);
    return d;
  };
  column("step_bytes", h5::DType::uint64, bytes.data(),
         "device bytes each plan step moves: its operands and result, and a packed step's transposes read and written");
  column("step_flops", h5::DType::float64, flops.data(), "real flops of each plan step (8 a complex multiply-add)");
  h5::Dataset r = column("step_roofline_seconds", h5::DType::float64, roofline.data(),
                         "each step's roofline: step_bytes at the plan's bandwidth or step_flops at its gemm_rate, "
                         "whichever is longer (the plan's prediction less host copies)");
  r.set_attribute("bandwidth", plan.bandwidth);
  r.set_attribute("gemm_rate", plan.gemm_rate);
  mark_measured(r);  // (the plan's rates were measured)
  h5::Dataset f = column("step_of_roofline", h5::DType::float64, fraction.data(),
                         "step_roofline_seconds / step_seconds: the fraction of its roofline each step reached "
                         "(NaN where it was not timed)");
  mark_measured(f);
  if (worst < n)
    spdlog::info("tn.contract: step {} (m {} n {} k {} over {} loops, {}) ran at {:.0f} % of its roofline, the least of "
                 "the steps that took a tenth of the timed item or more ({}; step_of_roofline has every step)",
                 worst, plan.steps[worst].m, plan.steps[worst].n, plan.steps[worst].k, plan.steps[worst].loops,
                 plan.steps[worst].execution == tn::Execution::packed   ? "packed"
                 : plan.steps[worst].execution == tn::Execution::looped ? "looped"
                                                                        : "in place",
                 100 * fraction[worst], format_duration(seconds[worst]));
}

// Writes the reference check's attributes: the relative 2-norm error of the first result against
// complex128, or why it was not measured.
double write_reference_check(const Loaded& l, Backend& be, const std::vector<cd>& result, h5::File& out) {
  try {
    const Reference ref = reference_contraction(l, be);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.value.size(); ++i) {
      diff += std::norm(result[i] - ref.value[i]);
      norm += std::norm(ref.value[i]);
    }
    const double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    out.set_attribute("reference_relative_error", rel);
    out.set_attribute("reference_slices", ref.slices);
    out.set_attribute("reference_seconds", ref.seconds);
    spdlog::info("tn.contract: the first result differs from its complex128 reference by {:.3g} (relative 2-norm; "
                 "reference in {})", rel, format_duration(ref.seconds));
    return rel;
  } catch (const InputError& e) {  // too little memory left: say so in the output, keep the result
    const std::string why = fmt::format("not measured: the complex128 reference does not fit ({})", e.what());
    out.set_attribute("reference_relative_error", std::nan(""));
    out.set_attribute("reference_note", why);
    spdlog::warn("tn.contract: {}", why);
    return std::nan("");
  }
}

// ------------------------------------------------------------ distributed (tn.plan's ranks: P)

// Whether this run contracts the plan distributed over its ranks: the plan was made for P ranks
// and the run has a multiple of P (G = ranks / P groups of P ranks, each contracting its share
// of the slices distributed over its P). A plan for P run on one rank runs its one-rank plan
// (the plan file holds both); on any other count it is refused.
bool distributed_run(const Loaded& l, const StepContext& ctx) {
  const int ranks = ctx.comm ? ctx.comm->size() : 1;
  if (!l.distribution || ranks == 1) return false;
  if (l.net.semiring == "tropical")
    throw InputError("the network is tropical, and its plan is for ranks sharing each slice (tn.plan's ranks); "
                     "expected a plan for one rank (tropical slices are spread over any number of ranks)");
  const int planned = l.distribution->at("ranks").get<int>();
  if (ranks % planned != 0)
    throw InputError(fmt::format("input 'plan' was made for {} ranks (tn.plan's ranks: {}) and this run has {}; expected "
                                 "mpirun -np {} (or a multiple: groups of {} share the slices), a plan made with ranks: "
                                 "{}, or one without ranks (its slices are then shared over the ranks)",
                                 planned, planned, ranks, planned, planned, ranks));
  return true;
}

// A distributed run: every rank takes part in every work item (a slice of a bitstring's network,
// contracted over a group of P ranks). Work items go round by round, item r G + g to group g;
// each group's first rank sums its items, and the groups' sums are added in group order at the
// end. A round is a unit of the step's run; a commit gathers the groups' sums on rank 0.
class DistributedContraction {
 public:
  DistributedContraction(const StepContext& ctx, const Loaded& l, const Params& p)
      : ctx_(ctx), l_(l), p_(p), plan_(tn::Plan::from_json(l.distribution->at("plan"))),
        P_(l.distribution->at("ranks").get<int>()), G_(ctx.comm->size() / P_), g_(ctx.comm->rank() / P_),
        group_(*ctx.comm, g_), S_(static_cast<std::uint64_t>(plan_.slices)), B_(l.bitstrings.size()), total_(B_ * S_),
        groups_(static_cast<std::uint64_t>(G_)), rounds_((total_ + groups_ - 1) / groups_), leader_(group_.comm().root()) {}

  bool done() const { return round_ >= rounds_; }
  // The next round: this group's work item, added to its sums.
  void next() {
    if (!dc_) set_up();
    const std::uint64_t item = round_ * groups_ + static_cast<std::uint64_t>(g_);
    if (item < total_) {
      tn::StepTimes times;
      // Group 0's second work item of the run is timed (the first sets up NCCL and the buffers),
      // or its only one.
      const bool time_it = g_ == 0 && p_.time_steps && timed_.is_null() && (round_ > first_round_ || round_ + 1 == rounds_);
      std::vector<cd> v;
      within_budget([&] { v = dc_->contract(*stream_, item % S_, l_.bitstrings.at(item / S_), time_it ? &times : nullptr); });
      if (time_it) {
        const auto sent = comm_->allgather(std::accumulate(times.sent_bytes.begin(), times.sent_bytes.end(), std::uint64_t{0}));
        timed_ = {{"compute_seconds", times.compute}, {"comm_seconds", times.comm}, {"sent_bytes", times.sent_bytes},
                  {"sent_bytes_per_rank", sent}, {"on_host", times.on_host}};
      }
      double* at = sums_.data() + 2 * R_ * (item / S_);
      for (std::uint64_t i = 0; i < R_; ++i) at[2 * i] += v[i].real(), at[2 * i + 1] += v[i].imag();
    }
    ++round_;
  }
  HostProgress progress() const { return {std::min(total_, round_ * groups_), total_, S_ > 1 ? "slices" : "amplitudes"}; }

  // Collective: the groups' sums on rank 0 (with the rounds and rank 0's timing), packed.
  std::string save() const {
    const std::vector<std::string> parts = gathered();
    Packer out;
    out.put(groups_), out.put(round_);
    out.put_string(timed_.dump());
    out.put<std::uint64_t>(parts.size());
    for (const std::string& part : parts) out.put_string(part);
    return out.take();
  }
  void load(std::string_view state) {
    Unpacker in(state);
    const auto groups = in.get<std::uint64_t>(), rounds = in.get<std::uint64_t>();
    if (groups != groups_)
      throw InputError(fmt::format("the stopped run shared the slices over {} groups of {} ranks and this one has {}; "
                                   "expected qstage resume under mpirun -np {}",
                                   groups, P_, groups_, groups * static_cast<std::uint64_t>(P_)));
    const json timed = json::parse(in.get_string());
    std::vector<std::string> parts(in.get<std::uint64_t>());
    for (std::string& part : parts) part = in.get_string();
    in.finish();
    if (parts.size() != groups_ || rounds > rounds_) throw std::runtime_error("a saved state of another contraction");
    round_ = first_round_ = rounds;
    timed_ = timed;
    if (leader_) sums_ = unpacked(parts.at(static_cast<std::size_t>(g_)));
  }
  // Collective, after the last round: every group's sums added in group order, and rank 0's
  // timing, on every rank.
  std::vector<double> finish() {
    Packer out;
    if (ctx_.comm->root()) {
      std::vector<double> total(2 * R_ * B_, 0.0);
      for (const std::string& part : gathered()) {
        const std::vector<double> v = unpacked(part);
        for (std::size_t i = 0; i < total.size(); ++i) total[i] += v[i];
      }
      out.put_vector(total);
      out.put_string(timed_.dump());
    } else {
      gathered();
    }
    const std::string bytes = ctx_.comm->broadcast(out.take());
    Unpacker in(bytes);
    std::vector<double> total = in.get_vector<double>();
    timed_ = json::parse(in.get_string());
    return total;
  }
  const json& timed() const { return timed_; }
  int ranks() const { return P_; }
  std::uint64_t groups() const { return groups_; }

 private:
  void set_up() {
    comm_.emplace(group_.comm(), ctx_.backend);
    dc_.emplace(l_.net, plan_, tn::DistributedSchedule::from_json(*l_.distribution), dtype_of_plan(plan_), p_.compute, *comm_);
    within_budget([&] {
      stream_ = ctx_.backend->make_stream(true);  // (its cuBLAS workspace is in the budget too)
      dc_->upload(*ctx_.backend, *stream_);
    });
    R_ = dc_->result_elements();
    if (sums_.empty()) sums_.assign(2 * R_ * B_, 0.0);
  }
  // A rank whose budget cannot hold its part ends the job at once (the others wait for it in an
  // all-to-all, and unwinding would close the MPI-IO files collectively), with exit 2 and the
  // rank's message.
  template <typename F>
  void within_budget(F&& work) {
    try {
      work();
    } catch (const BudgetExceeded& e) {
      mpi::abort_job(fmt::format("qstage: error: the distributed contraction on rank {}: {}; expected a larger "
                                 "--device-memory, or a plan for more ranks", ctx_.comm->rank(), e.what()),
                     kExitBadInput);
    }
  }
  // Every group's sums on rank 0, in group order (collective; empty elsewhere).
  std::vector<std::string> gathered() const {
    const std::string mine =
        leader_ ? std::string(reinterpret_cast<const char*>(sums_.data()), sums_.size() * sizeof(double)) : std::string();
    std::vector<std::string> parts;
    for (std::string& part : ctx_.comm->gather(mine))
      if (!part.empty()) parts.push_back(std::move(part));
    return parts;
  }
  static std::vector<double> unpacked(const std::string& bytes) {
    std::vector<double> v(bytes.size() / sizeof(double));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
    return v;
  }

  const StepContext& ctx_;
  const Loaded& l_;
  const Params& p_;
  const tn::Plan plan_;
  const int P_, G_, g_;
  const mpi::SubComm group_;
  const std::uint64_t S_, B_, total_, groups_, rounds_;
  const bool leader_;
  std::optional<comm::Communicator> comm_;
  std::optional<tn::DistributedContractor> dc_;
  std::unique_ptr<Stream> stream_;
  std::uint64_t R_ = 0, round_ = 0, first_round_ = 0;
  std::vector<double> sums_;  // (the group leader's: per bitstring, re and im interleaved)
  json timed_;                // group 0's measured work item, once timed
};

class ContractStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tn.contract", 3,  // 3: slices summed in a fixed tree (pairwise), not left to right
        "contracts a planned network: amplitudes (per bitstring) or the network's value, slices summed in a fixed order",
        {{"network", "a tn.build output"}, {"plan", "a tn.plan output of that network"}},
        "- id: amps\n  stage: tn.contract\n  inputs: {network: net, plan: plan}\n"};
    return info;
  }
  StagePlan plan(const json&, const std::map<std::string, DatasetInfo>&) const override {
    StagePlan plan;  // rows and sizes come from the inputs' content: the run's output()
    plan.pass.rows = 0;
    plan.primary_output = "amplitudes";
    plan.results = {{"amplitudes", {{h5::DType::complex128, {}, {}}}}, {"value", {{h5::DType::complex128, {}, {}}}}};
    return plan;
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  // Streams slices through the engine (the output pass), or, with a plan distributed over the
  // run's P ranks, contracts them round by round on every rank (units of host work).
  class Run final : public StepRun {
   public:
    explicit Run(const StepContext& ctx)
        : ctx_(ctx), l_(load_inputs(ctx)), p_(resolve_auto(Params::from_json(ctx.params), l_)) {
      if (distributed_run(l_, ctx)) distributed_.emplace(ctx, l_, p_);
    }
    bool done() const override { return !distributed_ || distributed_->done(); }
    std::optional<StepPass> next() override {
      distributed_->next();
      return std::nullopt;
    }
    HostProgress progress() const override { return distributed_->progress(); }
    std::string save() const override { return distributed_ ? distributed_->save() : std::string(); }
    void load(std::string_view state) override {
      if (distributed_) distributed_->load(state);
    }
    StepPass output(StagePlan& plan) override;
    void write(const StagePlan& plan, const StepPass& pass, h5::File& out) const override;
    std::string describe(const StagePlan& plan, const StepPass& pass) const override;

   private:
    // The sums per bitstring, the measured seconds per step and the prologues run: the pass's
    // reduction, or the distributed rounds'.
    struct Outcome {
      std::vector<cd> values;
      std::vector<double> seconds;
      RowCounts counts;
    };
    Outcome outcome(const StagePlan& plan, const StepPass& pass) const;

    const StepContext& ctx_;
    const Loaded l_;
    const Params p_;
    std::optional<DistributedContraction> distributed_;
    std::vector<double> distributed_sums_;  // (after the last round, on every rank)
  };

  // A distributed run's plan: no pass (host work on every rank); the summary of the plan for P.
  static void refine_distributed(StagePlan& plan, const Loaded& l, const Params& p, int ranks) {
    if (p.compress_spilled)
      throw InputError("parameter 'compress_spilled': a distributed contraction spills nothing; expected it left out "
                       "(or a plan without ranks)");
    const tn::Plan wide = tn::Plan::from_json(l.distribution->at("plan"));
    std::uint64_t R = 1;
    for (tn::Mode m : wide.output) R *= static_cast<std::uint64_t>(l.net.extent.at(m));
    const std::uint64_t B = l.bitstrings.size();
    plan.pass = engine::PassSpec{};
    plan.flops = wide.flops_per_bitstring_without_reuse() * static_cast<double>(B);
    plan.summary = {{"bitstrings", B}, {"slices", wide.slices}, {"result_elements", R}, {"steps", wide.steps.size()},
                    {"invariant_steps", 0}, {"persistent_bytes", 0}, {"precision", h5::dtype_name(dtype_of_plan(wide))},
                    {"kind", l.net.kind}, {"compute", kernels::compute_name(p.compute)}, {"reduced_steps", nullptr},
                    {"compute_auto", p.compute_auto}, {"max_error", p.max_error ? json(*p.max_error) : json(nullptr)},
                    {"reference_check", p.reference_check.value_or(p.compute != kernels::Compute::full)},
                    {"compress_spilled", nullptr}, {"distributed_ranks", l.distribution->at("ranks").get<int>()},
                    {"distributed_groups", ranks / l.distribution->at("ranks").get<int>()}};
  }
  // Its measurements beside the plan's predictions (the plan file's prediction, its distribution).
  static void write_distributed(const DistributedContraction& d, h5::File& out) {
    out.set_attribute("distributed_ranks", static_cast<std::int64_t>(d.ranks()));
    out.set_attribute("distributed_groups", static_cast<std::int64_t>(d.groups()));
    const json& t = d.timed();
    if (t.is_null()) return;
    auto column = [&](const char* name, const std::vector<double>& v, const char* doc) {
      h5::Dataset c = out.create_dataset(name, {{h5::DType::float64, {v.size()}, {}}, false});
      if (!v.empty()) c.write_all(v.data());
      c.set_attribute("description", doc);
      return c;
    };
    h5::Dataset compute = column("step_compute_seconds", t.at("compute_seconds").get<std::vector<double>>(),
           "rank 0's measured seconds of each step's GEMMs on its shard (the run's second work item, or its only one), beside the "
           "plan's prediction (distribution/steps/compute_seconds)");
    h5::Dataset comm = column("step_comm_seconds", t.at("comm_seconds").get<std::vector<double>>(),
           "rank 0's measured seconds of each step's all-to-alls (redistribution, gather), beside the plan's "
           "prediction (distribution/steps/comm_seconds)");
    mark_measured(compute);
    mark_measured(comm);
    std::vector<double> sent;
    for (const auto& b : t.at("sent_bytes")) sent.push_back(b.get<double>());
    column("step_sent_bytes", sent, "bytes rank 0 sent to other ranks in each step's all-to-alls");
    std::vector<double> per_rank;
    for (const auto& b : t.at("sent_bytes_per_rank")) per_rank.push_back(b.get<double>());
    column("sent_bytes_per_rank", per_rank, "bytes each rank sent to the others in the timed work item");
    if (t.contains("on_host")) {  // (a run resumed from a checkpoint of an earlier version has none)
      std::vector<double> on_host;
      for (const auto& b : t.at("on_host")) on_host.push_back(b.get<double>());
      column("step_shard_on_host", on_host,
             "1 where rank 0 held the step's result shard in host memory and streamed it through the device a slot at a time "
             "(out of core: a plan made with out_of_core whose shard did not fit the device budget), else 0");
    }
  }
};

StepPass ContractStage::Run::output(StagePlan& plan) {
  if (distributed_) {
    refine_distributed(plan, l_, p_, ctx_.comm->size());
    distributed_sums_ = distributed_->finish();
    return planned_pass(plan, no_pass_kernel());
  }
  const Loaded& l = l_;
  const Params& p = p_;
  const StepContext& ctx = ctx_;
  const auto dtype = dtype_of_plan(l.plan);
  const auto& spill = p.compress_spilled;
  const bool tropical = l.net.semiring == "tropical";
  const bool full = p.compute == kernels::Compute::full;
  if (tropical && (dtype != h5::DType::complex128 || !full || spill))
    throw InputError("the network is tropical (an exponent and a count in each entry): it contracts in complex128, "
                     "in full precision without compress_spilled; expected a tn.plan of precision complex128, compute "
                     "full and no compress_spilled");
  if (!full && dtype != h5::DType::complex64)
    throw InputError(fmt::format("parameter 'compute': {} needs a complex64 plan (complex128 runs in full precision); "
                                 "expected tn.plan's precision complex64 or compute full",
                                 kernels::compute_name(p.compute)));
  std::optional<tn::Contractor> probe;
  try {
    probe.emplace(l.net, l.plan, dtype, p.compute, std::filesystem::temp_directory_path(), spill);
  } catch (const InputError& e) {
    throw InputError(fmt::format("parameter 'compress_spilled': {}", e.what()));
  }
  // The reduced modes' staging takes what each slot has left beside its arena and result, down
  // to the minimum (the products are then tiled finer): a plan made to fill the device in full
  // precision still runs in a reduced mode.
  const std::uint64_t staging_cap = staging_left(*probe, *ctx.backend);
  probe->limit_staging(staging_cap);
  const tn::Contractor& c = *probe;
  const std::uint64_t B = l.bitstrings.size(), S = static_cast<std::uint64_t>(l.plan.slices);
  auto& pass = plan.pass;
  pass.rows = B * S;
  pass.progress_unit = S > 1 ? "slices" : "amplitudes";  // a row: one slice of one amplitude
  pass.tile_rows = 1;
  pass.batches.clear();
  for (std::uint64_t r = 0; r < pass.rows; ++r) pass.batches.push_back({r, r + 1});
  pass.tile_partial_bytes =
      c.result_elements() * c.element_bytes() + l.plan.steps.size() * sizeof(double) + sizeof(RowCounts);
  pass.partials_on_host = true;
  pass.scratch_device_bytes_per_row = ContractKernel::result_offset(c) + c.result_elements() * c.element_bytes();
  int reduced = 0;
  double reduced_flops = 0, flops = 0;
  for (const tn::PlanStep& st : l.plan.steps) {
    const double f = st.flops;  // (the plan's count, 8 per complex multiply-add)
    flops += f;
    if (c.reduced_step(st)) ++reduced, reduced_flops += f;
  }
  pass.resident_device_bytes = c.resident_bytes() + c.persistent_bytes() + c.spill_device_bytes(ctx.backend->kind());
  pass.uses_blas = true;
  plan.flops = l.plan.flops_per_bitstring() * static_cast<double>(B);
  plan.summary = {{"bitstrings", B},
                  {"slices", S},
                  {"result_elements", c.result_elements()},
                  {"steps", l.plan.steps.size()},
                  {"invariant_steps", l.plan.invariant_steps},
                  {"persistent_bytes", l.plan.persistent_bytes},
                  {"precision", h5::dtype_name(dtype)},
                  {"kind", l.net.kind},
                  {"compute", kernels::compute_name(p.compute)},
                  {"reduced_steps", full ? json(nullptr)
                                         : json{{"steps", reduced},
                                                {"flop_fraction", flops > 0 ? reduced_flops / flops : 0.0},
                                                {"staging_bytes", c.staging_bytes()},
                                                {"predicted_relative_error",
                                                 kernels::predicted_relative_error(p.compute, reduced)}}},
                  {"compute_auto", p.compute_auto},
                  {"max_error", p.max_error ? json(*p.max_error) : json(nullptr)},
                  {"reference_check", !tropical && p.reference_check.value_or(!full || spill)},
                  {"compress_spilled",
                   spill ? h5::codec_summary(*spill, std::nullopt, codec::ElementType::complex64) : json(nullptr)}};
  if (tropical) plan.summary["semiring"] = "tropical";  // (standard runs' summaries unchanged)
  const auto& summary = plan.summary;
  return planned_pass(
      plan, std::make_unique<ContractKernel>(l_, p_.compute, staging_cap, p_.scratch_dir, p_.compress_spilled, p_.time_steps),
      std::make_unique<ContractReduction>(summary.at("bitstrings"), summary.at("slices"), summary.at("result_elements"),
                                          summary.at("steps"), summary.at("precision") == "complex64", tropical));
}

ContractStage::Run::Outcome ContractStage::Run::outcome(const StagePlan& plan, const StepPass& pass) const {
  Outcome o;
  if (!distributed_) {
    const auto& red = static_cast<const ContractReduction&>(*pass.reduction);
    o.values = red.result();
    o.seconds = red.mean_seconds();
    o.counts = red.counts();
    return o;
  }
  for (std::size_t i = 0; i + 1 < distributed_sums_.size(); i += 2)
    o.values.emplace_back(distributed_sums_[i], distributed_sums_[i + 1]);
  const json& t = distributed_->timed();
  o.seconds.assign(plan.summary.at("steps").get<std::size_t>(), std::nan(""));
  if (!t.is_null())
    for (std::size_t i = 0; i < o.seconds.size(); ++i)
      o.seconds[i] = t.at("compute_seconds")[i].get<double>() + t.at("comm_seconds")[i].get<double>();
  return o;
}

void ContractStage::Run::write(const StagePlan& plan, const StepPass& pass, h5::File& out) const {
  const Outcome result = outcome(plan, pass);
  const auto& s = plan.summary;
  const std::uint64_t B = s.at("bitstrings"), R = s.at("result_elements");
  const std::string name = s.at("kind") == "amplitude" ? "amplitudes" : "value";
  h5::Shape shape = R == 1 ? h5::Shape{B} : h5::Shape{B, R};
  if (name == "value") shape = {R};
  h5::Dataset d = out.create_dataset(name, {{h5::DType::complex128, shape, {}}, false});
  d.write_all(result.values.data());
  if (s.contains("semiring")) {  // tropical: the pairs apart, as h5py users read them
    std::vector<double> exponent, count;
    for (const cd& v : result.values) exponent.push_back(v.imag() > 0 ? v.real() : -INFINITY), count.push_back(v.imag());
    h5::Dataset x = out.create_dataset("exponent", {{h5::DType::float64, shape, {}}, false});
    x.write_all(exponent.data());
    x.set_attribute("description", "the largest exponent over the configurations (a maximum independent set's size, "
                                   "-E_0 of a spin glass); -inf where none is allowed");
    h5::Dataset n = out.create_dataset("count", {{h5::DType::float64, shape, {}}, false});
    n.write_all(count.data());
    n.set_attribute("description", "how many configurations reach that exponent (exact below 2^53)");
    out.set_attribute("semiring", s.at("semiring").get<std::string>());
  }
  const bool circuit = s.at("kind") != "generic", check = s.at("reference_check");
  const Loaded& l = l_;
  if (circuit) {  // the layout tn.statevector writes too
    tn::write_result_layout(out, l.bitstrings, l.net.qubits, l.net.open_qubits, l.net.pauli, s.at("precision"));
  } else {
    d.set_attribute("description", "the contracted network: its output modes in order, flattened row-major");
  }
  const double measured = check ? write_reference_check(l, *ctx_.backend, result.values, out) : std::nan("");
  if (!s.at("max_error").is_null()) {
    const double max_error = s.at("max_error").get<double>();
    out.set_attribute("max_error", max_error);
    // A result whose measured error is over the bound says so (the prediction is a model).
    if (measured > max_error) {
      out.set_attribute("max_error_exceeded", std::int64_t{1});
      spdlog::warn("tn.contract: the first result's measured error {:.3g} exceeds max_error {:.3g} (compute {}): "
                   "choose a more precise compute mode", measured, max_error, s.at("compute").get<std::string>());
    }
  }
  const auto& seconds = result.seconds;
  h5::Dataset t = out.create_dataset("step_seconds", {{h5::DType::float64, {seconds.size()}, {}}, false});
  if (!seconds.empty()) t.write_all(seconds.data());
  t.set_attribute("description",
                  "measured seconds of each plan step (mean over the timed work items), to set "
                  "beside the plan's steps/predicted_seconds; NaN where no item was timed "
                  "(time_steps: false, or a run resumed after its timed item)");
  mark_measured(t);
  if (!distributed_) write_step_rooflines(l, seconds, out);
  out.set_attribute("slices", static_cast<std::int64_t>(s.at("slices").get<std::uint64_t>()));
  out.set_attribute("invariant_steps", static_cast<std::int64_t>(s.at("invariant_steps").get<int>()));
  out.set_attribute("prologue_runs", static_cast<std::int64_t>(result.counts.prologues));
  if (distributed_) write_distributed(*distributed_, out);
  if (s.at("kind") == "generic") out.set_attribute("precision", s.at("precision").get<std::string>());
  out.set_attribute("compute", s.at("compute").get<std::string>());
  if (s.at("compute_auto").get<bool>()) out.set_attribute("compute_requested", std::string("auto"));
  if (!s.at("reduced_steps").is_null()) out.set_attribute("reduced_steps", s.at("reduced_steps").dump());
  if (!s.at("compress_spilled").is_null()) {
    const RowCounts& c = result.counts;
    out.set_attribute("compress_spilled", s.at("compress_spilled").dump());
    out.set_attribute("spilled_raw_bytes", c.raw);
    out.set_attribute("spilled_stored_bytes", c.stored);
    out.set_attribute("spilled_ratio", c.stored ? static_cast<double>(c.raw) / static_cast<double>(c.stored) : 0.0);
  }
}

std::string ContractStage::Run::describe(const StagePlan& plan, const StepPass& pass) const {
  const std::vector<cd> v = outcome(plan, pass).values;
  if (v.empty()) return "";
  const std::string over = plan.summary.contains("distributed_ranks")
                               ? fmt::format(", distributed over {} ranks ({} group(s) sharing the slices)",
                                             plan.summary.at("distributed_ranks").get<int>(),
                                             plan.summary.at("distributed_groups").get<int>())
                               : std::string();
  if (plan.summary.contains("semiring"))
    return fmt::format("{} tropical value(s) over {} slice(s){}; first: exponent {:.9g} reached by {:.17g} configuration(s)",
                       v.size(), plan.summary.at("slices").get<std::uint64_t>(), over, v[0].real(), v[0].imag());
  return fmt::format("{} value(s) over {} slice(s){}; first ({:.9g}{:+.9g}i)", v.size(),
                     plan.summary.at("slices").get<std::uint64_t>(), over, v[0].real(), v[0].imag());
}

}  // namespace

const Stage& tn_contract() {
  static const ContractStage stage;
  return stage;
}

}  // namespace qstage::stages
