// compress.evaluate: what codec settings do to a dataset, without writing it: per chunk, the
// kernel compresses and decompresses on the pass's backend (timing both), and the host compares
// the decoded values with the original: compression ratio, maximum pointwise error against the
// guaranteed bound (a value beyond it fails the step), relative error, the fidelity
// |<a|b>| / (|a| |b|), and throughput. For a QAOA MaxCut state vector (`maxcut`), also the change
// of the circuit's result: the energy sum over the graph's edges of <Z_a Z_b>, of the original and
// of the decoded state (seed 003's measure, Fig. 11). Partials are per chunk and folded in chunk
// order, so every number but the timings is the same on every run, backend and rank count.
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>

#include "core/error.hpp"
#include "core/units.hpp"
#include "stages/compress/common.hpp"
#include "stages/compress/compress_stages.hpp"
#include "stages/common/results.hpp"
#include "stages/tn/circuit.hpp"

namespace qstage::stages {
namespace {

using namespace compress_detail;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct EvaluatePartial {
  std::uint64_t stored_bytes = 0, values = 0, beyond_bound = 0, nonfinite = 0;
  double max_error = 0;      // largest |x - y| of a real or imaginary part
  double max_abs_error = 0;  // largest |x - y| of an element (complex modulus)
  double diff_sq = 0, a_sq = 0, b_sq = 0, dot_re = 0, dot_im = 0;
  double energy_a = 0, energy_b = 0;  // sum over elements of |x|^2 c(i) and |y|^2 c(i) (maxcut)
  double encode_seconds = 0, decode_seconds = 0;
};

// A MaxCut graph on the qubits of a state vector whose flat index i is the basis state, qubit q
// being bit (qubits - 1 - q) of i (qubit 0 most significant: tn.statevector's order).
struct MaxCut {
  int qubits = 0;
  std::vector<std::pair<int, int>> edges;
  // c(i) = sum over edges of z_a z_b, z = +1 for bit 0 and -1 for bit 1: <i|sum Z_a Z_b|i>.
  double diagonal(std::uint64_t i) const {
    int c = 0;
    for (const auto& [a, b] : edges) c += ((i >> (qubits - 1 - a)) ^ (i >> (qubits - 1 - b))) & 1 ? -1 : 1;
    return c;
  }
};

void fold_into(EvaluatePartial& a, const EvaluatePartial& b) {
  a.stored_bytes += b.stored_bytes;
  a.values += b.values;
  a.beyond_bound += b.beyond_bound;
  a.nonfinite += b.nonfinite;
  a.max_error = std::max(a.max_error, b.max_error);
  a.max_abs_error = std::max(a.max_abs_error, b.max_abs_error);
  a.diff_sq += b.diff_sq;
  a.a_sq += b.a_sq;
  a.b_sq += b.b_sq;
  a.dot_re += b.dot_re;
  a.dot_im += b.dot_im;
  a.energy_a += b.energy_a;
  a.energy_b += b.energy_b;
  a.encode_seconds += b.encode_seconds;
  a.decode_seconds += b.decode_seconds;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Compares `count` elements of x (original) and y (decoded), in blocks of 4096 elements summed
// in order, so the sums do not depend on the thread count. NaN and Inf must come back bit for bit.
// `first` is x's first element's index in the dataset (for the MaxCut diagonal).
EvaluatePartial compare(const float* x, const float* y, std::uint64_t count, bool complex, double bound,
                        std::uint64_t first, const MaxCut* maxcut) {
  const int parts = complex ? 2 : 1;
  constexpr std::uint64_t kBlock = 4096;
  const std::uint64_t blocks = (count + kBlock - 1) / kBlock;
  std::vector<EvaluatePartial> per_block(blocks);
#pragma omp parallel for schedule(static)
  for (std::int64_t bi = 0; bi < static_cast<std::int64_t>(blocks); ++bi) {
    EvaluatePartial& p = per_block[static_cast<std::uint64_t>(bi)];
    const std::uint64_t end = std::min(count, (static_cast<std::uint64_t>(bi) + 1) * kBlock);
    for (std::uint64_t i = static_cast<std::uint64_t>(bi) * kBlock; i < end; ++i) {
      const float* a = x + i * parts;
      const float* b = y + i * parts;
      bool finite = true;
      double d_sq = 0;
      for (int k = 0; k < parts; ++k) {
        if (!std::isfinite(a[k])) {
          finite = false;
          if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0) ++p.beyond_bound;  // must be kept exactly
          continue;
        }
        const double d = std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k]));
        if (!(d <= bound)) ++p.beyond_bound;
        p.max_error = std::max(p.max_error, d);
        d_sq += d * d;
      }
      ++p.values;
      if (!finite) {
        ++p.nonfinite;
        continue;
      }
      const std::complex<double> ca(a[0], complex ? a[1] : 0.0f), cb(b[0], complex ? b[1] : 0.0f);
      p.max_abs_error = std::max(p.max_abs_error, std::sqrt(d_sq));
      p.diff_sq += d_sq;
      p.a_sq += std::norm(ca);
      p.b_sq += std::norm(cb);
      const std::complex<double> dot = std::conj(ca) * cb;
      p.dot_re += dot.real();
      p.dot_im += dot.imag();
      if (maxcut) {
        const double c = maxcut->diagonal(first + i);
        p.energy_a += std::norm(ca) * c;
        p.energy_b += std::norm(cb) * c;
      }
    }
  }
  EvaluatePartial total;
  for (const auto& p : per_block) fold_into(total, p);
  return total;
}

class EvaluateKernel final : public engine::PassKernel {
 public:
  EvaluateKernel(codec::ElementType type, h5::Shape chunk, std::uint64_t row_bytes, codec::Settings settings,
                 std::optional<double> range, double bound, std::optional<MaxCut> maxcut)
      : codec_(type, chunk, row_bytes), complex_(type == codec::ElementType::complex64), tile_rows_(chunk[0]),
        row_bytes_(row_bytes), settings_(settings), range_(range), bound_(bound), maxcut_(std::move(maxcut)) {}
  void prepare(Backend& backend, Stream&) override {
    backend_ = &backend;
    codec_.prepare(backend);
    decoded_ = backend.alloc_device(codec_.chunk_bytes(), "compress.evaluate: decoded chunk");
    stream_copy_ = backend.alloc_device(codec_.chunk_bytes() * 2 + (1u << 20), "compress.evaluate: stream copy");
    host_decoded_ = backend.alloc_host(codec_.chunk_bytes(), "compress.evaluate: decoded chunk");
  }
  void process(const engine::BatchView& b) override {
    auto* partials = static_cast<EvaluatePartial*>(b.partials);  // host memory (partials_on_host)
    for (std::uint64_t first = b.rows.begin, t = 0; first < b.rows.end; first += tile_rows_, ++t) {
      const std::uint64_t rows = std::min(tile_rows_, b.rows.end - first), offset = (first - b.rows.begin) * row_bytes_;
      auto t0 = Clock::now();
      const std::vector<std::uint8_t> stream =
          codec_.encode(*b.stream, static_cast<const char*>(b.inputs[0]) + offset, rows, settings_, range_);
      const double encode = seconds_since(t0);
      Stream& st = codec_.stream(*b.stream);
      if (stream.size() > stream_copy_.size()) stream_copy_ = backend_->alloc_device(stream.size(), "compress.evaluate: stream copy");
      backend_->copy_to_device(stream_copy_.data(), stream.data(), stream.size(), st);
      st.synchronize();
      t0 = Clock::now();
      codec_.decode(*b.stream, stream.data(), stream_copy_.as<std::uint8_t>(), stream.size(), decoded_.data(), rows);
      const double decode = seconds_since(t0);
      backend_->copy_to_host(host_decoded_.data(), decoded_.data(), rows * row_bytes_, st);
      st.synchronize();
      const auto* original = reinterpret_cast<const float*>(static_cast<const char*>(b.host_inputs[0]) + offset);
      const std::uint64_t element_bytes = complex_ ? 8 : 4, elements = rows * row_bytes_ / element_bytes;
      EvaluatePartial p = compare(original, host_decoded_.as<float>(), elements, complex_, bound_,
                                  first * row_bytes_ / element_bytes, maxcut_ ? &*maxcut_ : nullptr);
      p.stored_bytes = stream.size();
      p.encode_seconds = encode;
      p.decode_seconds = decode;
      std::memcpy(&partials[t], &p, sizeof p);
    }
  }

 private:
  ChunkCodec codec_;
  Backend* backend_ = nullptr;
  bool complex_;
  std::uint64_t tile_rows_, row_bytes_;
  codec::Settings settings_;
  std::optional<double> range_;
  double bound_;
  std::optional<MaxCut> maxcut_;
  Buffer decoded_, stream_copy_, host_decoded_;
};

using EvaluateReduction = engine::PartialFold<EvaluatePartial, fold_into>;

// The figures of a folded evaluation.
struct Figures {
  double input_bytes = 0, ratio = 0, fidelity = 0, relative_error = 0, compress_gbps = 0, decompress_gbps = 0;
  double energy_original = 0, energy_decoded = 0, energy_relative_error = 0;  // maxcut
};

Figures figures(const StagePlan& plan, const EvaluatePartial& r) {
  Figures f;
  f.input_bytes = static_cast<double>(plan.pass.rows * plan.pass.inputs[0].row_bytes);
  f.ratio = r.stored_bytes ? f.input_bytes / static_cast<double>(r.stored_bytes) : 0.0;
  const double norms = std::sqrt(r.a_sq * r.b_sq);
  f.fidelity = norms > 0 ? std::hypot(r.dot_re, r.dot_im) / norms : (r.a_sq == r.b_sq ? 1.0 : 0.0);
  f.relative_error = r.a_sq > 0 ? std::sqrt(r.diff_sq / r.a_sq) : std::sqrt(r.diff_sq);
  f.compress_gbps = r.encode_seconds > 0 ? f.input_bytes / r.encode_seconds / 1e9 : 0.0;
  f.decompress_gbps = r.decode_seconds > 0 ? f.input_bytes / r.decode_seconds / 1e9 : 0.0;
  // Energies of the normalized states: a change of the norm alone does not count.
  f.energy_original = r.a_sq > 0 ? r.energy_a / r.a_sq : 0.0;
  f.energy_decoded = r.b_sq > 0 ? r.energy_b / r.b_sq : 0.0;
  const double change = std::abs(f.energy_decoded - f.energy_original);
  f.energy_relative_error = f.energy_original != 0 ? change / std::abs(f.energy_original) : change;
  return f;
}

class EvaluateStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "compress.evaluate", 3,  // 3: the sums fold in a fixed tree (pairwise)
        "ratio, pointwise error against the bound, fidelity and throughput of codec settings on a dataset",
        {{"x", "the dataset to try the codec on (float32 or complex64)"}},
        "- id: try\n  stage: compress.evaluate\n  inputs: {x: amplitudes}\n  params: {pipeline: integrated, error: "
        "1.0e-3}\n"};
    return info;
  }

  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>& in) const override {
    StagePlan plan = chunk_pass(CodingParams::from_json(params), in.at("x").layout);
    plan.pass.tile_partial_bytes = sizeof(EvaluatePartial);
    plan.pass.partials_on_host = true;  // the codec's framing and the error statistics are the host's
    plan.primary_output = "ratio";
    for (const char* name : {"ratio", "max_error", "bound", "relative_error", "fidelity", "compress_gbps",
                             "decompress_gbps"})
      plan.results.push_back({name, DatasetInfo{{h5::DType::float64, {}, {}}}});
    for (const char* name : {"beyond_bound", "stored_bytes"})
      plan.results.push_back({name, DatasetInfo{{h5::DType::uint64, {}, {}}}});
    if (params.contains("maxcut")) {
      const MaxCut m = maxcut_of(params.at("maxcut"), in.at("x").layout);
      plan.summary["maxcut"] = {{"qubits", m.qubits}, {"edges", m.edges}};
      for (const char* name : {"energy_original", "energy_decoded", "energy_relative_error"})
        plan.results.push_back({name, DatasetInfo{{h5::DType::float64, {}, {}}}});
    }
    return plan;
  }

  // The graph `maxcut` names, checked against x: 2^nodes elements, edges between distinct nodes.
  static MaxCut maxcut_of(const json& p, const Layout& x) {
    MaxCut m;
    m.qubits = p.at("nodes").get<int>();
    const std::uint64_t elements = x.elements();
    if (m.qubits > 62 || elements != (std::uint64_t{1} << m.qubits))
      throw InputError(fmt::format("parameter 'maxcut': input 'x' has {} elements; expected 2^nodes = 2^{} (a state "
                                   "vector, flat index = basis state with qubit 0 most significant)",
                                   elements, m.qubits));
    if (p.contains("edges")) {
      for (const auto& e : p.at("edges")) {
        const int a = e.at(0).get<int>(), b = e.at(1).get<int>();
        if (a < 0 || b < 0 || a >= m.qubits || b >= m.qubits || a == b)
          throw InputError(fmt::format("parameter 'maxcut.edges': edge [{}, {}]; expected two different nodes in "
                                       "[0, {})", a, b, m.qubits));
        m.edges.emplace_back(a, b);
      }
    } else {
      try {  // the graph tn.build's and tn.statevector's qaoa make with these nodes and seed
        m.edges = tn::random_regular_graph(m.qubits, 3, p.at("seed").get<std::uint64_t>());
      } catch (const InputError& e) {
        throw InputError(fmt::format("parameter 'maxcut': {}", e.what()));
      }
    }
    return m;
  }

  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public RangeRun {
   public:
    using RangeRun::RangeRun;
    StepPass output(StagePlan& plan) override {
      // The decoded chunk, a device copy of its stream (grown if needed) and a host copy.
      const h5::Dataset& x = *ctx_.inputs.at("x");
      const std::uint64_t chunk = plan.pass.tile_rows * x.row_bytes();
      refine_chunk_pass(plan, ctx_, range());
      plan.pass.resident_device_bytes =
          ChunkCodec::device_bytes(ctx_.backend->kind(), element_type(*x.dtype(), "x"), chunk) + 3 * chunk + (1u << 20);
      const json& c = plan.summary.at("codec");
      const double bound = std::max(c.at("error").get<double>(), c.at("threshold").get<double>());
      std::optional<MaxCut> maxcut;
      if (plan.summary.contains("maxcut")) {
        const json& m = plan.summary.at("maxcut");
        maxcut = MaxCut{m.at("qubits").get<int>(), m.at("edges").get<std::vector<std::pair<int, int>>>()};
      }
      return planned_pass(plan,
                          std::make_unique<EvaluateKernel>(element_type(*x.dtype(), "x"), chunk_shape(x.shape(), plan.pass.tile_rows),
                                                           x.row_bytes(), params_.settings, planned_range(plan), bound,
                                                           std::move(maxcut)),
                          std::make_unique<EvaluateReduction>());
    }
    void write(const StagePlan& plan, const StepPass& pass, h5::File& out) const override;
    std::string describe(const StagePlan& plan, const StepPass& pass) const override;
  };
};

void EvaluateStage::Run::write(const StagePlan& plan, const StepPass& pass, h5::File& out) const {
  const EvaluatePartial& e = static_cast<const EvaluateReduction&>(*pass.reduction).result();
  const Figures f = figures(plan, e);
  const json& c = plan.summary.at("codec");
  const double bound = std::max(c.at("error").get<double>(), c.at("threshold").get<double>());
  detail::write_scalar(out, "ratio", h5::DType::float64, &f.ratio,
                       "input bytes / compressed bytes (streams of whole chunks)");
  detail::write_scalar(out, "max_error", h5::DType::float64, &e.max_error,
                       "largest |x - y| of a real or imaginary part");
  detail::write_scalar(out, "bound", h5::DType::float64, &bound,
                       "the guaranteed bound on that error: max(threshold, error), absolute");
  detail::write_scalar(out, "beyond_bound", h5::DType::uint64, &e.beyond_bound,
                       "parts beyond the bound, or non-finite parts changed (0)");
  detail::write_scalar(out, "relative_error", h5::DType::float64, &f.relative_error,
                       "|x - y| / |x| over all finite elements");
  detail::write_scalar(out, "fidelity", h5::DType::float64, &f.fidelity,
                       "|<x|y>| / (|x| |y|) over all finite elements");
  h5::Dataset compress_rate = detail::write_scalar(
      out, "compress_gbps", h5::DType::float64, &f.compress_gbps,
      "input GB per second of compressing chunk by chunk on this backend (framing on the host included)");
  h5::Dataset decompress_rate = detail::write_scalar(
      out, "decompress_gbps", h5::DType::float64, &f.decompress_gbps,
      "input GB per second of decompressing chunk by chunk on this backend (framing on the host included)");
  mark_measured(compress_rate);  // (timed: they differ from run to run)
  mark_measured(decompress_rate);
  detail::write_scalar(out, "stored_bytes", h5::DType::uint64, &e.stored_bytes, "bytes of the compressed streams");
  if (plan.summary.contains("maxcut")) {
    detail::write_scalar(out, "energy_original", h5::DType::float64, &f.energy_original,
                         "the MaxCut graph's energy sum over edges of <Z_a Z_b> in the original state (normalized)");
    detail::write_scalar(out, "energy_decoded", h5::DType::float64, &f.energy_decoded,
                         "the same energy in the decoded state (normalized)");
    detail::write_scalar(out, "energy_relative_error", h5::DType::float64, &f.energy_relative_error,
                         "|energy_decoded - energy_original| / |energy_original|: the change of the circuit's "
                         "result (seed 003 Fig. 11 allows 5 %)");
    out.set_attribute("maxcut", plan.summary.at("maxcut").dump());
  }
  out.set_attribute("compress.codec", c.dump());
  out.set_attribute("compress.max_abs_error", e.max_abs_error);
  if (e.beyond_bound)
    throw CheckFailed(
        fmt::format("{} of {} values came back beyond the bound {:.6g} (largest error {:.6g}): the "
                    "codec broke its guarantee; please report it with this input",
                    e.beyond_bound, e.values, bound, e.max_error));
}

std::string EvaluateStage::Run::describe(const StagePlan& plan, const StepPass& pass) const {
  const EvaluatePartial& e = static_cast<const EvaluateReduction&>(*pass.reduction).result();
  const Figures f = figures(plan, e);
  std::string energy;
  if (plan.summary.contains("maxcut"))
    energy = fmt::format(", energy {:.9g} -> {:.9g} (relative change {:.3g})", f.energy_original, f.energy_decoded,
                         f.energy_relative_error);
  return fmt::format(
      "ratio {:.2f}, max error {:.3g}, relative error {:.3g}, fidelity {:.9f}, compress {:.2f} GB/s, "
      "decompress {:.2f} GB/s{}",
      f.ratio, e.max_error, f.relative_error, f.fidelity, f.compress_gbps, f.decompress_gbps, energy);
}

}  // namespace

const Stage& compress_evaluate() {
  static const EvaluateStage stage;
  return stage;
}

}  // namespace qstage::stages
