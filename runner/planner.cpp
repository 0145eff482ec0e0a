#include "runner/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "core/error.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "io/filter/h5z_qstage.hpp"
#include "io/h5.hpp"

namespace qstage::runner {

namespace fs = std::filesystem;

stages::DatasetInfo describe_file_dataset(const fs::path& file, const std::string& dataset) {
  std::error_code ec;
  if (!fs::exists(file, ec)) throw InputError(fmt::format("file '{}' does not exist; expected an HDF5 file", file.string()));
  if (!h5::File::is_hdf5(file))
    throw InputError(fmt::format("file '{}' is not an HDF5 file (or is unreadable); expected an HDF5 file", file.string()));
  try {
    h5::File f = h5::File::open(file, h5::Mode::read_only);
    if (!f.exists(dataset)) {
      auto names = f.dataset_paths();
      throw InputError(fmt::format("file '{}' has no dataset '{}'; datasets in it: {}", file.string(), dataset,
                                   names.empty() ? "(none)" : fmt::format("{}", fmt::join(names, ", "))));
    }
    h5::Dataset d = f.open_dataset(dataset);
    auto dtype = d.dtype();
    if (!dtype)
      throw InputError(fmt::format("file '{}' dataset '{}' has element type {}; expected a number type "
                                   "(float32, float64, complex64, complex128, int32, int64, uint8, uint64)",
                                   file.string(), dataset, d.type_description()));
    return {{*dtype, d.shape(), d.chunk()}, d.filter_ids()};
  } catch (const h5::Error& e) {
    throw InputError(fmt::format("cannot read file '{}' dataset '{}': {}", file.string(), dataset, e.reason()));
  }
}

namespace {

// Bytes of a dataset of `layout`, or nullopt past 2^63 (where byte offsets stop fitting int64 and
// HDF5's sizes overflow).
std::optional<std::uint64_t> dataset_bytes(const Layout& layout) {
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 63;
  std::uint64_t bytes = h5::dtype_size(layout.dtype);
  for (std::uint64_t d : layout.shape) {
    if (d != 0 && bytes > kLimit / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

}  // namespace

void check_output_sizes(const stages::StagePlan& plan) {
  auto check = [](const std::string& name, const Layout& layout) {
    if (!dataset_bytes(layout))
      throw InputError(fmt::format("output '{}' of shape {} ({}) would hold more than 2^63 bytes; expected a shape "
                                   "whose size in bytes fits in 63 bits",
                                   name, shape_text(layout.shape), h5::dtype_name(layout.dtype)));
  };
  for (const auto& o : plan.pass.outputs) check(o.name, o.layout);
  for (const auto& [name, info] : plan.results) check(name, info.layout);
}

void check_outputs_fit(const std::vector<PlannedStep>& planned, const fs::path& run_dir) {
  fs::path existing = fs::absolute(run_dir);
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  const fs::space_info space = fs::space(existing, ec);
  if (ec || space.capacity == 0 || space.capacity == static_cast<std::uintmax_t>(-1)) return;  // unknown: no check
  for (const auto& p : planned) {
    auto check = [&](const std::string& name, const Layout& layout) {
      const auto bytes = dataset_bytes(layout);
      if (bytes && *bytes > space.capacity)
        throw InputError(fmt::format("step '{}' ({}): output '{}' of shape {} ({}) needs {}, more than the whole file "
                                     "system of the run directory ({}, {}); expected a shape that fits",
                                     p.step->id, p.step->stage, name, shape_text(layout.shape), h5::dtype_name(layout.dtype),
                                     format_bytes(static_cast<double>(*bytes)), existing.string(),
                                     format_bytes(static_cast<double>(space.capacity))));
    };
    for (const auto& o : p.plan.pass.outputs)
      if (!o.compressed()) check(o.name, o.layout);  // (coded outputs may be far smaller)
    for (const auto& [name, info] : p.plan.results) check(name, info.layout);
  }
}

void apply_compress_output(stages::StagePlan& plan, const spec::Step& step, bool at_run_time) {
  if (step.compress_output.is_null()) return;
  auto& outputs = plan.pass.outputs;
  // Computed stages and sized passes without outputs have none; others may add them at run time.
  const bool final = at_run_time || plan.computed || plan.pass.rows > 0 || !outputs.empty();
  if (!final) return;
  std::vector<std::string> names;
  for (const auto& o : outputs) names.push_back(o.name);
  if (outputs.empty())
    throw InputError(fmt::format("compress_output: stage {} writes no streamed dataset to compress (its results are "
                                 "written whole); expected a step with streamed outputs, or a compress step after this one",
                                 step.stage));
  std::vector<std::string> chosen = names;
  if (step.compress_output.contains("datasets")) chosen = step.compress_output["datasets"].get<std::vector<std::string>>();
  const codec::Settings settings = h5::codec_settings(step.compress_output, "compress_output");
  for (const auto& name : chosen) {
    auto it = std::find_if(outputs.begin(), outputs.end(), [&](const auto& o) { return o.name == name; });
    if (it == outputs.end())
      throw InputError(fmt::format("compress_output: datasets names '{}', which is not a streamed output of stage {}; "
                                   "expected one of {}", name, step.stage, fmt::join(names, ", ")));
    if (it->kind == engine::OutputKind::appended)  // (coded_chunks: applied at planning, again at run time)
      throw InputError(fmt::format("compress_output: output '{}' of stage {} is not one row per pass row (its length "
                                   "is known only at the end); expected a dataset of fixed shape", name, step.stage));
    if (!h5::codec_element_type(it->layout.dtype))
      throw InputError(fmt::format("compress_output: output '{}' has dtype {}; expected float32 or complex64 (the "
                                   "codec's types){}", name, h5::dtype_name(it->layout.dtype),
                                   step.compress_output.contains("datasets") ? "" : "; name the others in datasets"));
    it->codec = settings;
    it->kind = engine::OutputKind::coded_chunks;
  }
}

namespace {

std::string step_label(const spec::Workflow& wf, const spec::Step& s) {
  return fmt::format("{}: {} (id '{}', stage {})", wf.doc.where(s.pointer()), spec::pointer_to_path(s.pointer()),
                     s.id, s.stage);
}

ResolvedInput resolve(const spec::Workflow& wf, const spec::InputRef& ref, const std::vector<PlannedStep>& done) {
  ResolvedInput r;
  r.ref = ref;
  if (ref.step.empty()) {
    r.dataset = ref.dataset;
    try {
      r.info = describe_file_dataset(ref.file, ref.dataset);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}: {}", wf.doc.where(ref.pointer), spec::pointer_to_path(ref.pointer), e.what()));
    }
    return r;
  }
  const PlannedStep* producer = nullptr;
  for (const auto& p : done)
    if (p.step->id == ref.step) producer = &p;
  r.dataset = ref.dataset.empty() ? producer->plan.primary_output : ref.dataset;
  std::vector<std::string> names;
  for (const auto& o : producer->plan.pass.outputs) {
    names.push_back(o.name);
    if (o.name == r.dataset) {
      r.info = {o.layout, o.compressed() ? std::vector<unsigned>{h5z::kFilterId} : std::vector<unsigned>{}};
      return r;
    }
  }
  for (const auto& [name, info] : producer->plan.results) {
    names.push_back(name);
    if (name == r.dataset) {
      r.info = info;
      return r;
    }
  }
  throw InputError(fmt::format("{}: {}: step '{}' ({}) has no output dataset '{}'; expected {}", wf.doc.where(ref.pointer),
                               spec::pointer_to_path(ref.pointer), ref.step, producer->step->stage,
                               r.dataset.empty() ? "(primary)" : r.dataset,
                               names.empty() ? "none: it writes no streamed dataset" : fmt::format("one of {}", fmt::join(names, ", "))));
}

}  // namespace

std::vector<PlannedStep> plan_workflow(const spec::Workflow& wf) {
  std::vector<PlannedStep> planned;
  for (const auto& step : wf.steps) {
    PlannedStep p;
    p.step = &step;
    std::map<std::string, stages::DatasetInfo> infos;
    for (const auto& [slot, ref] : step.inputs) {
      p.inputs[slot] = resolve(wf, ref, planned);
      infos[slot] = p.inputs[slot].info;
    }
    try {
      p.plan = step.impl->plan(step.params, infos);
      check_output_sizes(p.plan);
      apply_compress_output(p.plan, step, false);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", step_label(wf, step), e.what()));
    }
    if (p.plan.streamed_inputs.size() != p.plan.pass.inputs.size())
      throw std::logic_error("stage " + step.stage + ": streamed_inputs and pass.inputs differ in length");
    planned.push_back(std::move(p));
  }
  return planned;
}

}  // namespace qstage::runner
