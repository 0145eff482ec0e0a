#include "runner/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
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
      r.info = {o.dtype, o.shape, o.chunk};
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
