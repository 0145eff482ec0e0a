// tn.plan: a path made executable - GEMM-ready layouts (seed 000's backward lifetime pass),
// slicing to fit one contraction's arena in the device budget, the steps that need not run per
// slice (reuse_invariant), the memory plan, and predicted times from the bandwidth and GEMM rate
// measured on the device at hand (eq. 6). The schedule (dataset `plan`) and the prediction
// (dataset `prediction`: the rates and the seconds predicted from them) are written apart: where
// a rate was measured, the prediction is a measurement (stages::mark_measured), which differs
// from run to run, and the schedule is what the steps reading the plan are keyed on.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.hpp"
#include "core/units.hpp"
#include "kernels/linalg/gemm.hpp"
#include "kernels/tensor/random.hpp"
#include "stages/common/params.hpp"
#include "stages/tn/distribution.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/plan.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;

double median_seconds(const std::function<void()>& f) {
  f();  // warm up
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

// Device bandwidth (bytes read + written per second) and GEMM rate, measured now with buffers
// that fit what is left of the device budget (at most 64 MiB per copy buffer, n = 2048 GEMMs on
// cuda). Small buffers understate a GPU's rates; the prediction is a guide, not a promise.
std::pair<double, double> measure(Backend& be, h5::DType dtype) {
  auto s = be.make_stream(true);  // (its cuBLAS workspace is charged before what is left is read)
  const std::uint64_t free_bytes = be.device_budget().left();
  const std::size_t copy_bytes = std::min<std::uint64_t>(64u << 20, free_bytes / 2) & ~std::uint64_t{255};
  const std::size_t e = h5::dtype_size(dtype);
  std::int64_t n = be.kind() == BackendKind::cuda ? 2048 : 512;
  while (n > 64 && static_cast<std::uint64_t>(3 * n * n) * e > free_bytes) n /= 2;
  if (copy_bytes < 4096 || static_cast<std::uint64_t>(3 * n * n) * e > free_bytes)
    throw InputError(fmt::format("tn.plan: the device budget leaves {} free, too little to measure the device; "
                                 "give params.bandwidth and params.gemm_rate or a larger --device-memory",
                                 format_bytes(static_cast<double>(free_bytes))));
  // One buffer for both measurements: the device pool keeps what is freed (charged, idle), so a
  // second allocation of another size would be charged beside the first.
  const std::size_t matrix = static_cast<std::size_t>(n * n) * e;
  Buffer work = be.alloc_device(std::max(2 * copy_bytes, 3 * matrix), "tn.plan: measurement");
  char* base = static_cast<char*>(work.data());
  kernels::random_fill(*s, {h5::DType::float32, 1, 0, copy_bytes / 4, base});
  const double copy = median_seconds([&] {
    be.copy_on_device(base + copy_bytes, base, copy_bytes, *s);
    s->synchronize();
  });
  kernels::random_fill(*s, {h5::DType::float32, 1, 0, 2 * matrix / 4, base});
  kernels::Gemm g{dtype, n, n, n, base, n, base + matrix, n, base + 2 * matrix, n};
  g.b_transposed = true;
  const double gemm = median_seconds([&] {
    kernels::gemm(*s, g);
    s->synchronize();
  });
  return {2.0 * static_cast<double>(copy_bytes) / copy, kernels::gemm_flops(g) / gemm};
}

// Host-to-device copy rate from pinned memory (64 MiB, or what the budgets leave), for the
// out-of-core predictions.
double measure_pcie(Backend& be) {
  const std::uint64_t free_device = be.device_budget().left();
  const std::uint64_t free_host = be.host_budget().left();
  const std::size_t bytes = std::min<std::uint64_t>({64u << 20, free_device / 2, free_host / 2}) & ~std::uint64_t{255};
  if (bytes < 4096)
    throw InputError("tn.plan: the budgets leave too little to measure host copies; give params.pcie_bandwidth");
  auto s = be.make_stream(false);
  Buffer h = be.alloc_host(bytes, "tn.plan: measurement"), d = be.alloc_device(bytes, "tn.plan: measurement");
  std::memset(h.data(), 0, bytes);
  const double t = median_seconds([&] {
    be.copy_to_device(d.data(), h.data(), bytes, *s);
    s->synchronize();
  });
  return static_cast<double>(bytes) / t;
}

struct Params {
  h5::DType precision;
  std::optional<std::uint64_t> budget;           // bytes of one contraction; none: from the device budget
  std::optional<double> bandwidth, gemm_rate;    // eq. 6's rates (used when both are given); none: measured
  double max_slices;
  bool reconfigure;
  int subtree_size;
  bool reuse_invariant;
  bool fuse_gates;
  bool out_of_core;
  bool scratch;                                  // (out of core only)
  std::optional<std::uint64_t> host_budget;      // (read out of core only); none: from --host-memory
  std::optional<double> pcie_bandwidth;          // (out of core only); none: measured
  int ranks = 1;                                 // P > 1: also plan the contraction sharded over P ranks (distribution)
  std::optional<std::uint64_t> large_bytes;      // (ranks > 1) the threshold of a large step; none: chosen by the cost model
  double net_bandwidth = 0, latency = 0;         // (ranks > 1) eq. 7's B_net and lambda within a node
  int node_ranks = 8;                            // ranks a node holds (NVLink among them)
  double inter_node_bandwidth = 0;               // B_net beyond one node (InfiniBand)
  static Params from_json(const json& p) {
    Params r;
    r.precision = params::precision(p);
    r.budget = params::optional_size(p, "budget");
    r.bandwidth = params::optional<double>(p, "bandwidth");
    r.gemm_rate = params::optional<double>(p, "gemm_rate");
    r.max_slices = p.at("max_slices").get<double>();
    r.reconfigure = p.at("reconfigure").get<bool>();
    r.subtree_size = p.at("subtree_size").get<int>();
    r.reuse_invariant = p.at("reuse_invariant").get<bool>();
    r.fuse_gates = p.at("fuse_gates").get<bool>();
    r.out_of_core = p.at("out_of_core").get<bool>();
    r.scratch = r.out_of_core && p.at("scratch").get<bool>();
    if (r.out_of_core) {  // (a host_budget without out_of_core is not looked at)
      r.host_budget = params::optional_size(p, "host_budget");
      r.pcie_bandwidth = params::optional<double>(p, "pcie_bandwidth");
    }
    r.ranks = p.at("ranks").get<int>();
    if (r.ranks > 1) {
      r.large_bytes = params::optional_size(p, "large_bytes");
      r.net_bandwidth = p.at("net_bandwidth").get<double>();
      r.latency = p.at("latency").get<double>();
      r.node_ranks = p.at("node_ranks").get<int>();
      r.inter_node_bandwidth = p.at("inter_node_bandwidth").get<double>();
    }
    return r;
  }
};

// The contraction planned for P ranks (seed 000 section IV-B, stages/tn/distribution.hpp): sliced
// against the ranks' memory together (P budgets: the large intermediates are sharded, so P ranks
// hold what one budget P times as large would), then its large steps' distribution planned over
// eq. 5-7, and the what-if figures of seed 000 section V-A against this plan (one rank): R_P
// (eq. 11, the flops of every slice of one plan over the other's), the projected speed-up S_P
// (eq. 9, predicted seconds per slice times slices) and E_P = S_P / P (eq. 10). No GPUs needed.
// Out of core, the P-rank plan spills as the one-rank plan does (against P host budgets) and its
// slots are limited, so that tn.contract can stream a rank's shard through its device.
constexpr std::uint64_t kSlotsPerBudget = 8;

struct Distributed {
  json schedule;    // what tn.contract runs under mpirun -np P, and the what-if figures of flops
  json prediction;  // the projected seconds, S_P and E_P
};

Distributed distributed(const tn::Network& net, const tn::Path& path, const tn::PlanOptions& one_rank, const tn::Plan& plan,
                        const Params& p) {
  tn::PlanOptions o = one_rank;
  const double ranks = p.ranks;
  const auto times_ranks = [&](std::uint64_t bytes) {  // (saturating)
    const auto P = static_cast<std::uint64_t>(p.ranks);
    return bytes > ~std::uint64_t{0} / P ? ~std::uint64_t{0} : bytes * P;
  };
  o.budget_bytes = times_ranks(one_rank.budget_bytes);
  o.host_budget_bytes = times_ranks(one_rank.host_budget_bytes);  // (out of core: the shards' host memory)
  const tn::Plan wide = tn::make_plan(net, path, o);
  tn::DistributionOptions d;
  d.ranks = p.ranks;
  // Out of core, a rank streams its shard through the device a slot at a time: a slot, the next
  // one's operand, the all-to-all's send and receive buffers and the packing workspace are on the
  // device together, so a slot takes at most an eighth of the rank's budget.
  if (o.out_of_core) {
    d.slot_bytes = std::max<std::uint64_t>(1, one_rank.budget_bytes / kSlotsPerBudget);
    d.device_bytes = one_rank.budget_bytes;
    d.host_bandwidth = o.pcie_bandwidth;
  }
  d.element_bytes = o.element_bytes;
  d.device_bandwidth = o.bandwidth, d.device_rate = o.gemm_rate;
  // (an all-to-all over several nodes runs at the slower links' rate)
  d.net_bandwidth = p.ranks <= p.node_ranks ? p.net_bandwidth : p.inter_node_bandwidth;
  d.latency = p.latency;
  // Projected times of one bitstring (eq. 8): invariant steps once, the others in every slice.
  auto projected = [&](const tn::DistributionPlan& dist) {
    double tp = 0;
    for (std::size_t s = 0; s < wide.steps.size(); ++s)
      tp += (dist.steps[s].compute_seconds + dist.steps[s].comm_seconds) *
            (wide.steps[s].invariant ? 1.0 : static_cast<double>(wide.slices));
    return tp;
  };
  // Without large_bytes, the threshold whose plan the cost model projects fastest: a quarter of
  // the budget and every 4x below it down to 64 KiB (lower thresholds put more steps in chains,
  // fewer replicated on every rank, against more all-to-alls; on 2 H200s 8 MiB beat 256 MiB by
  // 1.19x at a 1 GiB budget, as projected).
  std::vector<std::uint64_t> thresholds;
  if (p.large_bytes) thresholds.push_back(*p.large_bytes);
  else
    for (std::uint64_t t = std::max<std::uint64_t>(1, one_rank.budget_bytes / 4); ; t /= 4) {
      thresholds.push_back(t);
      if (t < 4 * (std::uint64_t{64} << 10)) break;
    }
  tn::DistributionPlan dist;
  double tp = 0;
  json tried = json::array();
  for (std::uint64_t t : thresholds) {
    tn::DistributionOptions candidate = d;
    candidate.large_bytes = t;
    tn::DistributionPlan made = tn::plan_distribution(net, wide.steps, candidate);
    const double seconds = projected(made);
    tried.push_back({{"large_bytes", t}, {"predicted_seconds_total", seconds}});
    if (tried.size() == 1 || seconds < tp) dist = std::move(made), tp = seconds, d.large_bytes = t;
  }
  const double t1 = plan.predicted_seconds_per_bitstring();
  Distributed out{dist.to_json(), dist.prediction_json()};
  json& j = out.schedule;
  j["large_bytes"] = d.large_bytes;
  j["net_bandwidth"] = d.net_bandwidth;
  j["latency"] = d.latency;
  j["budget_bytes_per_rank"] = one_rank.budget_bytes;
  j["slices"] = wide.slices;
  j["sliced"] = wide.sliced;
  j["flops_total"] = wide.flops_per_bitstring();
  j["node_ranks"] = p.node_ranks;
  j["R_P"] = plan.flops_per_bitstring() / wide.flops_per_bitstring();
  j["plan"] = wide.to_json();  // what tn.contract runs under mpirun -np P (its steps, layouts and slices)
  json& e = out.prediction;
  if (!p.large_bytes) e["large_bytes_tried"] = tried;
  e["predicted_seconds_total"] = tp;
  e["S_P"] = t1 / tp;
  e["E_P"] = t1 / tp / ranks;
  e["plan"] = wide.prediction_json();
  return out;
}

class PlanStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tn.plan", 10,  // 8: the plan for P ranks is in the distribution; 9: the prediction apart from the plan;
                        // 10: gate chains fused
        "an executable schedule: GEMM-ready mode orders, slicing to fit the device budget, memory plan, predicted times",
        {{"network", "a tn.build output"}, {"path", "a tn.path output"}},
        "- id: plan\n  stage: tn.plan\n  inputs: {network: net, path: path}\n  params: {precision: complex64}\n"};
    return info;
  }
  StagePlan plan(const json&, const std::map<std::string, DatasetInfo>&) const override {
    return computed_plan({{"plan", {{h5::DType::uint8, {}, {}}}}, {"prediction", {{h5::DType::uint8, {}, {}}}}});
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  // What it computed: the schedule and its prediction as written (JSON, shared with the later
  // steps of the process: stages/common/kept.hpp), and the plan they describe. They are the run's
  // state too.
  class Run final : public ComputedRun {
   public:
    using ComputedRun::ComputedRun;
    void compute() override;
    std::string save() const override {
      return json{{"plan", output_->plan}, {"prediction", output_->prediction}}.dump();
    }
    void load(std::string_view state) override {
      json j = json::parse(state);
      output_ = std::make_shared<const tn::PlanOutput>(
          tn::PlanOutput{std::move(j.at("plan")), std::move(j.at("prediction"))});
      plan_ = tn::Plan::from_json(output_->plan, output_->prediction);
    }
    void write(const StagePlan&, const StepPass&, h5::File& out) const override;
    std::string describe(const StagePlan&, const StepPass&) const override;

   private:
    std::shared_ptr<const tn::PlanOutput> output_;
    std::optional<tn::Plan> plan_;
  };
};

void PlanStage::Run::compute() {
  const StepContext& ctx = ctx_;
  h5::File nf = h5::File::open(ctx.inputs.at("network")->where().file, h5::Mode::read_only);
  const tn::Network net = tn::load_network(nf);
  h5::File pf = h5::File::open(ctx.inputs.at("path")->where().file, h5::Mode::read_only);
  tn::Path path;
  {
    h5::Dataset d = pf.open_dataset("path");
    std::vector<std::int64_t> flat(d.shape().at(0) * 2);
    if (!flat.empty()) d.read_all(flat.data());
    for (size_t i = 0; i < flat.size(); i += 2)
      path.ssa.push_back({static_cast<int>(flat[i]), static_cast<int>(flat[i + 1])});
    h5::Dataset s = pf.open_dataset("sliced");
    path.sliced.resize(s.shape().at(0));
    if (!path.sliced.empty()) s.read_all(path.sliced.data());
  }
  const Params p = Params::from_json(ctx.params);
  const auto dtype = p.precision;
  if (net.semiring == "tropical" && dtype != h5::DType::complex128)
    throw InputError("the network is tropical (an exponent and a count in each entry): parameter 'precision' is "
                     "complex64; expected complex128");
  tn::PlanOptions o;
  o.element_bytes = h5::dtype_size(dtype);
  o.max_slices = p.max_slices;
  o.reconfigure = p.reconfigure;
  o.subtree_size = p.subtree_size;
  std::uint64_t inputs = 0;
  for (const auto& t : net.tensors) inputs += static_cast<std::uint64_t>(net.size_of(t.modes)) * o.element_bytes * 2;
  if (p.budget) {
    o.budget_bytes = *p.budget;
  } else if (ctx.backend) {
    // tn.contract keeps the inputs resident and runs one arena in each of its 3 slots; the 3
    // share one persistent region.
    auto& be = *ctx.backend;
    const std::uint64_t fixed = inputs + 3 * be.blas_stream_bytes();
    const std::uint64_t limit = be.device_budget().limit();
    if (limit <= fixed)
      throw InputError(fmt::format("the device memory budget {} does not even hold the network's inputs ({})",
                                   format_bytes(static_cast<double>(limit)), format_bytes(static_cast<double>(fixed))));
    o.budget_bytes = (limit - fixed) / 3;
    o.arenas = 3;
  }
  o.reuse_invariant = p.reuse_invariant;
  o.fuse_gates = p.fuse_gates;
  json rates = json::object();  // where they came from
  bool measured = false;        // (then the prediction is a measurement)
  if (p.bandwidth && p.gemm_rate) {
    o.bandwidth = *p.bandwidth;
    o.gemm_rate = *p.gemm_rate;
    rates["source"] = "params";
  } else if (ctx.backend) {
    std::tie(o.bandwidth, o.gemm_rate) = measure(*ctx.backend, dtype);
    rates["source"] = "measured by tn.plan on " + std::string(backend_name(ctx.backend->kind()));
    measured = true;
  }
  o.out_of_core = p.out_of_core;
  o.scratch = p.scratch;
  if (o.out_of_core) {
    if (p.host_budget) {
      o.host_budget_bytes = *p.host_budget;
    } else if (ctx.backend) {  // half of what --host-memory leaves (tn.contract's slots need the rest)
      auto& hb = ctx.backend->host_budget();
      o.host_budget_bytes = hb.left() / 2;
    }
    if (p.pcie_bandwidth) {
      o.pcie_bandwidth = *p.pcie_bandwidth;
      rates["pcie_source"] = "params";
    } else if (ctx.backend) {
      o.pcie_bandwidth = measure_pcie(*ctx.backend);
      rates["pcie_source"] = "measured by tn.plan";
      measured = true;
    }
  }
  // (Out of core, how many intermediates spill, and over P ranks, the large-step threshold and
  // where to redistribute, are chosen by predicted seconds: a measured rate can change them.)
  tn::Plan plan = tn::make_plan(net, path, o);
  json schedule = plan.to_json();
  schedule["budget_bytes"] = o.budget_bytes;
  if (o.out_of_core) schedule["host_budget_bytes"] = o.host_budget_bytes;
  json prediction = plan.prediction_json();
  prediction["rates"] = rates;
  prediction["measured"] = measured;
  prediction["predicted_seconds_total"] = plan.predicted_seconds_per_bitstring();
  if (p.ranks > 1) {
    Distributed d = distributed(net, path, o, plan, p);
    schedule["distribution"] = std::move(d.schedule);
    prediction["distribution"] = std::move(d.prediction);
  }
  output_ = std::make_shared<const tn::PlanOutput>(tn::PlanOutput{std::move(schedule), std::move(prediction)});
  plan_ = std::move(plan);
}
void PlanStage::Run::write(const StagePlan&, const StepPass&, h5::File& out) const {
  const json &j = output_->plan, &prediction = output_->prediction;
  const bool measured = prediction.at("measured").get<bool>();
  tn::write_json_dataset(out, "plan", j);
  h5::Dataset prediction_dataset = tn::write_json_dataset(out, "prediction", prediction);
  tn::keep_plan_output(ctx_.step_key, output_);
  if (measured) mark_measured(prediction_dataset);
  const tn::Plan& plan = *plan_;
  // Per step, for plots of tensor size along the path (qstage inspect --plot).
  const std::uint64_t n = plan.steps.size();
  std::vector<std::uint64_t> out_bytes, live;
  std::vector<double> flops, predicted;
  for (const auto& s : plan.steps) {
    out_bytes.push_back(s.c_bytes);
    live.push_back(s.live_bytes);
    flops.push_back(s.flops);
    predicted.push_back(s.predicted_seconds);
  }
  auto column = [&](const char* name, h5::DType t, const void* data, const char* doc) {
    h5::Dataset d = out.create_dataset(name, {{t, {n}, {}}, false});
    if (n) d.write_all(data);
    d.set_attribute("description", doc);
    return d;
  };
  column("steps/output_bytes", h5::DType::uint64, out_bytes.data(), "bytes of each step's result (per slice)");
  column("steps/live_bytes", h5::DType::uint64, live.data(), "arena bytes in use during each step");
  column("steps/flops", h5::DType::float64, flops.data(), "real flops of each step (8 per complex multiply-add)");
  h5::Dataset predicted_column = column("steps/predicted_seconds", h5::DType::float64, predicted.data(),
                                        "seed 000 eq. 6: max(bytes/bandwidth, flops/rate)");
  if (measured) mark_measured(predicted_column);
  std::vector<std::uint8_t> invariant;
  for (const auto& s : plan.steps) invariant.push_back(s.invariant ? 1 : 0);
  column("steps/invariant", h5::DType::uint8, invariant.data(),
         "1 for steps that run once per bitstring (the prologue), 0 for those that run in every slice");
  out.set_attribute("slices", static_cast<std::int64_t>(plan.slices));
  out.set_attribute("arena_bytes", static_cast<std::int64_t>(plan.arena_bytes));
  out.set_attribute("input_transposes", static_cast<std::int64_t>(plan.input_transposes));
  out.set_attribute("packed_steps", static_cast<std::int64_t>(plan.packed_steps));
  out.set_attribute("step_transposes", static_cast<std::int64_t>(plan.step_transposes));
  out.set_attribute("transposed_bytes", static_cast<std::int64_t>(plan.transposed_bytes));
  out.set_attribute("spilled", static_cast<std::int64_t>(plan.spilled));
  out.set_attribute("host_arena_bytes", static_cast<std::int64_t>(plan.host_arena_bytes));
  out.set_attribute("host_copy_bytes", static_cast<std::int64_t>(plan.host_copy_bytes));
  out.set_attribute("scratch", static_cast<std::int64_t>(plan.scratch));
  out.set_attribute("predicted_seconds_per_slice", plan.predicted_seconds);
  out.set_attribute("predicted_prologue_seconds", plan.predicted_prologue_seconds);
  out.set_attribute("predicted_seconds_total", plan.predicted_seconds_per_bitstring());
  out.set_attribute("invariant_steps", static_cast<std::int64_t>(plan.invariant_steps));
  out.set_attribute("invariant_flops", plan.invariant_flops);
  out.set_attribute("flops_per_slice", plan.slice_flops);
  out.set_attribute("flops_per_slice_without_reuse", plan.invariant_flops + plan.slice_flops);
  out.set_attribute("flops_total", plan.flops_per_bitstring());
  out.set_attribute("flops_total_without_reuse", plan.flops_per_bitstring_without_reuse());
  out.set_attribute("persistent_bytes", static_cast<std::int64_t>(plan.persistent_bytes));
  out.set_attribute("prologue_arena_bytes", static_cast<std::int64_t>(plan.prologue_arena_bytes));
  out.set_attribute("bandwidth_bytes_per_second", plan.bandwidth);
  out.set_attribute("gemm_flops_per_second", plan.gemm_rate);
  out.set_attribute("slicing_overhead", plan.slicing_overhead);
  if (plan.path_reconfigured && plan.slicing_overhead > 10)  // tn.plan sliced the path itself
    spdlog::warn(
        "tn.plan: slicing to the budget multiplied the flops by {:.3g}: paths found without a cap slice "
        "badly (their largest tensors change modes at every step); give tn.path max_intermediate (about "
        "a quarter of the budget) so that the search weighs the slicing",
        plan.slicing_overhead);
  out.set_attribute("path_reconfigured", static_cast<std::int64_t>(plan.path_reconfigured));
  out.set_attribute("fused_gates", static_cast<std::int64_t>(plan.fused_gates));
  if (j.contains("distribution")) {
    const json &d = j.at("distribution"), &e = prediction.at("distribution");
    out.set_attribute("distribution_ranks", d.at("ranks").get<std::int64_t>());
    out.set_attribute("distribution_slices", d.at("slices").get<std::int64_t>());
    out.set_attribute("distribution_R_P", d.at("R_P").get<double>());
    for (const char* k : {"S_P", "E_P"}) out.set_attribute(std::string("distribution_") + k, e.at(k).get<double>());
  }
}
std::string PlanStage::Run::describe(const StagePlan&, const StepPass&) const {
  const json &j = output_->plan, &prediction = output_->prediction;
  const tn::Plan& plan = *plan_;
  const std::string spill = plan.spilled
                                ? fmt::format(", {} intermediates spilled to a {} {} ({} copied per slice)",
                                              plan.spilled, format_bytes(static_cast<double>(plan.host_arena_bytes)),
                                              plan.scratch ? "HDF5 scratch file" : "host arena",
                                              format_bytes(static_cast<double>(plan.host_copy_bytes)))
                                : "";
  const std::string sliced = plan.slicing_overhead != 1
                                 ? fmt::format(" (sliced here: {:.3g}x the flops{})", plan.slicing_overhead,
                                               plan.path_reconfigured ? ", path reconfigured" : "")
                                 : "";
  const std::string reuse =
      plan.invariant_steps
          ? fmt::format(
                "; {} invariant step(s) once per bitstring ({:.3g} flops, {} persistent, predicted {}): "
                "{:.3g} flops per bitstring instead of {:.3g}",
                plan.invariant_steps, plan.invariant_flops, format_bytes(static_cast<double>(plan.persistent_bytes)),
                format_duration(plan.predicted_prologue_seconds), plan.flops_per_bitstring(),
                plan.flops_per_bitstring_without_reuse())
          : "";
  const std::string fused =
      plan.fused_gates ? fmt::format(", {} gate step(s) fused into passes over larger tensors", plan.fused_gates) : "";
  std::string ranks;
  if (j.contains("distribution")) {
    const json &d = j.at("distribution"), &e = prediction.at("distribution");
    int redistributions = 0, forced = 0, chained = 0;
    for (const json& s : d.at("steps")) {
      const std::string t = s.at("transition").get<std::string>();
      chained += t != "local";
      redistributions += t == "redistribute";
      forced += s.at("forced").get<bool>();
    }
    ranks = fmt::format(
        "; over {} ranks: {} slice(s), {} distributed step(s) in {} use-chain(s), {} redistribution(s) ({} forced), "
        "{} moved, R_P {:.3g}, predicted S_P {:.3g}, E_P {:.3g}",
        d.at("ranks").get<int>(), d.at("slices").get<std::int64_t>(), chained, d.at("chains").size(), redistributions,
        forced, format_bytes(d.at("moved_bytes").get<double>()), d.at("R_P").get<double>(), e.at("S_P").get<double>(),
        e.at("E_P").get<double>());
  }
  return fmt::format(
      "{} steps ({} packed, {} copies of {}){}, {} slice(s) over {} sliced mode(s){}, arena {} per slice{}, "
      "{} input transposes, predicted {} per slice{}{}",
      plan.steps.size(), plan.packed_steps, plan.step_transposes,
      format_bytes(static_cast<double>(plan.transposed_bytes)), fused, plan.slices, plan.sliced.size(), sliced,
      format_bytes(static_cast<double>(plan.arena_bytes)), spill, plan.input_transposes,
      format_duration(plan.predicted_seconds), reuse, ranks);
}

}  // namespace

const Stage& tn_plan() {
  static const PlanStage stage;
  return stage;
}

}  // namespace qstage::stages
