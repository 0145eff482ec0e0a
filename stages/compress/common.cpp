#include "stages/compress/common.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "io/compressed_chunks.hpp"
#include "stages/common/params.hpp"
#include "stages/common/results.hpp"

namespace qstage::stages::compress_detail {

using nlohmann::json;

codec::ElementType element_type(h5::DType t, std::string_view slot) {
  if (const auto type = h5::codec_element_type(t)) return *type;
  throw InputError(fmt::format("input '{}' has dtype {}; expected float32 or complex64 (the codec's types)", slot,
                               h5::dtype_name(t)));
}


CodingParams CodingParams::from_json(const json& params) {
  CodingParams p;
  p.settings = h5::codec_settings(params, "codec parameters");
  p.chunk_rows = params::optional<std::uint64_t>(params, "chunk_rows");
  p.range = params::optional<double>(params, "range");
  return p;
}

std::uint64_t chunk_rows_for(const CodingParams& params, const Layout& x) {
  std::uint64_t rows = 0;
  if (params.chunk_rows) rows = *params.chunk_rows;
  else if (x.chunked()) rows = x.chunk[0];
  else rows = default_chunk_rows(x.row_bytes());
  return std::clamp<std::uint64_t>(rows, 1, std::max<std::uint64_t>(x.rows(), 1));
}

h5::Shape chunk_shape(const h5::Shape& shape, std::uint64_t chunk_rows) {
  h5::Shape c = shape;
  c[0] = chunk_rows;
  return c;
}

namespace {

// Per tile of the range pass: the least and greatest finite float of its values.
struct RangePartial {
  float lo = std::numeric_limits<float>::infinity(), hi = -std::numeric_limits<float>::infinity();
};

// The range pass's work, on the host's copy of each batch: a scan for the extremes is bound by
// reading the data, which the host has already read; the device would add nothing.
class RangeKernel final : public engine::PassKernel {
 public:
  RangeKernel(std::uint64_t tile_rows, std::uint64_t row_bytes) : tile_rows_(tile_rows), row_bytes_(row_bytes) {}
  void process(const engine::BatchView& b) override {
    auto* partials = static_cast<RangePartial*>(b.partials);  // host memory (partials_on_host)
    for (std::uint64_t first = b.rows.begin, t = 0; first < b.rows.end; first += tile_rows_, ++t) {
      const std::uint64_t rows = std::min(tile_rows_, b.rows.end - first);
      const auto* v = reinterpret_cast<const float*>(static_cast<const char*>(b.host_inputs[0]) +
                                                     (first - b.rows.begin) * row_bytes_);
      const auto count = static_cast<std::int64_t>(rows * row_bytes_ / sizeof(float));
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
#pragma omp parallel for reduction(min : lo) reduction(max : hi)
      for (std::int64_t i = 0; i < count; ++i)
        if (std::isfinite(v[i])) {
          lo = std::min(lo, v[i]);
          hi = std::max(hi, v[i]);
        }
      partials[t] = {lo, hi};
    }
  }

 private:
  std::uint64_t tile_rows_, row_bytes_;
};

// min and max are exact: the range does not depend on the order of the tiles.
void widen(RangePartial& into, const RangePartial& from) {
  into.lo = std::min(into.lo, from.lo);
  into.hi = std::max(into.hi, from.hi);
}
using RangeReduction = engine::PartialFold<RangePartial, widen>;

// max - min, 0 when no value is finite.
double range_of(const RangePartial& r) {
  const double top = r.hi, bottom = r.lo;
  return bottom <= top ? top - bottom : 0.0;
}

}  // namespace

RangeRun::RangeRun(const StepContext& ctx) : ctx_(ctx), params_(CodingParams::from_json(ctx.params)) {}

std::optional<StepPass> RangeRun::next() {
  const h5::Dataset& x = *ctx_.inputs.at("x");
  StepPass p;
  p.name = "range";
  p.pass.rows = ctx_.plan.pass.rows;
  p.pass.tile_rows = ctx_.plan.pass.tile_rows;
  p.pass.inputs.push_back({"x", nullptr, x.row_bytes()});
  p.pass.inputs.back().place = engine::StreamedInput::Place::host;  // the host scans its copy
  p.pass.tile_partial_bytes = sizeof(RangePartial);
  p.pass.partials_on_host = true;
  p.streamed_inputs = {"x"};
  p.kernel = std::make_unique<RangeKernel>(p.pass.tile_rows, x.row_bytes());
  p.reduction = std::make_unique<RangeReduction>();
  return p;
}

void RangeRun::finished(StepPass& pass) {
  measured_ = range_of(static_cast<const RangeReduction&>(*pass.reduction).result());
  if (ctx_.comm->root())
    spdlog::info("value range {:.6g}, measured in the range pass (give the parameter 'range' to skip it)", *measured_);
}

std::string RangeRun::save() const {
  Packer out;
  out.put<std::uint8_t>(measured_.has_value());
  out.put(measured_.value_or(0.0));
  return out.take();
}

void RangeRun::load(std::string_view state) {
  Unpacker in(state);
  const bool has = in.get<std::uint8_t>() != 0;
  const double range = in.get<double>();
  in.finish();
  if (has) measured_ = range, measured_earlier_ = true;
}

std::optional<double> RangeRun::range() const {
  if (!params_.settings.relative) return std::nullopt;
  if (params_.range) return params_.range;
  if (!measured_) throw std::logic_error("relative bounds without a range: the range pass did not run");
  if (measured_earlier_ && ctx_.comm->root())
    spdlog::info("value range {:.6g}, measured by an earlier run of this step", *measured_);
  return measured_;
}

StagePlan chunk_pass(const CodingParams& params, const Layout& x) {
  const codec::ElementType type = element_type(x.dtype, "x");
  const codec::Settings& settings = params.settings;
  if (x.shape.empty() || x.rows() == 0)
    throw InputError(fmt::format("input 'x' has shape {}; expected at least one row", shape_text(x.shape)));
  const std::uint64_t chunk_rows = chunk_rows_for(params, x);
  detail::row_chunk(x.shape, chunk_rows, x.dtype, "parameter 'chunk_rows'");  // checks HDF5's chunk limit
  StagePlan plan;
  plan.pass.rows = x.rows();
  plan.pass.tile_rows = chunk_rows;
  plan.pass.inputs.push_back({"x", nullptr, x.row_bytes()});
  plan.streamed_inputs = {"x"};
  plan.summary = {{"shape", x.shape}, {"dtype", h5::dtype_name(x.dtype)}, {"chunk_rows", chunk_rows},
                  {"codec", h5::codec_summary(settings, params.range, type)}};
  return plan;
}

std::optional<double> refine_chunk_pass(StagePlan& plan, const StepContext& ctx, std::optional<double> range) {
  const codec::ElementType type = element_type(*ctx.inputs.at("x")->dtype(), "x");
  plan.summary["codec"] = h5::codec_summary(CodingParams::from_json(ctx.params).settings, range, type);
  return range;
}

std::optional<double> planned_range(const StagePlan& plan) {
  const json& r = plan.summary.at("codec").at("range");
  return r.is_number() ? std::optional(r.get<double>()) : std::nullopt;
}

}  // namespace qstage::stages::compress_detail
