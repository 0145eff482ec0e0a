#include "stages/tn/paths/hyper.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/signals.hpp"
#include "kernels/common.hpp"
#include "stages/tn/paths/greedy.hpp"
#include "stages/tn/paths/partition.hpp"
#include "stages/tn/paths/reconfigure.hpp"

namespace qstage::tn {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kLag = 32;          // trial i is drawn from trials [0, i - kLag]: fixed, so results do not
                                  // depend on the thread count; 32 drawn ahead keep 16 threads busy
constexpr int kFirstTrials = 16;  // trials before the search may stop
constexpr int kProgressTrials = 16;
constexpr int kRefined = 16;       // trees refined, in parallel, one a thread on a 16-core host (the best raw
                                   // trial is often not the best refined one: with 4, wide's paths were up
                                   // to 2x costlier, n53m20's at 2^30 up to 10^1.9; with 8, at 256 trials,
                                   // wide's seed 1 came out 1.8x costlier than with 16)
constexpr int kExplore = 24;       // a method's first trials sample its parameters uniformly
constexpr int kTop = 4;            // later trials perturb one of a method's best few
constexpr double kPerturb = 0.12;  // the perturbation's standard deviation (in [0, 1] per parameter)
constexpr double kSearchShare = 0.7;  // of the budget, when refinement follows

// Reproducible randomness: every draw comes from splitmix64 of a counter (kernels/common.hpp).
struct Random {
  std::uint64_t state;
  double uniform() {
    state += kernels::kGolden;
    return (static_cast<double>(kernels::splitmix64(state) >> 11) + 0.5) * 0x1p-53;
  }
  double normal() {  // Box-Muller
    const double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }
};

// A method's parameters as a point in [0, 1]^d, mapped to values by these dimensions. A dimension
// with `zero_below` maps the bottom of its range to 0 (greedy's temperature: no noise is often best).
struct Dimension {
  const char* name;
  double lo, hi;
  bool log = false, integer = false;
  double zero_below = 0;
  double value(double x) const {
    if (x < zero_below) return 0;
    if (zero_below > 0) x = (x - zero_below) / (1 - zero_below);
    const double v = log ? std::exp(std::log(lo) + x * (std::log(hi) - std::log(lo))) : lo + x * (hi - lo);
    return integer ? std::round(v) : v;
  }
};

struct Method {
  std::string name;
  std::vector<Dimension> dims;
};

// Ranges from measurements on circuit networks (53 qubits 20 cycles, 40 qubits 12 cycles, 60 qubits
// 24 cycles; stages/tn/paths/greedy.hpp): costmod below about 1.5 is bad on circuits, temperatures
// of 0.1 and more hurt everywhere, 0 and 1e-4..0.05 each win somewhere; partitioning did slightly
// better with 9..14 parts than with 2, and its other parameters showed no clear effect.
const std::vector<Method>& all_methods() {
  static const std::vector<Method> methods = {
      {"greedy", {{"costmod", 1.0, 4.0}, {"temperature", 1e-4, 0.05, true, false, 0.2}}},
      {"partition",
       {{"parts", 2, 16, false, true},
        {"parts_decay", 0.0, 1.0},
        {"imbalance", 0.01, 1.0, true},
        {"imbalance_decay", -5.0, 5.0},
        {"cutoff", 10, 60, false, true},
        {"edge_noise", 0.0, 0.5},
        {"costmod", 1.0, 4.0},
        {"temperature", 1e-4, 0.05, true, false, 0.2}}},
  };
  return methods;
}

std::vector<double> values(const Method& m, const std::vector<double>& x) {
  std::vector<double> v;
  for (size_t i = 0; i < m.dims.size(); ++i) v.push_back(m.dims[i].value(x[i]));
  return v;
}

json params_json(const Method& m, const std::vector<double>& x) {
  json j = json::object();
  const auto v = values(m, x);
  for (size_t i = 0; i < m.dims.size(); ++i) j[m.dims[i].name] = m.dims[i].integer ? json(static_cast<int>(v[i])) : json(v[i]);
  return j;
}

ContractionTree build_tree(const SearchNetwork& net, const Method& m, const std::vector<double>& x, std::uint64_t seed) {
  const auto v = values(m, x);
  if (m.name == "greedy") return greedy_tree(net, {v[0], v[1]}, seed);
  PartitionParams p;
  p.parts = static_cast<int>(v[0]);
  p.parts_decay = v[1];
  p.imbalance = v[2];
  p.imbalance_decay = v[3];
  p.cutoff = static_cast<int>(v[4]);
  p.edge_noise = v[5];
  p.greedy = {v[6], v[7]};
  return partition_tree(net, p, seed);
}

struct Trial {
  int index = 0;
  int method = 0;  // into the search's methods
  std::vector<double> x;
  std::uint64_t seed = 0;
};

struct Scored {
  double score = std::numeric_limits<double>::infinity();  // log10 of total multiply-adds (sliced to the cap)
  double log2_largest = 0;
  int index = 0;
  bool operator<(const Scored& o) const {
    if (score != o.score) return score < o.score;
    if (log2_largest != o.log2_largest) return log2_largest < o.log2_largest;
    return index < o.index;
  }
};

// The score of a tree: with a cap, that of a copy sliced to it without reconfiguration, which
// stops at the deadline (the tree then ranks as not fitting: slicing a large network far below
// its width can take minutes, and ran searches minutes past max_seconds).
Scored score_tree(const ContractionTree& tree, double max_log2_size, int index, Clock::time_point deadline) {
  if (!std::isfinite(max_log2_size)) {
    const TreeCost c = tree.cost();
    return {c.log10_total(), c.log2_largest(), index};
  }
  ContractionTree sliced = tree;
  SliceOptions o;
  o.target_log2_size = max_log2_size;
  o.reconfigure = false;
  o.deadline = deadline;
  const SliceReport r = slice_tree(sliced, o);
  const TreeCost c = sliced.cost();
  // A tree that cannot be sliced to the cap ranks behind every one that can.
  return {std::log10(std::max(c.total_with_reuse(), 1.0)) + (r.fits ? 0.0 : 1000.0), c.log2_largest(), index};
}

struct MethodRecord {
  int trials = 0;
  std::vector<std::pair<Scored, std::vector<double>>> best;  // the kTop best, best first
};

// Chooses the method and parameters of trial `index` from what the trials folded before it found.
Trial next_trial(int index, std::uint64_t seed, const std::vector<int>& methods,
                 const std::vector<MethodRecord>& records) {
  Trial t;
  t.index = index;
  Random r{kernels::splitmix64(seed ^ (0x5bd1e995ull * static_cast<std::uint64_t>(index + 1)))};
  t.seed = kernels::splitmix64(r.state ^ 0xa0761d6478bd642full);
  // Method: in turn while every method explores, then the best one more often.
  const int M = static_cast<int>(methods.size());
  bool exploring = false;
  for (const auto& rec : records) exploring = exploring || rec.trials < kExplore;
  if (exploring || M == 1) {
    t.method = index % M;
  } else {
    int best = 0;
    for (int k = 1; k < M; ++k)
      if (records[static_cast<size_t>(k)].best.front().first < records[static_cast<size_t>(best)].best.front().first) best = k;
    const double u = r.uniform();
    t.method = u < 0.6 ? best : std::min(M - 1, static_cast<int>((u - 0.6) / 0.4 * M));
  }
  const Method& m = all_methods()[static_cast<size_t>(methods[static_cast<size_t>(t.method)])];
  const MethodRecord& rec = records[static_cast<size_t>(t.method)];
  t.x.resize(m.dims.size());
  const bool perturb = rec.trials >= kExplore && !rec.best.empty() && r.uniform() < 0.7;
  if (perturb) {
    const auto& base = rec.best[std::min(rec.best.size() - 1, static_cast<size_t>(r.uniform() * static_cast<double>(rec.best.size())))].second;
    for (size_t i = 0; i < t.x.size(); ++i) t.x[i] = std::clamp(base[i] + kPerturb * r.normal(), 0.0, 1.0);
  } else {
    for (double& xi : t.x) xi = r.uniform();
  }
  return t;
}

void remember(MethodRecord& rec, const Scored& s, const std::vector<double>& x) {
  ++rec.trials;
  rec.best.push_back({s, x});
  std::sort(rec.best.begin(), rec.best.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (rec.best.size() > static_cast<size_t>(kTop)) rec.best.pop_back();
}

struct Kept {
  Scored score;
  ContractionTree tree;
  int method = 0;
  std::vector<double> x;
};

// Keeps the kRefined best distinct trees (distinct by path), best first.
void keep(std::vector<Kept>& kept, Kept k) {
  if (kept.size() == static_cast<size_t>(kRefined) && !(k.score < kept.back().score)) return;
  const Path p = k.tree.to_path();
  for (const auto& e : kept)
    if (e.score.score == k.score.score && e.tree.to_path().ssa == p.ssa) return;
  kept.push_back(std::move(k));
  std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.score < b.score; });
  if (kept.size() > static_cast<size_t>(kRefined)) kept.pop_back();
}

Clock::time_point after(Clock::time_point t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int thread_count(int requested) { return requested > 0 ? requested : std::max(1, omp_get_max_threads()); }

}  // namespace

const std::vector<std::string>& hyper_methods() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& m : all_methods()) n.push_back(m.name);
    return n;
  }();
  return names;
}

double budget_seconds(const HyperOptions& o, double best_log10_multiply_adds, double least_seconds) {
  if (!(o.multiply_add_rate > 0)) return o.max_seconds;
  const double contraction = std::pow(10.0, best_log10_multiply_adds) * o.jobs / o.multiply_add_rate;
  return std::min(o.max_seconds, std::max(least_seconds, contraction));
}

double default_search_seconds(int tensors) { return std::clamp(static_cast<double>(tensors) / 200.0, 2.0, 10.0); }

json HyperResult::to_json() const {
  return {{"trials", trials},
          {"seconds", seconds},
          {"budget_seconds", budget_seconds},
          {"refine_gain_log10", refine_gain},
          {"refined_early", refined_early},
          {"early_refine_seconds", early_refine_seconds},
          {"search_seconds", search_seconds},
          {"refine_seconds", refine_seconds},
          {"best_method", best_method},
          {"best_params", best_params},
          {"log10_best_trial", log10_best_trial},
          {"methods", methods},
          {"reconfigured_subtrees", reconfiguring.subtrees_improved},
          {"slicing",
           {{"sliced_modes", slicing.sliced_modes},
            {"overhead", slicing.overhead},
            {"overhead_without_reuse", slicing.overhead_without_reuse},
            {"fits", slicing.fits}}}};
}

HyperResult hyper_optimize(const SearchNetwork& net, const HyperOptions& o) {
  if (net.tensors == 0) throw InputError("the network has no tensors");
  std::vector<int> methods;
  for (const auto& name : o.methods) {
    const auto& all = all_methods();
    const auto it = std::find_if(all.begin(), all.end(), [&](const Method& m) { return m.name == name; });
    if (it == all.end())
      throw InputError(fmt::format("unknown path method '{}'; expected one of: greedy, partition", name));
    methods.push_back(static_cast<int>(it - all.begin()));
  }
  if (methods.empty()) throw InputError("no path method given; expected one or more of: greedy, partition");
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const bool refine = o.reconfigure || std::isfinite(o.max_log2_size);
  // (the search's own end, and that of a reconfiguration inside it)
  const auto search_deadline = o.max_seconds >= 1e8 ? Clock::time_point::max() : after(start, o.max_seconds);
  const double search_share = refine ? kSearchShare : 1.0;
  const int threads = thread_count(o.threads);

  HyperResult result;
  std::vector<MethodRecord> records(methods.size());
  std::vector<Kept> kept;
  int trials = 0;
  // A budget fitted to the contraction time counts the best tree as refinement will leave it:
  // once the search has run its least trials, the trees kept then are refined as the final
  // refinement would refine them (it takes them as they are if they are still kept), trials
  // waiting meanwhile, and what the best trial's score is above the best refined tree (log10) is
  // taken off every trial's score in the budget. (A 64-qubit circuit's best trial, 10^11.4
  // multiply-adds, came out of refinement at 10^10.2, and refining only the best trial missed
  // the tree that refined best: the search ran 5x longer than the contraction it planned.)
  // Uncapped searches only (a capped trial's score is after slicing).
  double refine_gain = 0;
  bool gain_probed = !(o.multiply_add_rate > 0) || !o.reconfigure || std::isfinite(o.max_log2_size);
  struct Refined {
    ContractionTree tree;
    ReconfigureReport report;
  };
  std::map<int, Refined> refined_early;                // by trial index
  std::deque<std::pair<int, ContractionTree>> probes;  // kept trees not yet taken to refine
  int probes_running = 0;
  double probed_best_trial = 0;  // the best trial's score when they were taken
  double probes_started = 0;     // (elapsed seconds)
  // The final refinement of an uncapped search (the probes' too).
  auto refine_uncapped = [&](ContractionTree& t, Clock::time_point deadline, ReconfigureReport* report) {
    ReconfigureOptions ro;
    ro.subtree_size = o.subtree_size;
    ro.max_log2_size = std::max(o.max_log2_size, t.cost().log2_largest());
    ro.deadline = deadline;
    reconfigure(t, ro, report);
  };
  // The least search: min_trials trials, or min_seconds if that comes first (a slow or loaded
  // machine). Until it has run the budget is max_seconds; then its time counts as the search's
  // share of the least budget.
  const bool has_least = o.min_trials > 0 || o.min_seconds > 0;
  double least_seconds = has_least ? std::numeric_limits<double>::infinity() : 0.0;
  auto least_done = [&] {
    return (o.min_trials > 0 && trials >= o.min_trials) ||
           (o.min_seconds > 0 && elapsed() >= search_share * o.min_seconds);
  };
  auto fitted_budget = [&] { return budget_seconds(o, kept.front().score.score - refine_gain, least_seconds); };
  // Trials from a window: trial i is drawn from what trials [0, i - kLag] found, once they are
  // folded in (in trial order), and a free thread runs the lowest trial drawn. No thread waits for
  // a round's slowest trial (a partition trial takes 5-10x a greedy one: in rounds of 16, 16
  // threads were busy a third of the time). Stops are taken between folds, after the first
  // kFirstTrials; trials still running then are dropped, so the trees are those of the trials
  // folded, whatever the thread count or speed.
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Trial> drawn;       // drawn, not started
  std::map<int, Kept> finished;  // run, not yet folded (they finish out of order)
  bool stopping = false, stop_signal = false;
  auto draw = [&](int index) {
    if (o.max_trials <= 0 || index < o.max_trials) drawn.push_back(next_trial(index, o.seed, methods, records));
  };
  for (int i = 0; i < kLag; ++i) draw(i);
  auto budget_spent = [&] {
    return (o.max_trials > 0 && trials >= o.max_trials) ||
           (trials >= kFirstTrials && elapsed() >= search_share * fitted_budget());
  };
  auto fold = [&] {  // (under the lock)
    for (auto it = finished.find(trials); !stopping && it != finished.end(); it = finished.find(trials)) {
      Kept k = std::move(it->second);
      finished.erase(it);
      remember(records[static_cast<size_t>(k.method)], k.score, k.x);
      keep(kept, std::move(k));
      ++trials;
      draw(trials - 1 + kLag);
      if (o.progress && trials % kProgressTrials == 0) o.progress(trials, kept.front().score.score, elapsed());
      // The search is reproducible from its seed, so a resumed run repeats it rather than keeping its trees.
      if (signals::stop_requested()) stop_signal = stopping = true;
      if (o.max_trials > 0 && trials >= o.max_trials) stopping = true;
      if (trials < kFirstTrials) continue;
      if (std::isinf(least_seconds) && least_done()) least_seconds = elapsed() / search_share;
      if (!gain_probed && !std::isinf(least_seconds) && elapsed() < search_share * fitted_budget()) {
        gain_probed = true;
        for (const Kept& k : kept) probes.emplace_back(k.score.index, k.tree);
        probed_best_trial = kept.front().score.score;
        probes_started = elapsed();
      }
      stopping = stopping || budget_spent();
    }
  };
  FirstFailure failure;
#pragma omp parallel num_threads(threads)
  failure.run([&] {
    try {
      while (true) {
        std::optional<std::pair<int, ContractionTree>> probe;
        Trial t;
        {
          std::unique_lock lock(mutex);
          // (no trial starts while kept trees are being refined: most searches stop after it)
          wake.wait(lock, [&] {
            return stopping || !probes.empty() || (probes_running == 0 && !drawn.empty());
          });
          if (stopping) break;
          if (!probes.empty()) {
            probe = std::move(probes.front());
            probes.pop_front();
            ++probes_running;
          } else {
            t = std::move(drawn.front());
            drawn.pop_front();
          }
        }
        if (probe) {  // off the lock
          Refined r{std::move(probe->second), {}};
          refine_uncapped(r.tree, search_deadline, &r.report);
          const std::lock_guard lock(mutex);
          refined_early.emplace(probe->first, std::move(r));
          if (--probes_running == 0 && probes.empty()) {
            double best_refined = std::numeric_limits<double>::infinity();
            for (const auto& [index, e] : refined_early)
              best_refined = std::min(best_refined, std::log10(std::max(e.tree.cost().total_with_reuse(), 1.0)));
            refine_gain = std::max(0.0, probed_best_trial - best_refined);
            result.early_refine_seconds = elapsed() - probes_started;
            stopping = stopping || budget_spent();
          }
          wake.notify_all();
          continue;
        }
        const Method& m = all_methods()[static_cast<size_t>(methods[static_cast<size_t>(t.method)])];
        ContractionTree tree = build_tree(net, m, t.x, t.seed);
        const Scored score = score_tree(tree, o.max_log2_size, t.index, search_deadline);
        const std::lock_guard lock(mutex);
        finished.emplace(t.index, Kept{score, std::move(tree), t.method, t.x});
        fold();
        wake.notify_all();
      }
    } catch (...) {  // the others stop too (the failed trial would never be folded)
      const std::lock_guard lock(mutex);
      stopping = true;
      wake.notify_all();
      throw;
    }
  });
  failure.rethrow();
  if (stop_signal) throw StopRequested(fmt::format("during the path search, after {} trials", trials));
  result.trials = trials;
  result.search_seconds = elapsed();
  result.budget_seconds = fitted_budget();
  result.refine_gain = refine_gain;

  // Refinement of the best few, in parallel; ties go to the better trial.
  std::vector<ContractionTree> refined;
  std::vector<SliceReport> slice_reports(kept.size());
  std::vector<ReconfigureReport> reconf_reports(kept.size());
  std::vector<bool> done(kept.size(), false);  // refined early, at the least search's end
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto early = refined_early.find(kept[i].score.index);
    done[i] = early != refined_early.end();
    refined.push_back(done[i] ? std::move(early->second.tree) : kept[i].tree);
    if (done[i]) reconf_reports[i] = early->second.report;
    result.refined_early += done[i] ? 1 : 0;
  }
  if (refine) {
    // The budget's end, but never less than the refinement's share of it from now: a last slow
    // trial must not leave the best trees unrefined (on an H100 machine, a 933-tensor
    // circuit's path came out 3.3x costlier when that happened); and never less than the least
    // search took: on 16 threads its 256 trials take 0.06 s, and a share of 0.03 s stops the
    // reconfiguration of an 800-tensor circuit's best trees (0.045 s) short of what it gains.
    const double least_search = std::isinf(least_seconds) ? 0.0 : least_seconds * search_share;
    const double refine_share = std::max((1.0 - search_share) * result.budget_seconds, least_search);
    const auto deadline = std::max(after(start, result.budget_seconds), after(Clock::now(), refine_share));
    FirstFailure failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min<int>(threads, static_cast<int>(kept.size())))
    for (int i = 0; i < static_cast<int>(kept.size()); ++i)
      failure.run([&] {
        if (done[static_cast<size_t>(i)]) return;
        ContractionTree& t = refined[static_cast<size_t>(i)];
        if (std::isfinite(o.max_log2_size) && o.reconfigure) {
          // Reconfigured unsliced first: the slicing overhead is then measured against the best
          // unsliced tree we know, not against a raw trial tree.
          ReconfigureOptions ro;
          ro.subtree_size = o.subtree_size;
          ro.deadline = deadline;
          reconfigure(t, ro);
        }
        if (std::isfinite(o.max_log2_size)) {
          SliceOptions so;
          so.target_log2_size = o.max_log2_size;
          so.reconfigure = o.reconfigure;
          so.subtree_size = o.subtree_size;
          so.seed = o.seed;
          so.deadline = deadline;
          slice_reports[static_cast<size_t>(i)] = slice_tree(t, so);
        }
        if (o.reconfigure) refine_uncapped(t, deadline, &reconf_reports[static_cast<size_t>(i)]);
      });
    failure.rethrow();
  }
  size_t best = 0;
  std::vector<Scored> final_scores;
  for (size_t i = 0; i < refined.size(); ++i) {
    const TreeCost c = refined[i].cost();
    const bool fits = !std::isfinite(o.max_log2_size) || c.log2_largest() <= o.max_log2_size + 1e-9;
    final_scores.push_back({std::log10(std::max(c.total_with_reuse(), 1.0)) + (fits ? 0.0 : 1000.0), c.log2_largest(),
                            kept[i].score.index});
    if (final_scores[i] < final_scores[best]) best = i;
  }
  const Kept& chosen = kept[best];
  const Method& m = all_methods()[static_cast<size_t>(methods[static_cast<size_t>(chosen.method)])];
  result.path = refined[best].to_path();
  result.cost = refined[best].cost();
  result.best_method = m.name;
  result.best_params = params_json(m, chosen.x);
  result.best_params["trial"] = chosen.score.index;
  result.log10_best_trial = chosen.score.score;
  result.slicing = slice_reports[best];
  result.reconfiguring = reconf_reports[best];
  result.methods = json::object();
  for (size_t k = 0; k < methods.size(); ++k)
    result.methods[all_methods()[static_cast<size_t>(methods[k])].name] = {
        {"trials", records[k].trials},
        {"best_log10_score", records[k].best.empty() ? json(nullptr) : json(records[k].best.front().first.score)}};
  result.seconds = elapsed();
  result.refine_seconds = result.seconds - result.search_seconds;
  return result;
}

}  // namespace qstage::tn
