// compress: a float32 or complex64 dataset into a chunked dataset whose chunks are streams of
// qstage's error-bounded codec, stored under HDF5 filter 32881, so that h5py (with the plugin)
// reads it as plain values and `decompress` decodes it on the device.
//
// Each chunk of rows is one stream, coded by the pass's kernel on the device (kernels/codec.cu)
// or the CPU, with bounds relative to the range of the whole dataset (measured in a first,
// parallel read unless the `range` parameter gives it). Compressed sizes vary, so the streams
// leave the pass as per-tile partials: rank 0 appends them in chunk order to a spool file in the
// step's work directory, made durable at every checkpoint. Parallel HDF5 1.10 cannot write
// compressed chunks from several ranks (direct chunk writes are not coordinated and silently
// misplace chunks), so rank 0 alone writes them into the output at the end (finish_output).
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/units.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "stages/compress/common.hpp"
#include "stages/compress/compress_stages.hpp"
#include "stages/tensor/common.hpp"

namespace qstage::stages {
namespace {

namespace fs = std::filesystem;
using namespace compress_detail;
using nlohmann::json;

constexpr const char* kSpool = "chunks.bin";

// A tile's partial: the stream's size, then the stream.
std::uint64_t partial_bytes(codec::ElementType type, const h5::Shape& chunk) {
  const std::uint64_t bytes = 8 + codec::max_stream_bytes(type, elements_of(chunk), chunk.size());
  return (bytes + 7) / 8 * 8;
}

class CompressKernel final : public engine::PassKernel {
 public:
  CompressKernel(codec::ElementType type, h5::Shape chunk, std::uint64_t row_bytes, codec::Settings settings,
                 std::optional<double> range, std::uint64_t partial)
      : codec_(type, chunk, row_bytes), tile_rows_(chunk[0]), row_bytes_(row_bytes), settings_(settings), range_(range),
        partial_(partial) {}
  void prepare(Backend& backend, Stream&) override { codec_.prepare(backend); }
  void process(const engine::BatchView& b) override {
    auto* partials = static_cast<std::byte*>(b.partials);  // host memory (partials_on_host)
    for (std::uint64_t first = b.rows.begin, t = 0; first < b.rows.end; first += tile_rows_, ++t) {
      const std::uint64_t rows = std::min(tile_rows_, b.rows.end - first);
      const auto* x = static_cast<const char*>(b.inputs[0]) + (first - b.rows.begin) * row_bytes_;
      const std::vector<std::uint8_t> stream = codec_.encode(*b.stream, x, rows, settings_, range_);
      const std::uint64_t size = stream.size();
      if (8 + size > partial_) throw std::logic_error("a compressed chunk exceeds its bound");
      std::memcpy(partials + t * partial_, &size, 8);
      std::memcpy(partials + t * partial_ + 8, stream.data(), size);
    }
  }

 private:
  ChunkCodec codec_;
  std::uint64_t tile_rows_, row_bytes_;
  codec::Settings settings_;
  std::optional<double> range_;
  std::uint64_t partial_;
};

// Appends each tile's stream, in chunk order, to the spool file on rank 0. Its state (in the
// journal) is the committed length and the streams' sizes; a resumed run first cuts the spool
// back to that length, dropping what an interrupted run appended after its last checkpoint.
class ChunkSpool final : public engine::Reduction {
 public:
  ~ChunkSpool() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void attach(const fs::path& dir) override { path_ = dir / kSpool; }
  std::vector<std::string> files() const override { return {kSpool}; }

  void fold(const std::byte* tile) override {
    std::uint64_t size;
    std::memcpy(&size, tile, 8);
    open_for_append();
    write_all(tile + 8, size);
    sizes_.push_back(size);
    bytes_ += size;
  }

  std::string save() const override {
    open_for_append();  // the file exists even before the first stream
    if (::fdatasync(fd_) != 0) fail("fdatasync");
    std::string state(16 + 8 * sizes_.size(), '\0');
    const std::uint64_t count = sizes_.size();
    std::memcpy(state.data(), &bytes_, 8);
    std::memcpy(state.data() + 8, &count, 8);
    if (count) std::memcpy(state.data() + 16, sizes_.data(), 8 * count);
    return state;
  }

  void load(const std::string& state) override {
    std::uint64_t count = 0;
    if (state.size() < 16) throw std::runtime_error("compress: saved spool state is too short");
    std::memcpy(&bytes_, state.data(), 8);
    std::memcpy(&count, state.data() + 8, 8);
    if (state.size() != 16 + 8 * count) throw std::runtime_error("compress: saved spool state has the wrong size");
    sizes_.resize(count);
    if (count) std::memcpy(sizes_.data(), state.data() + 16, 8 * count);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;  // reopened (and cut back to bytes_) by the next fold on rank 0
  }

  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  std::uint64_t bytes() const { return bytes_; }
  const fs::path& path() const { return path_; }

 private:
  void open_for_append() const {
    if (fd_ >= 0) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("open");
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) fail("truncate");
    if (::lseek(fd_, static_cast<off_t>(bytes_), SEEK_SET) < 0) fail("seek");
  }
  void write_all(const std::byte* p, std::uint64_t n) const {
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail("write");
      p += k;
      n -= static_cast<std::uint64_t>(k);
    }
  }
  [[noreturn]] void fail(const char* what) const {
    throw RuntimeFailure(fmt::format("compress: {} of the chunk spool '{}' failed: {}", what, path_.string(),
                                     std::strerror(errno)));
  }

  fs::path path_;
  mutable int fd_ = -1;
  std::vector<std::uint64_t> sizes_;
  std::uint64_t bytes_ = 0;
};

class CompressStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "compress", 1,
        "error-bounded lossy compression of a float32/complex64 dataset into chunks h5py reads through filter 32881",
        {{"x", "the dataset to compress (float32 or complex64)"}},
        "- id: packed\n  stage: compress\n  inputs: {x: amplitudes}\n  params: {pipeline: quantized, error: 1.0e-3, "
        "threshold: 1.0e-3}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    const DatasetInfo& x = in.at("x");
    StagePlan plan = chunk_pass(params, x);
    const h5::Shape chunk = chunk_shape(x.shape, plan.pass.tile_rows);
    plan.pass.tile_partial_bytes = partial_bytes(element_type(x.dtype, "x"), chunk);
    plan.pass.sized_partials = true;  // only the streams travel to rank 0
    const std::string name = params.at("dataset").get<std::string>();
    plan.primary_output = name;
    plan.results = {{name, DatasetInfo{x.dtype, x.shape, chunk, {h5z::kFilterId}}}};
    return plan;
  }

  void refine_plan(StagePlan& plan, const KernelContext& ctx) const override { refine_chunk_pass(plan, ctx); }

  std::unique_ptr<engine::PassKernel> make_kernel(const KernelContext& ctx) const override {
    const h5::Dataset& x = *ctx.inputs.at("x");
    return std::make_unique<CompressKernel>(element_type(*x.dtype(), "x"), chunk_shape(x.shape(), ctx.plan.pass.tile_rows),
                                            x.row_bytes(), settings_from(ctx.params), planned_range(ctx.plan),
                                            ctx.plan.pass.tile_partial_bytes);
  }

  std::unique_ptr<engine::Reduction> make_reduction(const StagePlan&) const override {
    return std::make_unique<ChunkSpool>();
  }

  void write_results(const StagePlan& plan, const StepResults& r, h5::File& out) const override {
    const auto& spool = *static_cast<const ChunkSpool*>(r.reduction);
    const std::uint64_t input = plan.pass.rows * plan.pass.inputs[0].row_bytes;
    out.set_attribute("compress.input_bytes", input);
    out.set_attribute("compress.stored_bytes", spool.bytes());
    out.set_attribute("compress.ratio", spool.bytes() ? static_cast<double>(input) / static_cast<double>(spool.bytes()) : 0.0);
    out.set_attribute("compress.codec", plan.summary.at("codec").dump());
  }

  std::map<std::string, std::string> finish_output(const StagePlan& plan, const StepResults& r,
                                                   const fs::path& file) const override {
    const auto& spool = *static_cast<const ChunkSpool*>(r.reduction);
    const DatasetInfo& info = plan.results.at(0).second;
    const json& c = plan.summary.at("codec");
    const codec::ElementType type = element_type(info.dtype, "x");
    // The stored streams carry absolute bounds; the filter's cd_values say the same, so that
    // h5repack or h5py rewriting the dataset keeps them.
    codec::Settings absolute = settings_from(r.context->params);
    absolute.relative = false;
    absolute.threshold = c.at("threshold").get<double>();
    absolute.error = c.at("error").get<double>();

    h5::File out = h5::File::open(file, h5::Mode::read_write);  // serial: rank 0 alone
    h5::Dataset d = out.create_dataset(plan.results.at(0).first, {info.dtype, info.shape, info.chunk, false, false},
                                       {{h5z::kFilterId, h5z::cd_values(type, absolute)}});
    const int fd = ::open(spool.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      throw RuntimeFailure(fmt::format("compress: cannot open the chunk spool '{}': {}", spool.path().string(),
                                       std::strerror(errno)));
    XXH64_state_t* hash = XXH64_createState();
    XXH64_reset(hash, 0);
    std::vector<std::uint8_t> buffer;
    std::uint64_t at = 0;
    try {
      for (std::uint64_t k = 0; k < spool.sizes().size(); ++k) {
        const std::uint64_t size = spool.sizes()[k];
        buffer.resize(size);
        for (std::uint64_t done = 0; done < size;) {
          const ssize_t n = ::pread(fd, buffer.data() + done, size - done, static_cast<off_t>(at + done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) throw RuntimeFailure(fmt::format("compress: the chunk spool '{}' ends early", spool.path().string()));
          done += static_cast<std::uint64_t>(n);
        }
        d.write_stored_chunk(k, buffer.data(), size);
        XXH64_update(hash, buffer.data(), size);
        at += size;
      }
    } catch (...) {
      ::close(fd);
      XXH64_freeState(hash);
      throw;
    }
    ::close(fd);
    const std::uint64_t digest = XXH64_digest(hash);
    XXH64_freeState(hash);
    d.set_attribute("description", "values compressed with qstage's error-bounded codec: every real and imaginary "
                                   "part is within max(threshold, error) of the original; read it with h5py and "
                                   "HDF5_PLUGIN_PATH naming qstage's plugin folder, or decode it with `decompress`");
    d.set_attribute("codec.filter_id", static_cast<std::int64_t>(h5z::kFilterId));
    d.set_attribute("codec.pipeline", c.at("pipeline").get<std::string>());
    d.set_attribute("codec.block_size", c.at("block_size").get<std::int64_t>());
    d.set_attribute("codec.bounds", c.at("bounds").get<std::string>());
    d.set_attribute("codec.error", c.at("error").get<double>());
    d.set_attribute("codec.threshold", c.at("threshold").get<double>());
    d.set_attribute("codec.error_given", c.at("error_given").get<double>());
    d.set_attribute("codec.threshold_given", c.at("threshold_given").get<double>());
    if (c.at("range").is_number()) d.set_attribute("codec.range", c.at("range").get<double>());
    d.set_attribute("codec.stored_bytes", spool.bytes());
    d.set_attribute("stored_xxh64", hex64(digest));
    d = h5::Dataset();
    out.flush();
    out.close();
    return {{plan.results.at(0).first, hex64(digest)}};
  }

  std::string describe_results(const StagePlan& plan, const StepResults& r) const override {
    const auto& spool = *static_cast<const ChunkSpool*>(r.reduction);
    const double input = static_cast<double>(plan.pass.rows * plan.pass.inputs[0].row_bytes);
    const json& c = plan.summary.at("codec");
    return fmt::format("{} chunks, {} -> {} (ratio {:.2f}), {} bound {:.3g} (threshold {:.3g})", spool.sizes().size(),
                       format_bytes(input), format_bytes(static_cast<double>(spool.bytes())),
                       spool.bytes() ? input / static_cast<double>(spool.bytes()) : 0.0,
                       c.at("pipeline").get<std::string>(), c.at("error").get<double>(), c.at("threshold").get<double>());
  }
};

}  // namespace

const Stage& compress() {
  static const CompressStage stage;
  return stage;
}

}  // namespace qstage::stages
