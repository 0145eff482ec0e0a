#pragma once
// What the compression stages share: the codec settings from a step's parameters, the value
// range relative bounds refer to, the chunking, and the last chunk's zero padding.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "kernels/codec/chunk_codec.hpp"
#include "core/serial.hpp"
#include "stages/common/stage.hpp"

namespace qstage::stages::compress_detail {

// The parameters of the stages that code a dataset (compress, compress.evaluate), read once.
struct CodingParams {
  codec::Settings settings;                 // pipeline, error, threshold, bounds, block_size (checked)
  std::optional<std::uint64_t> chunk_rows;  // rows per coded chunk, if given
  std::optional<double> range;              // the value range relative bounds refer to, if given
  // Relative bounds whose range must be measured (a pass of its own, RelativeBoundsStage).
  bool range_to_measure() const { return settings.relative && !range; }
  static CodingParams from_json(const nlohmann::json& params);  // InputError naming the parameter
};

// float32 -> float32, complex64 -> complex64; anything else is an InputError naming the slot.
codec::ElementType element_type(h5::DType t, std::string_view slot);
// Rows per compressed chunk: `chunk_rows` if given, else the input's chunk rows, else about
// 4 MiB; at most the input's rows. Each chunk is one codec stream.
std::uint64_t chunk_rows_for(const CodingParams& params, const Layout& x);
h5::Shape chunk_shape(const h5::Shape& shape, std::uint64_t chunk_rows);

// The run of a stage that codes a dataset with bounds relative to its value range (max - min
// over the finite real and imaginary parts): unless the `range` parameter gives it, a first pass
// over `x` measures it, and the coding pass (the stage's output(), in a class derived from this)
// takes it from range().
class RangeRun : public StepRun {
 public:
  explicit RangeRun(const StepContext& ctx);
  bool done() const override { return !params_.range_to_measure() || measured_; }
  std::optional<StepPass> next() override;  // the range pass
  void finished(StepPass& pass) override;
  std::string save() const override;
  void load(std::string_view state) override;

 protected:
  // The range relative bounds refer to: the `range` parameter, else what the range pass measured;
  // nullopt for absolute bounds.
  std::optional<double> range() const;
  const StepContext& ctx_;
  const CodingParams params_;

 private:
  std::optional<double> measured_;
  bool measured_earlier_ = false;  // (by an earlier run of the step: load())
};

using kernels::ChunkCodec;

// The pass of a stage that codes a dataset chunk by chunk (compress, compress.evaluate): one tile
// per chunk, `x` streamed; the summary records the settings. Throws
// InputError for a bad input or parameter.
StagePlan chunk_pass(const CodingParams& params, const Layout& x);
// At run time: the range (relative bounds: the range pass's, or the parameter) into the summary.
// Returns it (nullopt for absolute bounds).
std::optional<double> refine_chunk_pass(StagePlan& plan, const StepContext& ctx, std::optional<double> range);
// The range refine_chunk_pass recorded (nullopt for absolute bounds).
std::optional<double> planned_range(const StagePlan& plan);

}  // namespace qstage::stages::compress_detail
