// tn.statevector: the independent oracle for circuits. Simulates the state vector on the device
// (up to about 30 qubits on one GPU) and writes the same layout as tn.contract: amplitudes per
// bitstring (2^k per bitstring with open qubits), or the expectation value of a Pauli string.
#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <complex>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/hash.hpp"
#include "core/signals.hpp"
#include "core/units.hpp"
#include "kernels/linalg/dot.hpp"
#include "kernels/tn/statevector.hpp"
#include "stages/common/params.hpp"
#include "stages/tn/sources.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using cd = std::complex<double>;

struct Job {
  tn::Circuit circuit;
  std::vector<std::vector<std::uint8_t>> bitstrings;
  std::vector<int> open;
  std::optional<std::vector<std::pair<int, char>>> pauli;
  h5::DType dtype = h5::DType::complex128;
  std::uint64_t per_row() const { return pauli ? 1 : std::uint64_t{1} << open.size(); }
};

struct Params {
  tn::SourceParams source;  // the circuit and what to compute of it
  h5::DType precision;
  static Params from_json(const json& p) { return {tn::SourceParams::from_json(p), params::precision(p)}; }
};

Job job_of(const StepContext& ctx) {
  const Params p = Params::from_json(ctx.params);
  Job j;
  j.circuit = tn::circuit_from_params(p.source, ctx.files);
  if (j.circuit.qubits > 34)
    throw InputError(fmt::format("the circuit has {} qubits; the state vector needs 2^{} amplitudes; expected at most 34 "
                                 "qubits (use tn.contract)", j.circuit.qubits, j.circuit.qubits));
  j.pauli = tn::pauli_from_params(p.source, j.circuit.qubits);
  j.open = tn::open_qubits_from_params(p.source, j.circuit.qubits);
  if (!j.pauli) j.bitstrings = tn::bitstrings_from_params(p.source, ctx.files, j.circuit.qubits);
  j.dtype = p.precision;
  return j;
}

kernels::GateOperands operands(const tn::Gate& g) {
  if (g.arity() > kernels::kMaxGateQubits)
    throw InputError(fmt::format("gate '{}' acts on {} qubits; the state vector applies at most 3", g.name, g.arity()));
  kernels::GateOperands o;
  o.k = g.arity();
  for (int j = 0; j < o.k; ++j) o.targets[j] = g.qubits[static_cast<size_t>(j)];
  for (size_t i = 0; i < g.matrix.size(); ++i) {
    o.matrix[2 * i] = g.matrix[i].real();
    o.matrix[2 * i + 1] = g.matrix[i].imag();
  }
  return o;
}

// The state after some of the circuit's gates, kept in the step's work directory when a stop is
// requested between gates: the raw amplitudes (stage-statevector.bin) and what they are
// (stage-statevector.json: the step key, the gates applied, the size and hash of the .bin,
// written after it). A resumed run of the same step starts from there, with the same bits.
class GateCheckpoint {
 public:
  GateCheckpoint(const StepContext& ctx)
      : bin_(ctx.work_dir / "stage-statevector.bin"), meta_(ctx.work_dir / "stage-statevector.json"),
        key_(ctx.step_key) {}

  // The gates the saved state has had, if a saved state of this step is there and whole.
  std::optional<std::size_t> saved_gates(std::uint64_t bytes) const {
    std::error_code ec;
    if (!std::filesystem::exists(meta_, ec)) return std::nullopt;
    try {
      const json j = json::parse(fsutil::read_file(meta_));
      if (j.at("key").get<std::string>() != key_ || j.at("bytes").get<std::uint64_t>() != bytes ||
          std::filesystem::file_size(bin_) != bytes || hash_file(bin_) != j.at("hash").get<std::string>()) {
        spdlog::warn("discarding {}: it does not hold the state it records", bin_.string());
        return std::nullopt;
      }
      return j.at("gates").get<std::size_t>();
    } catch (const std::exception& e) {
      spdlog::warn("discarding {}: {}", meta_.string(), e.what());
      return std::nullopt;
    }
  }

  void load(Backend& backend, Stream& stream, Buffer& state, std::uint64_t bytes) const {
    std::ifstream in(bin_, std::ios::binary);
    std::vector<char> piece(std::min<std::uint64_t>(bytes, kPiece));
    for (std::uint64_t at = 0; at < bytes; at += piece.size()) {
      const std::uint64_t n = std::min<std::uint64_t>(piece.size(), bytes - at);
      if (!in.read(piece.data(), static_cast<std::streamsize>(n)))
        throw RuntimeFailure(fmt::format("could not read {}", bin_.string()));
      backend.copy_to_device(state.as<char>() + at, piece.data(), n, stream);
      stream.synchronize();
    }
  }

  // Rank 0: the state after `gates` gates, committed (the .bin, then the .json naming it).
  void save(Backend& backend, Stream& stream, const Buffer& state, std::uint64_t bytes, std::size_t gates) const {
    const auto temp = fsutil::temp_path(bin_);
    {
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      std::vector<char> piece(std::min<std::uint64_t>(bytes, kPiece));
      for (std::uint64_t at = 0; at < bytes; at += piece.size()) {
        const std::uint64_t n = std::min<std::uint64_t>(piece.size(), bytes - at);
        backend.copy_to_host(piece.data(), state.as<const char>() + at, n, stream);
        stream.synchronize();
        out.write(piece.data(), static_cast<std::streamsize>(n));
      }
      if (!out.flush()) throw RuntimeFailure(fmt::format("could not write {}", temp.string()));
    }
    fsutil::commit_rename(temp, bin_);
    fsutil::write_file_atomic(meta_, json{{"key", key_}, {"gates", gates}, {"bytes", bytes}, {"hash", hash_file(bin_)}}.dump());
  }

 private:
  static constexpr std::uint64_t kPiece = std::uint64_t{8} << 20;  // host staging, not budgeted: small
  std::filesystem::path bin_, meta_;
  std::string key_;
};

class StateVectorKernel final : public engine::PassKernel {
 public:
  StateVectorKernel(Job job, const StepContext& ctx) : job_(std::move(job)), checkpoint_(ctx), comm_(ctx.comm) {}

  void prepare(Backend& backend, Stream& stream) override {
    backend_ = &backend;
    const std::uint64_t n = std::uint64_t{1} << job_.circuit.qubits, e = h5::dtype_size(job_.dtype);
    state_ = backend.alloc_device(n * e, "statevector: state");
    fill_zero(backend, stream, state_, n * e);
    const double one_d[2] = {1, 0};
    const float one_f[2] = {1, 0};
    backend.copy_to_device(state_.data(), job_.dtype == h5::DType::complex64 ? static_cast<const void*>(one_f) : one_d, e, stream);
    stream.synchronize();
    apply_gates(backend, stream, n * e);
    if (job_.pauli) {
      Buffer phi = backend.alloc_device(n * e, "statevector: P|psi>");
      backend.copy_on_device(phi.data(), state_.data(), n * e, stream);
      for (auto [q, p] : *job_.pauli) {
        const char* name = p == 'X' ? "x" : p == 'Y' ? "y" : "z";
        kernels::apply_gate(stream, {job_.dtype, phi.data(), job_.circuit.qubits,
                                     operands({name, {q}, {}, tn::gate_matrix(name, {}, "pauli"), 0, 0})});
      }
      kernels::Dotc d{job_.dtype, state_.data(), phi.data(), n, 1 << 16, nullptr};
      const std::uint64_t tiles = kernels::dotc_tiles(d);
      Buffer partials = backend.alloc_device(tiles * 16, "statevector: dot partials");
      d.partials = partials.as<double>();
      kernels::dotc(stream, d);
      std::vector<double> host(tiles * 2);
      backend.copy_to_host(host.data(), partials.data(), tiles * 16, stream);
      stream.synchronize();
      cd sum = 0;
      for (std::uint64_t t = 0; t < tiles; ++t) sum += cd(host[2 * t], host[2 * t + 1]);  // tile order
      value_ = sum;
      return;
    }
    const std::vector<std::uint64_t> idx = basis_indices();
    indices_ = backend.alloc_device(idx.size() * 8, "statevector: indices");
    backend.copy_to_device(indices_.data(), idx.data(), idx.size() * 8, stream);
    stream.synchronize();
  }

  // The circuit's gates on the state, from where a stopped run left it. Between gates every rank
  // asks whether a stop was requested on any (each rank simulates the whole state, so all reach
  // the same gate); on a stop, rank 0 commits the state and every rank stops there.
  void apply_gates(Backend& backend, Stream& stream, std::uint64_t bytes) {
    const std::size_t total = job_.circuit.gates.size();
    std::size_t first = 0;
    if (const auto saved = checkpoint_.saved_gates(bytes); saved && *saved <= total) {
      checkpoint_.load(backend, stream, state_, bytes);
      first = *saved;
      if (!comm_ || comm_->root()) spdlog::info("state vector: resuming after gate {} of {}", first, total);
    }
    for (std::size_t g = first; g < total; ++g) {
      kernels::apply_gate(stream, {job_.dtype, state_.data(), job_.circuit.qubits, operands(job_.circuit.gates[g])});
      const bool stop = signals::stop_requested() != 0;
      if (g + 1 < total && (comm_ ? comm_->any(stop) : stop)) {
        stream.synchronize();
        std::string error;
        if (!comm_ || comm_->root()) try {
            checkpoint_.save(backend, stream, state_, bytes, g + 1);
          } catch (const std::exception& e) {
            error = e.what();
          }
        if (comm_) error = comm_->broadcast(error);
        if (!error.empty()) throw RuntimeFailure(fmt::format("could not commit the state vector: {}", error));
        throw StopRequested(fmt::format("after gate {} of {}", g + 1, total));
      }
    }
  }

  // Basis indices of every requested amplitude, row by row: the row's bitstring with its open
  // qubits cleared, OR amplitude v's open bits (open[0] is v's most significant) at their
  // qubits, looked up 16 bits of v at a time (a per-bit loop took seconds for 2^26 amplitudes).
  std::vector<std::uint64_t> basis_indices() const {
    const std::size_t k = job_.open.size();
    const std::uint64_t per_row = job_.per_row();
    std::uint64_t open_mask = 0;
    for (int q : job_.open) open_mask |= std::uint64_t{1} << q;
    std::vector<std::vector<std::uint64_t>> spread;  // spread[c][u]: bits 16c .. 16c + 15 of v = u
    for (std::size_t c = 0; 16 * c < k; ++c) {
      spread.emplace_back(std::size_t{1} << 16, 0);
      for (std::uint64_t u = 0; u < (1u << 16); ++u)
        for (std::size_t i = 0; i < 16 && 16 * c + i < k; ++i)
          if ((u >> i) & 1) spread[c][u] |= std::uint64_t{1} << job_.open[k - 1 - (16 * c + i)];
    }
    const auto rows = static_cast<std::int64_t>(job_.bitstrings.size());
    std::vector<std::uint64_t> idx(job_.bitstrings.size() * per_row);
#pragma omp parallel for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto& bits = job_.bitstrings[static_cast<std::size_t>(r)];
      std::uint64_t base = 0;
      for (std::size_t q = 0; q < bits.size(); ++q) base |= std::uint64_t{bits[q]} << q;
      base &= ~open_mask;
      std::uint64_t* out = idx.data() + static_cast<std::uint64_t>(r) * per_row;
      for (std::uint64_t v = 0; v < per_row; ++v) {
        std::uint64_t x = base;
        for (std::size_t c = 0; c < spread.size(); ++c) x |= spread[c][(v >> (16 * c)) & 0xffff];
        out[v] = x;
      }
    }
    return idx;
  }

  void process(const engine::BatchView& b) override {
    if (job_.pauli) {
      const double vd[2] = {value_.real(), value_.imag()};
      const float vf[2] = {static_cast<float>(value_.real()), static_cast<float>(value_.imag())};
      backend_->copy_to_device(b.outputs[0], job_.dtype == h5::DType::complex64 ? static_cast<const void*>(vf) : vd,
                               h5::dtype_size(job_.dtype), *b.stream);
      b.stream->synchronize();
      return;
    }
    const std::uint64_t per_row = job_.per_row();
    kernels::gather_amplitudes(*b.stream, {job_.dtype, state_.data(), indices_.as<std::uint64_t>() + b.rows.begin * per_row,
                                           b.rows.size() * per_row, b.outputs[0]});
  }

 private:
  // Zeroes device memory by doubling a zeroed block with device copies.
  static void fill_zero(Backend& backend, Stream& stream, Buffer& buf, std::uint64_t bytes) {
    std::vector<char> zeros(std::min<std::uint64_t>(bytes, 1 << 20), 0);
    backend.copy_to_device(buf.data(), zeros.data(), zeros.size(), stream);
    stream.synchronize();
    for (std::uint64_t done = zeros.size(); done < bytes;) {
      const std::uint64_t n = std::min(done, bytes - done);
      backend.copy_on_device(buf.as<char>() + done, buf.data(), n, stream);
      done += n;
    }
    stream.synchronize();
  }

  Job job_;
  GateCheckpoint checkpoint_;
  const mpi::Comm* comm_;
  Backend* backend_ = nullptr;
  Buffer state_, indices_;
  cd value_ = 0;
};

class StateVectorStage final : public Stage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tn.statevector", 1,
        "state-vector simulation (up to ~30 qubits on one GPU): amplitudes or a Pauli expectation, to check tn.contract",
        {},
        "- id: oracle\n  stage: tn.statevector\n  params:\n    random: {rows: 4, cols: 5, cycles: 12, seed: 1}\n"
        "    random_bitstrings: {count: 4, seed: 2}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override { return tn::source_file_parameters(); }
  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>&) const override {
    const Params p = Params::from_json(params);
    if (!p.source.has_circuit())
      throw InputError("no circuit; expected one of circuit (a file), random, qaoa or lattice");
    StagePlan plan;  // sizes come from the circuit: the run's output()
    plan.pass.rows = 0;
    plan.primary_output = p.source.pauli ? "value" : "amplitudes";
    plan.results = {{plan.primary_output, {{p.precision, planned_shape(p.source), {}}}}};
    return plan;
  }
  // The output's shape where the parameters alone tell (a later step may plan with it): rows
  // are the bitstrings (a file's only with `count`), 2^open amplitudes each; else unknown (empty).
  static h5::Shape planned_shape(const tn::SourceParams& p) {
    if (p.pauli) return {1};
    std::uint64_t rows = 0;
    if (p.bitstrings) rows = p.bitstrings->size();
    else if (p.random_bitstrings) rows = p.random_bitstrings->first;
    else if (p.bitstrings_file) rows = p.count.value_or(0);
    else rows = 1;
    const std::size_t open = p.open.size();
    if (rows == 0 || open > 34) return {};
    return open == 0 ? h5::Shape{rows} : h5::Shape{rows, std::uint64_t{1} << open};
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public OutputPassRun {
   public:
    using OutputPassRun::OutputPassRun;
    StepPass output(StagePlan& plan) override;
    void write(const StagePlan& plan, const StepPass&, h5::File& out) const override {
      const Job job = job_of(ctx_);
      tn::write_result_layout(out, job.bitstrings, job.circuit.qubits, job.open,
                              Params::from_json(ctx_.params).source.pauli.value_or(""),
                              plan.summary.at("precision").get<std::string>());
    }
  };
};

StepPass StateVectorStage::Run::output(StagePlan& plan) {
  const Job job = job_of(ctx_);
  const std::uint64_t n = std::uint64_t{1} << job.circuit.qubits, e = h5::dtype_size(job.dtype);
  const std::uint64_t rows = job.pauli ? 1 : job.bitstrings.size(), per_row = job.per_row();
  engine::OutputDecl out;
  out.name = job.pauli ? "value" : "amplitudes";
  out.layout.dtype = job.dtype;
  out.layout.shape = per_row == 1 ? h5::Shape{rows} : h5::Shape{rows, per_row};
  out.layout.chunk = out.layout.shape;
  out.layout.chunk[0] = std::min<std::uint64_t>(rows, default_chunk_rows(per_row * e));
  plan.pass.rows = rows;
  plan.pass.progress_unit = job.pauli ? "values" : "amplitudes";
  plan.pass.tile_rows = out.layout.chunk[0];
  plan.pass.outputs = {out};
  plan.pass.resident_device_bytes = n * e * (job.pauli ? 2 : 1) + rows * per_row * 8 + (n / (1 << 16) + 1) * 16;
  plan.pass.prepare_host_bytes = job.pauli ? 0 : rows * per_row * 8;  // the amplitudes' basis indices
  plan.primary_output = out.name;
  plan.summary = {{"qubits", job.circuit.qubits},
                  {"gates", job.circuit.gates.size()},
                  {"precision", h5::dtype_name(job.dtype)},
                  {"state_bytes", n * e},
                  {"bitstrings", job.bitstrings.size()}};
  return planned_pass(plan, std::make_unique<StateVectorKernel>(job, ctx_));
}

}  // namespace

const Stage& tn_statevector() {
  static const StateVectorStage stage;
  return stage;
}

}  // namespace qstage::stages
