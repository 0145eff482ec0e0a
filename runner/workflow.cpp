#include "runner/workflow.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/units.hpp"
#include "io/compressed_chunks.hpp"
#include "spec/schema.hpp"
#include "stages/common/stage.hpp"
#include "stages/registry.hpp"

namespace qstage::spec {

namespace fs = std::filesystem;
using nlohmann::json;

std::string InputRef::describe() const {
  if (!step.empty())
    return dataset.empty() ? fmt::format("step '{}'", step) : fmt::format("step '{}' dataset '{}'", step, dataset);
  return fmt::format("file '{}' dataset '{}'", file.string(), dataset);
}

const Step* Workflow::find(std::string_view id) const {
  for (const auto& s : steps)
    if (s.id == id) return &s;
  return nullptr;
}

namespace {

[[noreturn]] void fail(const Document& doc, const std::string& pointer, const std::string& message) {
  throw InputError(fmt::format("{}: {}: {}", doc.where(pointer), pointer_to_path(pointer), message));
}

std::vector<std::string> step_ids(const std::vector<Step>& steps) {
  std::vector<std::string> ids;
  for (const auto& s : steps) ids.push_back(s.id);
  return ids;
}

InputRef parse_input(const Workflow& wf, const json& v, const std::string& pointer) {
  InputRef ref;
  ref.pointer = pointer;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const auto colon = s.find(':');
    ref.step = s.substr(0, colon);
    if (colon != std::string::npos) ref.dataset = s.substr(colon + 1);
  } else if (v.contains("step")) {
    ref.step = v["step"].get<std::string>();
    ref.dataset = v.value("dataset", "");
  } else {
    fs::path file = v["file"].get<std::string>();
    ref.file = file.is_absolute() ? file : fs::absolute(wf.base_dir / file).lexically_normal();
    ref.dataset = v["dataset"].get<std::string>();
  }
  if (!ref.step.empty() && !wf.find(ref.step)) {
    std::vector<std::string> earlier = step_ids(wf.steps);
    std::string hint = closest(ref.step, earlier);
    fail(wf.doc, pointer,
         fmt::format("step '{}' is not defined before this step{}; expected one of: {}", ref.step,
                     hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                     earlier.empty() ? "(no earlier steps)" : fmt::format("{}", fmt::join(earlier, ", "))));
  }
  return ref;
}

Step parse_step(Workflow& wf, const json& v, size_t index) {
  Step step;
  step.index = index;
  const std::string ptr = step.pointer();
  step.id = v["id"].get<std::string>();
  step.stage = v["stage"].get<std::string>();
  step.description = v.value("description", "");
  if (wf.find(step.id)) fail(wf.doc, ptr + "/id", fmt::format("step id '{}' is used twice; expected unique ids", step.id));
  step.impl = stages::find_stage(step.stage);
  if (!step.impl) {
    std::vector<std::string> names;
    for (const auto* s : stages::all_stages()) names.push_back(s->info().name);
    std::string hint = closest(step.stage, names);
    fail(wf.doc, ptr + "/stage",
         fmt::format("unknown stage '{}'{}; expected one of: {} (see `qstage stages`)", step.stage,
                     hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint), fmt::join(names, ", ")));
  }
  const json& schema = stages::parameter_schema(*step.impl);
  const json params = v.value("params", json::object());
  require_valid(schema, wf.doc, params, ptr + "/params");
  step.params = with_defaults(schema, params);
  for (const auto& pointer : step.impl->file_parameters()) {
    const json::json_pointer ptr(pointer);
    if (!step.params.contains(ptr) || !step.params[ptr].is_string()) continue;
    fs::path file = step.params[ptr].get<std::string>();
    if (!file.is_absolute()) file = fs::absolute(wf.base_dir / file).lexically_normal();
    std::error_code ec;
    if (!fs::is_regular_file(file, ec) && !fs::is_directory(file, ec))  // (folders: e.g. of .npy files)
      fail(wf.doc, step.pointer() + "/params" + pointer,
           fmt::format("file '{}' does not exist; expected a readable file", file.string()));
    step.files[pointer] = file;
  }

  if (v.contains("compress_output")) {
    static const json schema = json::parse(embedded::file("schemas/spec.schema.json"))["properties"]["steps"]["items"]
                                                                                  ["properties"]["compress_output"];
    step.compress_output = with_defaults(schema, v["compress_output"]);
    try {
      h5::codec_settings(step.compress_output, "codec");
    } catch (const InputError& e) {
      fail(wf.doc, ptr + "/compress_output", e.what());
    }
  }

  const json inputs = v.value("inputs", json::object());
  std::vector<std::string> slots;
  for (const auto& slot : step.impl->info().inputs) slots.push_back(slot.name);
  for (auto it = inputs.begin(); it != inputs.end(); ++it) {
    if (std::find(slots.begin(), slots.end(), it.key()) == slots.end())
      fail(wf.doc, ptr + "/inputs/" + it.key(),
           fmt::format("stage {} has no input '{}'; expected {}", step.stage, it.key(),
                       slots.empty() ? "no inputs" : fmt::format("{}", fmt::join(slots, ", "))));
    step.inputs[it.key()] = parse_input(wf, it.value(), ptr + "/inputs/" + it.key());
  }
  for (const auto& slot : step.impl->info().inputs)
    if (!slot.optional && !step.inputs.count(slot.name))
      fail(wf.doc, ptr + "/inputs", fmt::format("missing input '{}' of stage {}; expected inputs: {}", slot.name, step.stage,
                                                fmt::join(slots, ", ")));
  return step;
}

}  // namespace

Workflow load_workflow(std::string text, std::string source, fs::path base_dir) {
  Workflow wf;
  wf.text = std::move(text);
  wf.source = source;
  wf.base_dir = fs::absolute(base_dir);
  wf.doc = parse_yaml(wf.text, std::move(source));
  static const json schema = json::parse(embedded::file("schemas/spec.schema.json"));
  if (!wf.doc.value.is_object())
    throw InputError(fmt::format("{}: expected a mapping with 'name' and 'steps' (see `qstage run --help`)", wf.doc.source));
  require_valid(schema, wf.doc, wf.doc.value, "");
  const json& v = wf.doc.value;
  wf.name = v["name"].get<std::string>();
  wf.description = v.value("description", "");
  if (v.contains("options")) {
    const json& o = v["options"];
    auto text_of = [](const json& x) { return x.is_string() ? x.get<std::string>() : x.dump(); };
    if (o.contains("checkpoint_interval")) wf.options.checkpoint_interval = text_of(o["checkpoint_interval"]);
    // Budgets are checked now, so that `qstage validate` and a run refuse a bad one before any work.
    auto budget = [&](const char* key) -> std::optional<std::string> {
      if (!o.contains(key)) return std::nullopt;
      const std::string text = text_of(o[key]), pointer = std::string("/options/") + key;
      parse_budget(text, fmt::format("{}: {}", wf.doc.where(pointer), pointer_to_path(pointer)));
      return text;
    };
    wf.options.device_memory = budget("device_memory");
    wf.options.host_memory = budget("host_memory");
    if (o.contains("max_batch_rows")) wf.options.max_batch_rows = o["max_batch_rows"].get<std::uint64_t>();
  }
  for (size_t i = 0; i < v["steps"].size(); ++i) wf.steps.push_back(parse_step(wf, v["steps"][i], i));
  return wf;
}

Workflow load_workflow_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw InputError(fmt::format("spec file '{}' does not exist or is not a file; expected a YAML workflow spec",
                                 path.string()));
  return load_workflow(fsutil::read_file(path), path.string(), fs::absolute(path).parent_path());
}

Workflow quickstart_workflow() {
  return load_workflow(std::string(embedded::file("workflows/quickstart.yaml")), "<embedded quickstart>",
                       fs::current_path());
}

}  // namespace qstage::spec
