// tn.contract: executes a plan. Work items (rows of the pass) are (bitstring, slice) pairs, rows
// bitstring-major; each is one contraction into the arena the plan laid out. The plan's
// invariant steps (the prologue) run once per bitstring on each rank, into the persistent region
// the slices then read (Contractor). Results are summed over slices in row order on rank 0
// (complex128), so the answer is the same for any rank count, and completed slices are
// checkpointed like any other batch. With tf32 (or reference_check), the first result
// is contracted again in complex128 after the pass, and its measured error is written beside it.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <optional>

#include "core/error.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "spec/schema.hpp"
#include "stages/compress/common.hpp"
#include "stages/params.hpp"
#include "stages/tn/contractor.hpp"
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
  tn::Plan plan;
  std::vector<std::vector<std::uint8_t>> bitstrings;  // amplitude networks (else one empty)
};

Loaded load(const KernelContext& ctx) {
  Loaded l;
  h5::File nf = h5::File::open(ctx.inputs.at("network")->where().file, h5::Mode::read_only);
  l.net = tn::load_network(nf);
  h5::File pf = h5::File::open(ctx.inputs.at("plan")->where().file, h5::Mode::read_only);
  l.plan = tn::Plan::from_json(tn::read_json_dataset(pf, "plan"));
  if (l.plan.input_layouts.size() != l.net.tensors.size())
    throw InputError(fmt::format("the plan has {} input tensors and the network {}; expected a plan of this network",
                                 l.plan.input_layouts.size(), l.net.tensors.size()));
  if (l.net.kind == "amplitude") l.bitstrings = tn::read_bitstrings(nf);
  if (l.bitstrings.empty()) l.bitstrings.emplace_back();
  return l;
}

h5::DType dtype_of_plan(const tn::Plan& p) { return p.element_bytes == 16 ? h5::DType::complex128 : h5::DType::complex64; }

struct Params {
  bool tf32;
  bool time_steps;
  std::optional<bool> reference_check;  // none: check where tf32 or compress_spilled loses precision
  std::filesystem::path scratch_dir;    // for spilled intermediates' scratch files
  std::optional<codec::Settings> compress_spilled;
  static Params from_json(const json& p) {
    Params r;
    r.tf32 = p.at("tf32").get<bool>();
    r.time_steps = p.at("time_steps").get<bool>();
    r.reference_check = params::optional<bool>(p, "reference_check");
    const std::string dir = p.value("scratch_dir", "");
    r.scratch_dir = dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(dir);
    if (p.contains("compress_spilled")) {  // the codec's settings, their defaults filled in
      const json& schema = parameter_schema(tn_contract()).at("properties").at("compress_spilled");
      r.compress_spilled = compress_detail::settings_from(spec::with_defaults(schema, p.at("compress_spilled")));
    }
    return r;
  }
};

// Each work item's partial: its result, the measured step seconds, then these counts.
struct RowCounts {
  std::uint64_t raw = 0, stored = 0;  // spilled bytes it coded and their streams' bytes (compress_spilled)
  std::uint64_t prologues = 0;        // prologues it ran (0 or 1)
};

class ContractKernel final : public engine::PassKernel {
 public:
  ContractKernel(Loaded loaded, bool tf32, std::filesystem::path scratch_dir, std::optional<codec::Settings> spill,
                 bool time_steps)
      : l_(std::move(loaded)),
        time_steps_(time_steps),
        contractor_(l_.net, l_.plan, dtype_of_plan(l_.plan), tf32, std::move(scratch_dir), spill) {}
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
    char* result = static_cast<char*>(b.scratch) + result_offset(l_.plan);
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
  // Where a row's result goes in its scratch: after the arena, 256-byte aligned.
  static std::uint64_t result_offset(const tn::Plan& plan) { return (plan.arena_bytes + 255) / 256 * 256; }

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
  ContractReduction(std::uint64_t bitstrings, std::uint64_t slices, std::uint64_t elements, std::uint64_t steps, bool single)
      : bitstrings_(bitstrings), slices_(slices), elements_(elements), steps_(steps), single_(single),
        seconds_(steps, 0.0) {}
  std::unique_ptr<engine::Reduction> empty() const override {
    return std::make_unique<ContractReduction>(bitstrings_, slices_, elements_, steps_, single_);
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
      for (std::uint64_t i = 0; i < elements_; ++i) acc_[acc_.size() - elements_ + i] += right.acc_[i];
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
  std::uint64_t bitstrings_, slices_, elements_, steps_;
  bool single_;
  std::uint64_t first_ = 0, end_ = 0;  // the rows folded
  std::vector<cd> acc_;                // per bitstring touched, elements_ sums
  std::vector<double> seconds_;
  std::uint64_t timed_ = 0;
  RowCounts counts_;  // summed over rows
};

// The first bitstring (or the value) contracted again in complex128 without TF32, after the
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
  o.element_bytes = 16;
  o.bandwidth = l.plan.bandwidth;
  o.gemm_rate = l.plan.gemm_rate;
  const tn::Contractor probe(l.net, l.plan, h5::DType::complex128, false);
  const std::uint64_t result_bytes = probe.result_elements() * 16;
  const std::uint64_t fixed = probe.resident_bytes() + be.blas_stream_bytes() + result_bytes;
  const std::uint64_t free_bytes = be.device_budget().limit() - be.device_budget().in_use();
  if (free_bytes <= fixed)
    throw InputError(fmt::format("its inputs need {} and the device budget has {} free",
                                 format_bytes(static_cast<double>(fixed)), format_bytes(static_cast<double>(free_bytes))));
  o.budget_bytes = free_bytes - fixed;
  const tn::Plan plan = tn::make_plan(l.net, path, o);
  tn::Contractor c(l.net, plan, h5::DType::complex128, false);
  auto stream = be.make_stream(true);
  c.upload(be, *stream);
  Buffer arena = be.alloc_device(std::max<std::uint64_t>(plan.arena_bytes, 1), "tn: complex128 reference arena");
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

// Writes the reference check's attributes: the relative 2-norm error of the first result against
// complex128, or why it was not measured.
void write_reference_check(const Loaded& l, Backend& be, const std::vector<cd>& result, h5::File& out) {
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
  } catch (const InputError& e) {  // too little memory left: say so in the output, keep the result
    const std::string why = fmt::format("not measured: the complex128 reference does not fit ({})", e.what());
    out.set_attribute("reference_relative_error", std::nan(""));
    out.set_attribute("reference_note", why);
    spdlog::warn("tn.contract: {}", why);
  }
}

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
    StagePlan plan;  // rows and sizes come from the inputs' content: refine_plan
    plan.pass.rows = 0;
    plan.primary_output = "amplitudes";
    plan.results = {{"amplitudes", {{h5::DType::complex128, {}, {}}}}, {"value", {{h5::DType::complex128, {}, {}}}}};
    return plan;
  }
  void refine_plan(StagePlan& plan, const KernelContext& ctx) const override {
    const Loaded l = load(ctx);
    const auto dtype = dtype_of_plan(l.plan);
    const Params p = Params::from_json(ctx.params);
    const auto& spill = p.compress_spilled;
    std::optional<tn::Contractor> probe;
    try {
      probe.emplace(l.net, l.plan, dtype, false, std::filesystem::temp_directory_path(), spill);
    } catch (const InputError& e) {
      throw InputError(fmt::format("parameter 'compress_spilled': {}", e.what()));
    }
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
    pass.scratch_device_bytes_per_row = ContractKernel::result_offset(l.plan) + c.result_elements() * c.element_bytes();
    pass.resident_device_bytes = c.resident_bytes() + c.persistent_bytes() + c.spill_device_bytes(ctx.backend->kind());
    pass.uses_blas = true;
    plan.flops = l.plan.flops_per_bitstring() * static_cast<double>(B);
    plan.summary = {{"bitstrings", B}, {"slices", S}, {"result_elements", c.result_elements()},
                    {"steps", l.plan.steps.size()}, {"invariant_steps", l.plan.invariant_steps},
                    {"persistent_bytes", l.plan.persistent_bytes}, {"precision", h5::dtype_name(dtype)}, {"kind", l.net.kind},
                    {"tf32", p.tf32}, {"reference_check", p.reference_check.value_or(p.tf32 || spill)},
                    {"compress_spilled", spill ? h5::codec_summary(*spill, std::nullopt, codec::ElementType::complex64)
                                               : json(nullptr)}};
  }
  std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const override {
    const Params p = Params::from_json(ctx.params);
    return std::make_unique<ContractKernel>(load(ctx), p.tf32, p.scratch_dir, p.compress_spilled, p.time_steps);
  }
  std::unique_ptr<engine::Reduction> make_reduction(const StagePlan& plan) const override {
    const auto& s = plan.summary;
    return std::make_unique<ContractReduction>(s.at("bitstrings"), s.at("slices"), s.at("result_elements"), s.at("steps"),
                                               s.at("precision") == "complex64");
  }
  void write_results(const StagePlan& plan, const StepResults& r, h5::File& out) const override {
    const auto& red = static_cast<ContractReduction&>(*r.reduction);
    const auto& s = plan.summary;
    const std::uint64_t B = s.at("bitstrings"), R = s.at("result_elements");
    const std::string name = s.at("kind") == "amplitude" ? "amplitudes" : "value";
    h5::Shape shape = R == 1 ? h5::Shape{B} : h5::Shape{B, R};
    if (name == "value") shape = {R};
    h5::Dataset d = out.create_dataset(name, {{h5::DType::complex128, shape, {}}, false});
    d.write_all(red.result().data());
    const bool circuit = s.at("kind") != "generic", check = s.at("reference_check");
    std::optional<Loaded> l;  // the network and plan, read once if needed
    if (circuit || check) l = load(*r.context);
    if (circuit) {  // the layout tn.statevector writes too
      tn::write_result_layout(out, l->bitstrings, l->net.qubits, l->net.open_qubits, l->net.pauli, s.at("precision"));
    } else {
      d.set_attribute("description", "the contracted network: its output modes in order, flattened row-major");
    }
    if (check) write_reference_check(*l, *r.context->backend, red.result(), out);
    const auto seconds = red.mean_seconds();
    h5::Dataset t = out.create_dataset("step_seconds", {{h5::DType::float64, {seconds.size()}, {}}, false});
    if (!seconds.empty()) t.write_all(seconds.data());
    t.set_attribute("description", "measured seconds of each plan step (mean over the timed work items), to set "
                                   "beside the plan's steps/predicted_seconds; NaN where no item was timed "
                                   "(time_steps: false, or a run resumed after its timed item)");
    out.set_attribute("slices", static_cast<std::int64_t>(s.at("slices").get<std::uint64_t>()));
    out.set_attribute("invariant_steps", static_cast<std::int64_t>(s.at("invariant_steps").get<int>()));
    out.set_attribute("prologue_runs", static_cast<std::int64_t>(red.counts().prologues));
    if (s.at("kind") == "generic") out.set_attribute("precision", s.at("precision").get<std::string>());
    out.set_attribute("tf32", static_cast<std::int64_t>(s.at("tf32").get<bool>()));
    if (!s.at("compress_spilled").is_null()) {
      const RowCounts& c = red.counts();
      out.set_attribute("compress_spilled", s.at("compress_spilled").dump());
      out.set_attribute("spilled_raw_bytes", c.raw);
      out.set_attribute("spilled_stored_bytes", c.stored);
      out.set_attribute("spilled_ratio", c.stored ? static_cast<double>(c.raw) / static_cast<double>(c.stored) : 0.0);
    }
  }
  std::string describe_results(const StagePlan& plan, const StepResults& r) const override {
    const auto& red = static_cast<ContractReduction&>(*r.reduction);
    const auto& v = red.result();
    if (v.empty()) return "";
    return fmt::format("{} value(s) over {} slice(s); first ({:.9g}{:+.9g}i)", v.size(),
                       plan.summary.at("slices").get<std::uint64_t>(), v[0].real(), v[0].imag());
  }
};

}  // namespace

const Stage& tn_contract() {
  static const ContractStage stage;
  return stage;
}

}  // namespace qstage::stages
