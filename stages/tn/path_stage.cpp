// tn.path: a contraction path for a network - found by the hyper-optimizer (stages/tn/paths/hyper.hpp)
// and sliced to a cap on the largest intermediate, or imported from opt_einsum (linear or SSA) or
// cotengra (path + sliced).
#include <fmt/format.h>

#include <omp.h>
#include <spdlog/spdlog.h>

#include <cmath>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/units.hpp"
#include "stages/common/params.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/path.hpp"
#include "stages/tn/paths/hyper.hpp"
#include "stages/tn/sources.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;

// The network, and how many contractions a path for it serves: its bitstrings (1 for a value).
struct Input {
  tn::Network net;
  std::size_t contractions = 1;
};

Input open_network(const StepContext& ctx) {
  h5::File f = h5::File::open(ctx.inputs.at("network")->where().file, h5::Mode::read_only);
  Input in{tn::load_network(f)};
  in.contractions = std::max<std::size_t>(tn::read_bitstrings(f).size(), 1);
  return in;
}

struct Params {
  bool import;                  // the path comes from the file params.import (ctx.files)
  std::string format;           // of that file: linear | ssa
  std::uint64_t element_bytes;  // precision: complex64 8, complex128 16
  // The search (without import):
  std::optional<double> max_seconds;  // none: fitted to the predicted contraction time at flop_rate
  double flop_rate;
  int max_tries;  // 0: no limit
  std::uint64_t seed;
  std::vector<std::string> methods;
  bool reconfigure;
  int subtree_size;
  int threads;
  std::optional<std::uint64_t> max_intermediate;  // bytes (read only for a search)
  static Params from_json(const json& p) {
    Params r;
    r.import = p.contains("import");
    r.format = p.value("format", "linear");
    r.element_bytes = h5::dtype_size(params::precision(p));
    r.max_seconds = params::optional<double>(p, "max_seconds");
    r.flop_rate = p.at("flop_rate").get<double>();
    r.max_tries = p.value("max_tries", 0);
    r.seed = p.at("seed").get<std::uint64_t>();
    r.methods = p.at("methods").get<std::vector<std::string>>();
    r.reconfigure = p.at("reconfigure").get<bool>();
    r.subtree_size = p.at("subtree_size").get<int>();
    r.threads = p.at("threads").get<int>();
    if (!r.import) r.max_intermediate = params::optional_size(p, "max_intermediate");
    return r;
  }
};

tn::Path imported(const Params& p, const tn::Files& files, const tn::Network& net) {
  const auto path = files.at("/import");
  json j;
  try {
    j = json::parse(fsutil::read_file(path));
  } catch (const json::exception& e) {
    throw InputError(fmt::format("params.import: '{}' is not valid JSON: {}", path.string(), e.what()));
  }
  const std::string& format = p.format;
  const json steps = j.is_object() ? j.value("path", json()) : j;
  tn::Path out = format == "ssa" ? tn::path_from_ssa(steps, net.tensors.size(), path.string())
                                 : tn::path_from_linear(steps, net.tensors.size(), path.string());
  if (j.is_object() && j.contains("sliced")) {  // cotengra: sliced indices by their labels
    for (const auto& label : j["sliced"]) {
      const std::string l = label.is_string() ? label.get<std::string>() : label.dump();
      bool found = false;
      for (const auto& [m, name] : net.labels)
        if (name == l) {
          out.sliced.push_back(m);
          found = true;
        }
      if (!found && net.labels.empty()) {  // circuit networks: modes are numbers (cotengra may give "17" or 17)
        const bool numeric = label.is_number_integer() ||
                             (!l.empty() && l.find_first_not_of("0123456789") == std::string::npos && l.size() < 10);
        const tn::Mode m = numeric ? (label.is_number_integer() ? label.get<tn::Mode>() : std::stoi(l)) : -1;
        if (numeric && net.extent.count(m)) {
          out.sliced.push_back(m);
          found = true;
        }
      }
      if (!found) throw InputError(fmt::format("params.import: sliced index '{}' is not a label of the network", l));
    }
  }
  return out;
}

// The shortest search by default: 256 trials, or 0.25 s where they take longer (a slow or loaded
// machine), then reconfiguration of the best trees. On an H100 machine (2026-11-26), 0.25 s gave
// the medium and big benchmark circuits the paths of 0.5 s; there it was 160 trials (METIS calls
// then ran one at a time), on the 2-core VM 240-350. On 2 cores 256 trials gave medium, big and
// wide (seeds 1-3) the paths 0.25 s gave, in 10-25 % less time (2026-12-06); 128 trials, on a
// loaded machine, three costlier ones (up to 1.5x). A search longer than this follows the best
// path's own contraction time (search_options), so a costly network is searched longer.
constexpr int kMinSearchTrials = 256;
constexpr double kMinSearchSeconds = 0.25;

// The search's options from the step's parameters. Without max_seconds, planning time fits the
// job: the search takes about as long as contracting the best path found so far would (for
// every bitstring, at flop_rate; the best trial as refinement will leave it, hyper.cpp), at least
// kMinSearchTrials trials (or kMinSearchSeconds) and at most the default budget.
tn::HyperOptions search_options(const Params& p, const tn::Network& net, std::size_t jobs) {
  tn::HyperOptions o;
  if (p.max_seconds) {
    o.max_seconds = *p.max_seconds;
  } else {
    o.max_seconds = tn::default_search_seconds(static_cast<int>(net.tensors.size()));
    o.multiply_add_rate = p.flop_rate / 8.0;  // complex: 8 real flops per multiply-add
    o.jobs = static_cast<double>(std::max<std::size_t>(jobs, 1));
    o.min_trials = kMinSearchTrials;
    o.min_seconds = kMinSearchSeconds;
  }
  o.max_trials = p.max_tries;
  o.seed = p.seed;
  o.methods = p.methods;
  o.reconfigure = p.reconfigure;
  o.subtree_size = p.subtree_size;
  o.threads = p.threads;
  if (p.max_intermediate)
    o.max_log2_size = std::log2(static_cast<double>(*p.max_intermediate) / static_cast<double>(p.element_bytes));
  return o;
}

class PathStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tn.path", 2,
        "a contraction path: a hyper-optimizer over randomized greedy and METIS partitioning, refined by subtree "
        "reconfiguration and sliced by cost to a cap on the largest intermediate; or imported",
        {{"network", "a tn.build output"}},
        "- id: path\n  stage: tn.path\n  inputs: {network: net}\n  params: {max_seconds: 5, max_intermediate: 1GiB}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return {"/import"}; }
  StagePlan plan(const json&, const std::map<std::string, DatasetInfo>&) const override {
    return computed_plan({{"path", {{h5::DType::int64, {}, {}}}}});
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  // (result_: the path, its cost and how it was found)
  class Run final : public JsonComputedRun {
   public:
    using JsonComputedRun::JsonComputedRun;
    void compute() override;
    void write(const StagePlan&, const StepPass&, h5::File& out) const override;
    std::string describe(const StagePlan&, const StepPass&) const override;
  };
};

void PathStage::Run::compute() {
  const StepContext& ctx = ctx_;
  const Input input = open_network(ctx);
  const Params p = Params::from_json(ctx.params);
  const tn::Network& net = input.net;
  const bool complex = true;
  json result;
  tn::Path path;
  if (p.import) {
    path = imported(p, ctx.files, net);
    result["method"] = fmt::format("imported {} path from {}", p.format, ctx.files.at("/import").string());
  } else {
    const tn::SearchNetwork search = tn::SearchNetwork::from(net);
    tn::HyperOptions o = search_options(p, net, input.contractions);
    double last_log = 0;
    o.progress = [&](int trials, double best, double seconds) {
      if (seconds - last_log < 5) return;
      last_log = seconds;
      spdlog::info("tn.path: {} trials in {:.1f}s, best log10 C_t {:.2f}", trials, seconds, best);
    };
    const tn::HyperResult found = tn::hyper_optimize(search, o);
    path = found.path;
    result["method"] = "hyper-optimizer";
    result["search"] = found.to_json();
    result["search"]["threads"] = o.threads > 0 ? o.threads : omp_get_max_threads();
    result["tries"] = found.trials;
    result["seconds"] = found.seconds;
    result["within_cap"] = !std::isfinite(o.max_log2_size) || found.cost.log2_largest() <= o.max_log2_size + 1e-9;
    spdlog::info(
        "tn.path: {} trials ({}) in {:.2f}s of a {:.2f}s budget{}; best from {} {}; refined in {:.2f}s{} ({} "
        "subtrees reconfigured){}",
        found.trials, found.methods.dump(), found.search_seconds, found.budget_seconds,
        o.multiply_add_rate > 0
            ? found.refine_gain > 0
                  ? fmt::format(" (fitted to the predicted contraction time, the best trial counted as refined: "
                                "10^{:.2f} less)",
                                found.refine_gain)
                  : std::string(" (fitted to the predicted contraction time)")
            : std::string(),
        found.best_method, found.best_params.dump(), found.refine_seconds,
        found.refined_early ? fmt::format(" besides {} tree(s) refined at the least search's end in {:.2f}s",
                                          found.refined_early, found.early_refine_seconds)
                            : std::string(),
        found.reconfiguring.subtrees_improved,
        found.slicing.sliced_modes
            ? fmt::format(", {} modes sliced (overhead {:.3g}, {:.3g} without reuse)", found.slicing.sliced_modes,
                          found.slicing.overhead, found.slicing.overhead_without_reuse)
            : "");
  }
  tn::PathCost cost;
  try {
    cost = tn::path_cost(net, path);  // also checks that the path fits the network
  } catch (const InputError& e) {
    if (!p.import) throw;
    throw InputError(fmt::format("params.import: '{}': {}", ctx.files.at("/import").string(), e.what()));
  }
  result["ssa"] = path.ssa;
  result["sliced"] = path.sliced;
  result["cost"] = cost.to_json(complex);
  // Sliced paths: what the whole contraction costs when slice-invariant steps run once.
  const tn::SearchNetwork search = tn::SearchNetwork::from(net);
  const tn::TreeCost tree_cost = tn::ContractionTree::from_path(search, path).cost();
  result["cost"]["C_t_total_with_reuse"] = tree_cost.total_with_reuse();
  result["cost"]["log10_C_t_total"] = tree_cost.log10_total();
  result_ = std::move(result);
}
void PathStage::Run::write(const StagePlan&, const StepPass&, h5::File& out) const {
  const json& j = result_;
  const auto ssa = j["ssa"].get<std::vector<std::pair<int, int>>>();
  std::vector<std::int64_t> flat;
  for (auto [a, b] : ssa) flat.insert(flat.end(), {a, b});
  h5::Dataset d = out.create_dataset("path", {{h5::DType::int64, {ssa.size(), 2}, {}}, false});
  if (!flat.empty()) d.write_all(flat.data());
  d.set_attribute("description", "SSA path: step s contracts ids (row[0], row[1]) into id N+s; inputs are 0..N-1");
  const auto sliced = j["sliced"].get<std::vector<std::int64_t>>();
  h5::Dataset s = out.create_dataset("sliced", {{h5::DType::int64, {sliced.size()}, {}}, false});
  if (!sliced.empty()) s.write_all(sliced.data());
  out.set_attribute("cost", j["cost"].dump());
  out.set_attribute("method", j["method"].get<std::string>());
  if (j.contains("search")) out.set_attribute("search", j["search"].dump());
  for (const char* key : {"C_t_multiply_adds", "C_s_elements", "C_m_elements", "flops_total"})
    out.set_attribute(key, j["cost"][key].get<double>());
}
std::string PathStage::Run::describe(const StagePlan&, const StepPass&) const {
  const json& j = result_;
  const json& c = j["cost"];
  const double slices = c["slices"].get<double>();
  const std::string sliced =
      slices > 1 ? fmt::format(" per slice, {:.2f} over {:.0f} slices ({:.2f} with slice-invariant steps once)",
                               c["log10_C_t_total"].get<double>(), slices,
                               std::log10(std::max(c["C_t_total_with_reuse"].get<double>(), 1.0)))
                 : "";
  return fmt::format("{}: log10 C_t {:.2f}{}, log2 C_s {:.1f}, {:.3g} flops ({}){}", j["method"].get<std::string>(),
                     c["log10_C_t"].get<double>(), sliced, c["log2_C_s"].get<double>(), c["flops_total"].get<double>(),
                     c["flop_convention"].get<std::string>(),
                     j.contains("tries")
                         ? fmt::format(", {} tries in {:.1f}s", j["tries"].get<int>(), j["seconds"].get<double>())
                         : "");
}

}  // namespace

const Stage& tn_path() {
  static const PathStage stage;
  return stage;
}

}  // namespace qstage::stages
