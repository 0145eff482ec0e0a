// keys.dedup: the unique rows of a uint64 key dataset (1-4 words per key, word 0 most
// significant), globally sorted, with their counts, the sums of an optional float64 value per
// key, and the reverse index, out of core and the same bytes on any rank count and budget. The
// work is keys::DedupRun's (sample, partition, merge; or, when it fits, the same kernels on
// resident data, on every rank) plus its finish pass as the output pass, which writes the index and
// copies the unique keys into the step's output.
#include <algorithm>
#include <fmt/format.h>

#include "core/error.hpp"
#include "stages/keys/dedup_passes.hpp"
#include "stages/keys/keys_stages.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages {
namespace {

using json = nlohmann::json;
using keys::DedupSource;

struct Params {
  bool index = true;
  std::uint32_t buckets = 0;
  std::uint64_t tile_rows = 1 << 16;
  std::uint32_t samples = 32;
  static Params from_json(const json& p) {
    return {p.at("index").get<bool>(), p.at("buckets").get<std::uint32_t>(), p.at("tile_rows").get<std::uint64_t>(),
            p.at("samples").get<std::uint32_t>()};
  }
};

// What to de-duplicate, from the inputs' layouts (checked: a bad input is an InputError naming it).
DedupSource source_of(const json& params, const Layout& keys, const Layout* values) {
  if (keys.dtype != DType::uint64)
    throw InputError(fmt::format("input 'keys' has dtype {}; expected uint64", h5::dtype_name(keys.dtype)));
  if (keys.shape.empty() || keys.shape.size() > 2 || (keys.shape.size() == 2 && (keys.shape[1] < 1 || keys.shape[1] > 4)))
    throw InputError(fmt::format("input 'keys' has shape {}; expected (n,) or (n, w) with 1 to 4 words per key",
                                 shape_text(keys.shape)));
  if (keys.shape[0] == 0) throw InputError("input 'keys' has no rows; expected at least one key");
  const Params p = Params::from_json(params);
  DedupSource s;
  s.keys = "keys";
  s.rows = keys.shape[0];
  s.words = keys.shape.size() == 2 ? static_cast<std::uint32_t>(keys.shape[1]) : 1;
  s.keys_1d = keys.shape.size() == 1;
  s.index = p.index;
  s.tile_rows = p.tile_rows;
  s.buckets = p.buckets;
  s.samples = p.samples;
  if (values) {
    if (values->dtype != DType::float64)
      throw InputError(fmt::format("input 'values' has dtype {}; expected float64", h5::dtype_name(values->dtype)));
    if (values->shape != Shape{s.rows})
      throw InputError(fmt::format("input 'values' has shape {}; expected ({},), one value per row of input 'keys'",
                                   shape_text(values->shape), s.rows));
    s.values = "values";
  }
  return s;
}

DedupSource source_of(const StepContext& ctx) {
  const auto v = ctx.inputs.find("values");
  Layout values;
  if (v != ctx.inputs.end()) values = {*v->second->dtype(), v->second->shape(), {}};
  const h5::Dataset& k = *ctx.inputs.at("keys");
  return source_of(ctx.params, {*k.dtype(), k.shape(), {}}, v != ctx.inputs.end() ? &values : nullptr);
}

class DedupStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "keys.dedup", 1,
        "unique keys (1-4 uint64 words, sorted), their counts, per-key value sums and the reverse index, out of core",
        {{"keys", "uint64 (n,) or (n, w), w <= 4 words per key, word 0 most significant"},
         {"values", "optional float64 (n,): summed per unique key", true}},
        "- id: unique\n  stage: keys.dedup\n  inputs: {keys: dets, values: amps}\n  params: {index: true}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const auto v = in.find("values");
    const DedupSource s = source_of(params, in.at("keys").layout, v != in.end() ? &v->second.layout : nullptr);
    // The output pass (the finish pass) is known once the merge is done (the run's output());
    // until then this plan names its outputs, at their largest.
    StagePlan plan;
    plan.pass.rows = s.rows;
    plan.pass.tile_rows = s.tile_rows;
    plan.pass.inputs.push_back({"keys", nullptr, in.at("keys").layout.row_bytes()});
    plan.streamed_inputs = {"keys"};
    const Shape key_shape = s.keys_1d ? Shape{s.rows} : Shape{s.rows, s.words};
    const Shape key_chunk = s.keys_1d ? Shape{s.tile_rows} : Shape{s.tile_rows, s.words};
    auto add = [&](const char* name, DType t, Shape shape, Shape chunk) {
      engine::OutputDecl o{name, {t, std::move(shape), std::move(chunk)}};
      o.kind = engine::OutputKind::appended;
      o.max_rows_per_row = 1;
      plan.pass.outputs.push_back(std::move(o));
    };
    if (s.index) plan.pass.outputs.push_back({"index", {DType::uint64, {s.rows}, {s.tile_rows}}});
    add("keys", DType::uint64, key_shape, key_chunk);
    add("counts", DType::uint64, {s.rows}, {s.tile_rows});
    if (s.has_value()) add("values", DType::float64, {s.rows}, {s.tile_rows});
    plan.primary_output = "keys";
    plan.summary = {{"rows", s.rows}, {"words", s.words}, {"values", s.has_value()}, {"index", s.index},
                    {"tile_rows", s.tile_rows}};
    return plan;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  // The sub-run's passes, then its finish pass as the output pass.
  class Run final : public StepRun {
   public:
    explicit Run(const StepContext& ctx) : ctx_(ctx), dedup_(ctx, source_of(ctx)) {}
    bool done() const override { return dedup_.done(); }
    // (when it fits: the whole de-duplication on resident data, one unit of host work on every rank)
    std::optional<StepPass> next() override {
      const auto values = ctx_.inputs.find("values");
      if (dedup_.run_resident(*ctx_.inputs.at("keys"), values != ctx_.inputs.end() ? values->second : nullptr))
        return std::nullopt;
      return dedup_.next();
    }
    void finished(StepPass& pass) override { dedup_.finished(pass); }
    int first_live_pass() const override { return dedup_.first_live_pass(*ctx_.passes_done); }
    std::string save() const override {
      Packer out;
      dedup_.save(out);
      return out.take();
    }
    void load(std::string_view state) override {
      Unpacker in(state);
      dedup_.load(in);
      in.finish();
    }
    StepPass output(StagePlan& plan) override {
      StepPass finish = dedup_.finish_pass(true);
      plan.summary["unique"] = dedup_.unique();
      plan.summary["buckets"] = dedup_.buckets();
      plan.summary["row_buckets"] = dedup_.row_buckets();
      return finish;
    }
    void write(const StagePlan& plan, const StepPass&, h5::File& out) const override {
      // (the summary, not the number of buckets, which the bytes of the datasets do not depend on)
      out.set_attribute("tile_rows", static_cast<std::int64_t>(plan.summary.at("tile_rows").get<std::uint64_t>()));
      // How evenly the sample sort spread the merge (it depends on the rank count: an attribute).
      out.set_attribute("merge_records_per_rank", merge_load());
    }
    std::string describe(const StagePlan& plan, const StepPass&) const override {
      const auto load = merge_load();
      const auto [least, most] = std::minmax_element(load.begin(), load.end());
      const double spread = *least ? static_cast<double>(*most) / static_cast<double>(*least) : 0.0;
      if (dedup_.resident_divided())
        return fmt::format(
            "{} unique keys of {} rows (on resident data divided between {} ranks; merged records per "
            "rank max/min {:.3f})",
            plan.summary.at("unique").get<std::uint64_t>(), plan.summary.at("rows").get<std::uint64_t>(), load.size(),
            spread);
      if (dedup_.resident())
        return fmt::format(
            "{} unique keys of {} rows (on resident data{}, {} records merged)",
            plan.summary.at("unique").get<std::uint64_t>(), plan.summary.at("rows").get<std::uint64_t>(),
            dedup_.resident_on_host() ? fmt::format(", records in host memory, {} buckets", dedup_.buckets()) : "",
            load[0]);
      return fmt::format("{} unique keys of {} rows ({} buckets; merged records per rank max/min {:.3f})",
                         plan.summary.at("unique").get<std::uint64_t>(), plan.summary.at("rows").get<std::uint64_t>(),
                         plan.summary.at("buckets").get<std::uint64_t>(), spread);
    }

   private:
    std::vector<std::uint64_t> merge_load() const { return dedup_.merge_rows_per_rank(ctx_.comm ? ctx_.comm->size() : 1); }
    const StepContext& ctx_;
    keys::DedupRun dedup_;
  };
};

}  // namespace

const Stage& keys_dedup() {
  static const DedupStage stage;
  return stage;
}

}  // namespace qstage::stages
