#include "runner/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.hpp"
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
    return {*dtype, d.shape(), d.chunk(), d.filter_ids()};
  } catch (const h5::Error& e) {
    throw InputError(fmt::format("cannot read file '{}' dataset '{}': {}", file.string(), dataset, e.reason()));
  }
}

void apply_compress_output(stages::StagePlan& plan, const spec::Step& step, bool at_run_time) {
  if (step.compress_output.is_null()) return;
  auto& outputs = plan.pass.outputs;
  // Computed stages and sized passes without outputs have none; others may add them at run time.
  const bool final = at_run_time || step.impl->computes() || plan.pass.rows > 0 || !outputs.empty();
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
    if (!h5::codec_element_type(it->dtype))
      throw InputError(fmt::format("compress_output: output '{}' has dtype {}; expected float32 or complex64 (the "
                                   "codec's types){}", name, h5::dtype_name(it->dtype),
                                   step.compress_output.contains("datasets") ? "" : "; name the others in datasets"));
    it->codec = settings;
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
      r.info = {o.dtype, o.shape, o.chunk, o.compressed() ? std::vector<unsigned>{h5z::kFilterId} : std::vector<unsigned>{}};
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
