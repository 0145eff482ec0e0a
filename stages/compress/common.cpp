#include "stages/compress/common.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "io/compressed_chunks.hpp"
#include "io/row_io.hpp"
#include "stages/tensor/common.hpp"

namespace qstage::stages::compress_detail {

using nlohmann::json;

codec::ElementType element_type(h5::DType t, std::string_view slot) {
  if (const auto type = h5::codec_element_type(t)) return *type;
  throw InputError(fmt::format("input '{}' has dtype {}; expected float32 or complex64 (the codec's types)", slot,
                               h5::dtype_name(t)));
}

codec::Settings settings_from(const json& params) { return h5::codec_settings(params, "codec parameters"); }

std::uint64_t chunk_rows_for(const json& params, const DatasetInfo& x) {
  std::uint64_t rows = 0;
  if (params.contains("chunk_rows")) rows = params.at("chunk_rows").get<std::uint64_t>();
  else if (!x.chunk.empty()) rows = x.chunk[0];
  else rows = default_chunk_rows(x.row_bytes());
  return std::clamp<std::uint64_t>(rows, 1, std::max<std::uint64_t>(x.rows(), 1));
}

h5::Shape chunk_shape(const h5::Shape& shape, std::uint64_t chunk_rows) {
  h5::Shape c = shape;
  c[0] = chunk_rows;
  return c;
}

std::uint64_t elements_of(const h5::Shape& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

double measure_range(const h5::Dataset& x, std::uint64_t tile_rows, const mpi::Comm& comm) {
  const std::uint64_t rows = x.shape().at(0), row_bytes = x.row_bytes();
  // Reads of whole tiles of about 64 MiB, dealt to ranks in turn.
  const std::uint64_t per_read = tile_rows * std::max<std::uint64_t>(1, (64u << 20) / std::max<std::uint64_t>(tile_rows * row_bytes, 1));
  std::vector<float> buffer(per_read * row_bytes / sizeof(float));
  h5::RowReader reader(x);
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (std::uint64_t first = static_cast<std::uint64_t>(comm.rank()) * per_read; first < rows;
       first += static_cast<std::uint64_t>(comm.size()) * per_read) {
    const std::uint64_t n = std::min(per_read, rows - first);
    reader.read(first, n, buffer.data());
    const auto count = static_cast<std::int64_t>(n * row_bytes / sizeof(float));
    const float* v = buffer.data();
#pragma omp parallel for reduction(min : lo) reduction(max : hi)
    for (std::int64_t i = 0; i < count; ++i)
      if (std::isfinite(v[i])) {
        lo = std::min(lo, v[i]);
        hi = std::max(hi, v[i]);
      }
  }
  const double top = comm.max(static_cast<double>(hi)), bottom = -comm.max(-static_cast<double>(lo));
  return bottom <= top ? top - bottom : 0.0;
}

std::optional<double> range_for(const KernelContext& ctx, std::uint64_t tile_rows) {
  const json& params = ctx.params;
  const mpi::Comm& comm = *ctx.comm;
  if (params.at("bounds").get<std::string>() != "relative") return std::nullopt;
  if (params.contains("range")) return params.at("range").get<double>();
  // Kept in the work directory with the step's key, so a resumed run codes with the same range
  // without reading the input again (nlohmann's doubles round-trip exactly).
  const std::filesystem::path file = ctx.work_dir / "plan-range.json";
  std::string cached;
  if (comm.root() && !ctx.work_dir.empty() && std::filesystem::exists(file)) try {
      const json j = json::parse(fsutil::read_file(file));
      if (j.at("key").get<std::string>() == ctx.step_key) cached = j.at("range").dump();
    } catch (const std::exception&) {
      // unreadable: measured again below
    }
  cached = comm.broadcast(cached);
  if (!cached.empty()) {
    const double range = json::parse(cached).get<double>();
    if (comm.root()) spdlog::info("value range {:.6g}, measured by an earlier run of this step", range);
    return range;
  }
  const auto start = std::chrono::steady_clock::now();
  const double range = measure_range(*ctx.inputs.at("x"), tile_rows, comm);
  if (comm.root()) {
    spdlog::info("value range {:.6g}, measured in {:.2f}s (give the parameter 'range' to skip this read)", range,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (!ctx.work_dir.empty()) try {  // (only saves a read on resume: a failure is not an error)
        std::filesystem::create_directories(ctx.work_dir);
        fsutil::write_file_atomic(file, json{{"key", ctx.step_key}, {"range", range}}.dump());
      } catch (const std::exception& e) {
        spdlog::warn("could not keep the value range in {}: {}", file.string(), e.what());
      }
  }
  return range;
}

StagePlan chunk_pass(const json& params, const DatasetInfo& x) {
  const codec::ElementType type = element_type(x.dtype, "x");
  const codec::Settings settings = settings_from(params);
  if (x.shape.empty() || x.rows() == 0)
    throw InputError(fmt::format("input 'x' has shape {}; expected at least one row", detail::shape_text(x.shape)));
  const std::uint64_t chunk_rows = chunk_rows_for(params, x);
  detail::row_chunk(x.shape, chunk_rows, x.dtype, "parameter 'chunk_rows'");  // checks HDF5's chunk limit
  StagePlan plan;
  plan.pass.rows = x.rows();
  plan.pass.tile_rows = chunk_rows;
  plan.pass.inputs.push_back({"x", nullptr, x.row_bytes()});
  plan.pass.partials_on_host = true;
  plan.streamed_inputs = {"x"};
  plan.summary = {{"shape", x.shape}, {"dtype", h5::dtype_name(x.dtype)}, {"chunk_rows", chunk_rows},
                  {"codec", h5::codec_summary(settings, params.contains("range") ? std::optional(params["range"].get<double>())
                                                                             : std::nullopt,
                                          type)}};
  return plan;
}

void refine_chunk_pass(StagePlan& plan, const KernelContext& ctx, std::uint64_t extra_device_bytes) {
  const h5::Dataset& x = *ctx.inputs.at("x");
  const codec::ElementType type = element_type(*x.dtype(), "x");
  const auto range = range_for(ctx, plan.pass.tile_rows);
  plan.summary["codec"] = h5::codec_summary(settings_from(ctx.params), range, type);
  plan.pass.resident_device_bytes =
      ChunkCodec::device_bytes(ctx.backend->kind(), type, plan.pass.tile_rows * x.row_bytes()) + extra_device_bytes;
}

std::optional<double> planned_range(const StagePlan& plan) {
  const json& r = plan.summary.at("codec").at("range");
  return r.is_number() ? std::optional(r.get<double>()) : std::nullopt;
}

}  // namespace qstage::stages::compress_detail
