// tn.build: a circuit (qsim, OpenQASM 2.0, or a seeded generator) or a generic network (cotengra's
// JSON layout, or an einsum expression) into a tensor network in HDF5.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "io/npy.hpp"
#include "stages/tn/network.hpp"
#include "stages/tn/problems.hpp"
#include "stages/tn/simplify.hpp"
#include "stages/tn/sources.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;

// Tensor data from datasets /t0, /t1, ... of an HDF5 file (float or complex).
void read_h5_tensors(tn::Network& net, const std::filesystem::path& data) {
  h5::File f = h5::File::open(data, h5::Mode::read_only);
  for (size_t t = 0; t < net.tensors.size(); ++t) {
    const std::string name = fmt::format("/t{}", t);
    if (!f.exists(name))
      throw InputError(fmt::format("params.tensors: '{}' has no dataset '{}'; expected /t0 .. /t{}", data.string(),
                                   name, net.tensors.size() - 1));
    h5::Dataset d = f.open_dataset(name);
    std::uint64_t elements = 1;
    for (auto s : d.shape()) elements *= s;
    if (elements != net.tensors[t].data.size() || (d.dtype() != h5::DType::complex128 && d.dtype() != h5::DType::complex64 &&
                                                    d.dtype() != h5::DType::float64 && d.dtype() != h5::DType::float32))
      throw InputError(fmt::format("params.tensors: '{}' dataset '{}' has {} {} values; expected {} values (float or "
                                   "complex)", data.string(), name, elements, d.type_description(),
                                   net.tensors[t].data.size()));
    const auto dtype = *d.dtype();
    std::vector<char> raw(elements * h5::dtype_size(dtype));
    d.read_all(raw.data());
    for (std::uint64_t e = 0; e < elements; ++e) net.tensors[t].data[e] = h5::element_as_complex(raw.data(), dtype, e);
  }
}

// Tensor data from t0.npy, t1.npy, ... in a directory (what numpy.save writes).
void read_npy_tensors(tn::Network& net, const std::filesystem::path& dir) {
  for (size_t t = 0; t < net.tensors.size(); ++t) {
    const auto file = dir / fmt::format("t{}.npy", t);
    if (!std::filesystem::exists(file))
      throw InputError(fmt::format("params.tensors: '{}' has no t{}.npy; expected t0.npy .. t{}.npy", dir.string(), t,
                                   net.tensors.size() - 1));
    npy::Array a = npy::read(file);
    if (a.values.size() != net.tensors[t].data.size())
      throw InputError(fmt::format("params.tensors: '{}' has {} values; expected {} (tensor {} of the network)",
                                   file.string(), a.values.size(), net.tensors[t].data.size(), t));
    net.tensors[t].data = std::move(a.values);
  }
}

struct Einsum {
  std::string expression;
  std::map<std::string, std::int64_t> sizes;
  std::uint64_t seed;  // of the random tensors
};

struct Params {
  tn::SourceParams source;      // a circuit and what to compute of it, or:
  bool network;                 // a JSON network (Files "/network"), tensors from Files "/tensors" or random
  std::optional<Einsum> einsum;
  std::uint64_t seed;           // of a JSON network's random tensors
  std::optional<tn::IndependentSetOptions> independent_sets;  // seed 000's Fig. 1 (c)
  std::optional<tn::SpinGlassOptions> spin_glass;
  std::optional<tn::SurfaceCodeOptions> surface_code;         // seed 000's Fig. 1 (b)
  std::optional<tn::Syndrome> detector_error_model;           // its model from Files "/detector_error_model/file"
  tn::DecodingForm decoding_form = tn::DecodingForm::checks;  // of surface_code and detector_error_model
  tn::SimplifyOptions simplify;                               // none unless asked (stages/tn/simplify.hpp)
  int sources() const {
    return source.has_circuit() + network + einsum.has_value() + independent_sets.has_value() + spin_glass.has_value() +
           surface_code.has_value() + detector_error_model.has_value();
  }
  static tn::Syndrome syndrome_of(const json& k) {
    tn::Syndrome s;
    if (k.contains("syndrome")) s.given = k["syndrome"].get<std::string>();
    s.seed = k.value("seed", s.seed);
    return s;
  }
  static bool tropical(const json& problem) { return problem.value("semiring", std::string("standard")) == "tropical"; }
  static Params from_json(const json& p) {
    Params r{tn::SourceParams::from_json(p), p.contains("network"), std::nullopt, p.value("seed", std::uint64_t{0}), {}, {}, {}, {}};
    if (p.contains("einsum")) {
      const json& e = p["einsum"];
      r.einsum = Einsum{e.at("expression").get<std::string>(), e.at("sizes").get<std::map<std::string, std::int64_t>>(),
                        e.value("seed", std::uint64_t{0})};
    }
    if (p.contains("independent_sets")) {
      const json& k = p["independent_sets"];
      tn::IndependentSetOptions o;
      o.rows = k.value("rows", o.rows), o.cols = k.value("cols", o.cols), o.fill = k.value("fill", o.fill);
      o.seed = k.value("seed", o.seed), o.fugacity = k.value("fugacity", o.fugacity);
      o.tropical = tropical(k);
      r.independent_sets = o;
    }
    if (p.contains("spin_glass")) {
      const json& k = p["spin_glass"];
      tn::SpinGlassOptions o;
      o.rows = k.value("rows", o.rows), o.cols = k.value("cols", o.cols), o.couplings = k.value("couplings", o.couplings);
      o.seed = k.value("seed", o.seed), o.beta = k.value("beta", o.beta);
      o.tropical = tropical(k);
      r.spin_glass = o;
    }
    if (p.contains("surface_code")) {
      const json& k = p["surface_code"];
      tn::SurfaceCodeOptions o;
      o.distance = k.value("distance", o.distance), o.rounds = k.value("rounds", o.rounds), o.p = k.value("p", o.p);
      if (k.contains("q")) o.q = k["q"].get<double>();
      o.syndrome = syndrome_of(k);
      r.surface_code = o;
    }
    if (p.contains("detector_error_model")) r.detector_error_model = syndrome_of(p["detector_error_model"]);
    for (const char* key : {"surface_code", "detector_error_model"})
      if (p.contains(key) && p[key].contains("form"))
        r.decoding_form = tn::decoding_form(p[key]["form"].get<std::string>(), fmt::format("params.{}", key));
    r.simplify = tn::SimplifyOptions::from_json(p.value("simplify", json(false)), "params.simplify");
    return r;
  }
};

tn::Network generic_network(const Params& p, const tn::Files& files) {
  tn::Network net;
  if (p.einsum) {
    net = tn::network_from_einsum(p.einsum->expression, p.einsum->sizes, "params.einsum");
    tn::fill_random(net, p.einsum->seed);
  } else {
    const auto path = files.at("/network");
    json j;
    try {
      j = json::parse(fsutil::read_file(path));
    } catch (const json::exception& e) {
      throw InputError(fmt::format("params.network: '{}' is not valid JSON: {}", path.string(), e.what()));
    }
    net = tn::network_from_json(j, path.string());
    if (files.count("/tensors")) {
      const auto data = files.at("/tensors");
      if (std::filesystem::is_directory(data)) read_npy_tensors(net, data);
      else read_h5_tensors(net, data);
    } else {
      tn::fill_random(net, p.seed);
    }
  }
  return net;
}

class BuildStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tn.build", 1,
        "a tensor network from a circuit (qsim, OpenQASM 2.0, random, QAOA or lattice dynamics), a generic network (JSON, "
        "einsum), or a problem of seed 000's Fig. 1 (independent sets on a King's subgraph, spin glasses, surface-code or "
        "detector-error-model decoding; the first two also tropical: maximum independent sets, ground states)",
        {},
        "- id: net\n  stage: tn.build\n  params:\n    random: {rows: 4, cols: 5, cycles: 12, seed: 1}\n"
        "    random_bitstrings: {count: 4, seed: 2}\n"};
    return info;
  }
  std::vector<std::string> file_parameters() const override {
    auto f = tn::source_file_parameters();
    f.push_back("/network");
    f.push_back("/tensors");
    f.push_back("/detector_error_model/file");
    return f;
  }
  StagePlan plan(const json& params, const std::map<std::string, DatasetInfo>&) const override {
    const int sources = Params::from_json(params).sources();
    if (sources != 1)
      throw InputError(fmt::format("{} sources given; expected exactly one of circuit, random, qaoa, lattice, network, einsum, "
                                   "independent_sets, spin_glass, surface_code or detector_error_model", sources));
    return computed_plan({{"network", {{h5::DType::uint8, {}, {}}}}, {"bitstrings", {{h5::DType::uint8, {}, {}}}}});
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public ComputedRun {
   public:
    using ComputedRun::ComputedRun;
    void compute() override;
    std::string save() const override { return extra_.dump() + '\n' + tn::serialize_network(net_); }
    void load(std::string_view state) override {
      const auto newline = state.find('\n');
      extra_ = json::parse(state.substr(0, newline));
      net_ = tn::deserialize_network(std::string(state.substr(newline + 1)));
    }
    void write(const StagePlan&, const StepPass&, h5::File& out) const override;
    std::string describe(const StagePlan&, const StepPass&) const override {
      std::string simplified;
      if (extra_.contains("simplification")) {
        const json& s = extra_["simplification"];
        simplified = fmt::format(" (simplified from {} tensors and {} modes: {} modes fused, {} fixed, {} tensors absorbed, "
                                 "{} split; {} hyperindices)", s["tensors_before"].get<std::size_t>(),
                                 s["modes_before"].get<std::size_t>(), s["fused"].get<int>(), s["fixed"].get<int>(),
                                 s["absorbed"].get<int>(), s["split"].get<int>(), s["hyperindices"].get<std::size_t>());
      }
      return fmt::format("{} network: {} tensors, {} modes, {} open{}", net_.kind, net_.tensors.size(), net_.extent.size(),
                         net_.output.size(), simplified);
    }

   private:
    tn::Network net_;
    json extra_ = json::object();
  };
};

void BuildStage::Run::compute() {
  const StepContext& ctx = ctx_;
  const Params p = Params::from_json(ctx.params);
  tn::Network& net = net_;
  json& extra = extra_;
  if (p.source.has_circuit()) {
    const tn::Circuit c = tn::circuit_from_params(p.source, ctx.files);
    extra["circuit"] = {{"source", c.source}, {"qubits", c.qubits}, {"gates", c.gates.size()}};
    if (!c.graph.empty()) extra["circuit"]["graph_edges"] = c.graph;
    if (auto pauli = tn::pauli_from_params(p.source, c.qubits)) {
      net = tn::expectation_network(c, *pauli);
    } else {
      net = tn::amplitude_network(c, tn::open_qubits_from_params(p.source, c.qubits));
      extra["bitstrings"] = tn::bitstrings_from_params(p.source, ctx.files, c.qubits);
    }
  } else if (p.independent_sets || p.spin_glass || p.surface_code || p.detector_error_model) {
    auto from_model = [&] {
      const auto& file = ctx.files.at("/detector_error_model/file");
      return tn::detector_error_model_decoding(
          {fsutil::read_file(file), file.filename().string(), *p.detector_error_model, p.decoding_form});
    };
    auto surface_code = [&] {
      tn::SurfaceCodeOptions o = *p.surface_code;
      o.form = p.decoding_form;
      return tn::surface_code_decoding(o);
    };
    tn::Problem problem = p.independent_sets ? tn::king_independent_sets(*p.independent_sets)
                          : p.spin_glass     ? tn::square_spin_glass(*p.spin_glass)
                          : p.surface_code   ? surface_code()
                                             : from_model();
    net = std::move(problem.network);
    extra["problem"] = std::move(problem.about);
    if (p.decoding_form == tn::DecodingForm::fourier) {
      const char* caution =
          "the fourier form's value is a sum of signed terms: its relative precision falls as P(syndrome) does "
          "(measured in complex128 at distance 3: 2e-12 to 3e-10); contract the checks form to confirm a close call";
      extra["problem"]["precision"] = caution;
      spdlog::warn("tn.build: {}", caution);
    }
  } else {
    net = generic_network(p, ctx.files);
  }
  net.validate("the built network");
  if (p.simplify.any()) extra["simplification"] = tn::simplify(net, p.simplify).to_json();
}

void BuildStage::Run::write(const StagePlan&, const StepPass&, h5::File& out) const {
  const tn::Network& net = net_;
  const json& extra = extra_;
  tn::save_network(net, out);
  tn::keep_network(ctx_.step_key, net);
  if (extra.contains("bitstrings"))
    tn::write_bitstrings(out, extra["bitstrings"].get<std::vector<std::vector<std::uint8_t>>>(), net.qubits);
  out.set_attribute("network_kind", net.kind);
  out.set_attribute("network_description", net.description);
  out.set_attribute("tensors", static_cast<std::int64_t>(net.tensors.size()));
  if (extra.contains("circuit")) out.set_attribute("circuit", extra["circuit"].dump());
  if (extra.contains("problem")) out.set_attribute("problem", extra["problem"].dump());
  if (extra.contains("simplification")) out.set_attribute("simplification", extra["simplification"].dump());
}

}  // namespace

const Stage& tn_build() {
  static const BuildStage stage;
  return stage;
}

}  // namespace qstage::stages
