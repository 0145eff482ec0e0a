// qstage status / inspect / validate / stages: commands that read, never write.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>

#include "cli/options.hpp"
#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "core/mpi.hpp"
#include "core/units.hpp"
#include "engine/stream_engine.hpp"
#include "io/h5.hpp"
#include "io/h5_describe.hpp"
#include "io/row_io.hpp"
#include "runner/manifest.hpp"
#include "runner/planner.hpp"
#include "runner/workflow.hpp"
#include "stages/common/stage.hpp"
#include "stages/common/views.hpp"
#include "stages/registry.hpp"

namespace qstage::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shape_text(const json& shape) {
  std::vector<std::string> parts;
  for (const auto& d : shape) parts.push_back(d.is_null() ? "unlimited" : d.dump());
  return "[" + fmt::format("{}", fmt::join(parts, ", ")) + "]";
}

std::string value_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// ---------------------------------------------------------------------------------- status
json step_status(const runner::RunDir& dir, const std::string& id, const json& rec) {
  json s = {{"step", id}, {"stage", rec.value("stage", "?")}, {"state", rec.value("state", "pending")}};
  const auto metrics = rec.value("metrics", json::object());
  std::uint64_t total = rec.value("rows_total", std::uint64_t{0});
  double fraction = s["state"] == "done" ? 1.0 : 0.0;
  std::string detail;
  if (s["state"] == "done") {
    // (what `qstage run` checks before it skips the step: a damaged output is recomputed)
    if (const std::string problem = runner::output_problem(dir.output(id), rec); !problem.empty()) {
      s["state"] = "damaged";
      s["problem"] = "its output " + problem;
      fraction = 0;
      detail = "output " + problem;
    }
  } else {
    // Committed progress from the journal, live progress from the last progress report.
    const fs::path journal = dir.work(id) / "journal.json";
    const fs::path progress = dir.work(id) / "progress.json";
    try {
      if (fs::exists(journal)) {
        json j = json::parse(fsutil::read_file(journal));
        total = j.value("rows", total);
        s["committed_rows"] = j.value("committed_rows", 0);
        if (total) fraction = static_cast<double>(s["committed_rows"].get<std::uint64_t>()) / static_cast<double>(total);
        detail = fmt::format("{} committed", s["committed_rows"].get<std::uint64_t>());
      }
      if (fs::exists(progress) && s["state"] == "running") {
        json p = json::parse(fsutil::read_file(progress));
        total = p.value("rows_total", total);
        const auto done = p.value("rows_done", std::uint64_t{0});
        if (total) fraction = static_cast<double>(done) / static_cast<double>(total);
        s["rows_done"] = done;
        s["bytes_per_second"] = p.value("bytes_per_second", 0.0);
        s["progress_updated"] = p.value("updated", 0);
      }
    } catch (const std::exception&) {
      detail = "progress unreadable";
    }
  }
  s["rows_total"] = total;
  s["fraction"] = fraction;
  s["detail"] = detail;
  if (metrics.contains("bytes_per_second")) s["bytes_per_second"] = metrics["bytes_per_second"];
  if (metrics.contains("gflops_per_second")) s["gflops_per_second"] = metrics["gflops_per_second"];
  if (rec.contains("wall_seconds")) s["wall_seconds"] = rec["wall_seconds"];
  if (rec.contains("attempts")) s["attempts"] = rec["attempts"];
  if (rec.contains("results")) s["results"] = rec["results"];
  return s;
}

}  // namespace

int status(const Args& args) {
  po::options_description o("options");
  o.add_options()("dir", po::value<std::string>(), "the run directory (positional)")("json", "print JSON")(
      "exit-code", "exit 0 if every step is done, 75 if the run can be resumed, 1 if a step failed");
  po::positional_options_description pos;
  pos.add("dir", 1);
  auto vm = parse(args, o, pos,
                  "usage: qstage status DIR [--json] [--exit-code]\n\nShows each step's state, progress and "
                  "throughput.\n",
                  "examples:\n  qstage status runs/qs\n  watch -n 10 qstage status runs/big\n"
                  "  qstage status runs/big --exit-code || scontrol requeue $SLURM_JOB_ID   # in a job script\n");
  if (!vm) return kExitDone;
  if (!vm->count("dir")) throw InputError("status: missing the run directory; expected `qstage status DIR`");
  runner::RunDir dir{(*vm)["dir"].as<std::string>()};
  auto manifest = runner::Manifest::load(dir.root);
  if (!manifest)
    throw InputError(fmt::format("'{}' has no manifest.json; expected a run directory made by `qstage run`",
                                 dir.root.string()));
  // Steps in spec order (the spec copy), then any others the manifest knows.
  std::vector<std::string> order;
  try {
    auto wf = spec::load_workflow(fsutil::read_file(dir.spec()), dir.spec().string(), dir.root);
    for (const auto& s : wf.steps) order.push_back(s.id);
  } catch (const std::exception&) {
  }
  const json& steps = manifest->data()["steps"];
  for (auto it = steps.begin(); it != steps.end(); ++it)
    if (std::find(order.begin(), order.end(), it.key()) == order.end()) order.push_back(it.key());
  json rows = json::array();
  for (const auto& id : order) rows.push_back(step_status(dir, id, steps.contains(id) ? steps[id] : json::object()));
  json out = {{"run_dir", dir.root.string()}, {"workflow", manifest->workflow()},
              {"spec", manifest->data().value("spec_source", "")}, {"updated", manifest->data().value("updated", "")},
              {"steps", rows}};
  int code = kExitDone;
  for (const auto& r : rows) {
    if (r["state"] == "failed") code = kExitInternal;
    else if (r["state"] != "done" && code == kExitDone) code = kExitStopped;
  }
  if (!vm->count("exit-code")) code = kExitDone;
  if (vm->count("json")) {
    std::cout << out.dump(2) << "\n";
    return code;
  }
  std::cout << fmt::format("run directory {}  workflow '{}'  spec {}  (updated {})\n", out["run_dir"].get<std::string>(),
                           out["workflow"].get<std::string>(), out["spec"].get<std::string>(),
                           out["updated"].get<std::string>());
  std::cout << fmt::format("{:<16} {:<16} {:<9} {:>7}  {:<22} {:>12} {:>10}\n", "step", "stage", "state", "done",
                           "rows", "throughput", "wall");
  for (const auto& r : rows) {
    const std::string rate = r.contains("bytes_per_second") ? format_rate(r["bytes_per_second"].get<double>()) : "";
    const std::string wall = r.contains("wall_seconds") ? format_duration(r["wall_seconds"].get<double>()) : "";
    std::string rows_text = r["rows_total"].get<std::uint64_t>() ? fmt::format("{}", r["rows_total"].get<std::uint64_t>()) : "";
    if (!r["detail"].get<std::string>().empty()) rows_text = r["detail"].get<std::string>() + " of " + rows_text;
    std::cout << fmt::format("{:<16} {:<16} {:<9} {:>6.1f}%  {:<22} {:>12} {:>10}\n", r["step"].get<std::string>(),
                             r["stage"].get<std::string>(), r["state"].get<std::string>(),
                             100 * r["fraction"].get<double>(), rows_text, rate, wall);
    if (r.contains("results") && !r["results"].get<std::string>().empty())
      std::cout << "    " << r["results"].get<std::string>() << "\n";
  }
  return code;
}

// ---------------------------------------------------------------------------------- inspect
namespace {

// `inspect --verify`: every dataset's checksum recomputed from its data.
int verify_file(const fs::path& path, bool as_json) {
  const h5::File f = h5::File::open(path, h5::Mode::read_only);
  json rows = json::array();
  int bad = 0;
  for (const auto& name : f.dataset_paths()) {
    json row = {{"dataset", name}};
    try {
      const auto check = h5::recompute_checksum(f.open_dataset(name));
      if (!check) {
        row["status"] = "no checksum";
      } else {
        row.update({{"attribute", check->attribute}, {"recorded", check->recorded}, {"computed", check->computed},
                    {"status", check->ok() ? "ok" : "MISMATCH"}});
        bad += check->ok() ? 0 : 1;
      }
    } catch (const std::exception& e) {
      row["status"] = fmt::format("unreadable ({})", e.what());
      ++bad;
    }
    rows.push_back(row);
  }
  if (as_json) {
    std::cout << json{{"file", path.string()}, {"datasets", rows}, {"ok", bad == 0}}.dump(2) << "\n";
  } else {
    std::cout << "file " << path.string() << "\n";
    for (const auto& r : rows) {
      std::cout << fmt::format("  {:<24} {}", r["dataset"].get<std::string>(), r["status"].get<std::string>());
      if (r.contains("attribute"))
        std::cout << fmt::format("  {} {}", r["attribute"].get<std::string>(),
                                 r["status"] == "ok" ? r["recorded"].get<std::string>()
                                                     : fmt::format("recorded {}, the data give {}",
                                                                   r["recorded"].get<std::string>(),
                                                                   r["computed"].get<std::string>()));
      std::cout << "\n";
    }
    std::cout << (bad ? fmt::format("{} of {} datasets do not match their checksums\n", bad, rows.size())
                      : std::string("every checksum matches the data\n"));
  }
  return bad ? kExitCheckFailed : kExitDone;
}

}  // namespace

int inspect(const Args& args) {
  // --plot: each stage family's views of its outputs (stages/common/views.hpp).
  std::vector<std::string> plot_stages, plot_draws;
  std::string plot_help;
  for (const auto& v : stages::all_views()) {
    plot_stages.push_back(v.stage);
    plot_draws.push_back(v.draws);
    plot_help += fmt::format(" For a {} output, --plot draws {}.", v.stage, v.help);
  }
  const std::string plot_option =
      fmt::format("{} outputs: draw {} into this PNG", fmt::join(plot_stages, ", "), fmt::join(plot_draws, "; "));
  po::options_description o("options");
  o.add_options()("file", po::value<std::string>(), "the HDF5 file (positional)")("json", "print JSON")(
      "plot", po::value<std::string>(), plot_option.c_str())(
      "verify", "recompute every dataset's checksum (qsum64, or stored_xxh64 of compressed chunks) from its data; "
                "exit 3 if one differs");
  po::positional_options_description pos;
  pos.add("file", 1);
  const std::string usage = "usage: qstage inspect FILE.h5 [--json] [--plot OUT.png] [--verify]\n\nLists a file's provenance "
                            "attributes and datasets (dtype, shape, chunk, checksum)." + plot_help + "\n";
  auto vm = parse(args, o, pos, usage.c_str(),
                  "examples:\n  qstage inspect qstage-runs/quickstart/outputs/amplitudes.h5\n"
                  "  qstage inspect out.h5 --json | python3 -m json.tool\n"
                  "  qstage inspect qstage-runs/quickstart/outputs/plan.h5 --plot plan.png\n"
                  "  qstage inspect qstage-runs/mps-xx/outputs/xx.h5 --plot xx.png   # densities, entropies vs time\n"
                  "  qstage inspect qstage-runs/sci-nnqs/outputs/nnqs.h5 --plot nnqs.png   # energy error vs iteration\n"
                  "  qstage inspect qstage-runs/quickstart/outputs/amplitudes.h5 --verify   # data against checksums\n");
  if (!vm) return kExitDone;
  if (!vm->count("file")) throw InputError("inspect: missing the file; expected `qstage inspect FILE.h5`");
  const fs::path path = (*vm)["file"].as<std::string>();
  if (!fs::exists(path)) throw InputError(fmt::format("file '{}' does not exist; expected an HDF5 file", path.string()));
  if (!h5::File::is_hdf5(path))
    throw InputError(fmt::format("file '{}' is not an HDF5 file; expected an HDF5 file", path.string()));
  json d;
  try {
    d = h5::describe_file(path);
  } catch (const h5::Error& e) {
    throw InputError(fmt::format("cannot read '{}': {}", path.string(), e.reason()));
  }
  if (vm->count("verify")) return verify_file(path, vm->count("json") > 0);
  if (vm->count("plot")) {
    const fs::path png = (*vm)["plot"].as<std::string>();
    const h5::File f = h5::File::open(path, h5::Mode::read_only);
    const stages::View* view = stages::find_view(f);
    if (!view)
      throw InputError(fmt::format("'{}' is not a {} output; --plot draws {}", path.string(),
                                   fmt::join(plot_stages, " or "), fmt::join(plot_draws, "; ")));
    view->plot(f, path, png);
    std::cout << "wrote " << png.string() << "\n";
    return kExitDone;
  }
  if (vm->count("json")) {
    std::cout << d.dump(2) << "\n";
    return kExitDone;
  }
  std::cout << "file " << path.string() << "\n";
  if (!d["attributes"].empty()) std::cout << "attributes:\n";
  for (auto it = d["attributes"].begin(); it != d["attributes"].end(); ++it) {
    std::string v = value_text(it.value());
    // JSON-valued provenance reads better expanded.
    if (!v.empty() && (v[0] == '{' || v[0] == '[')) try {
        v = json::parse(v).dump();
      } catch (...) {
      }
    std::cout << fmt::format("  {:<26} {}\n", it.key(), v);
  }
  std::cout << "datasets:\n";
  for (const auto& ds : d["datasets"]) {
    std::cout << fmt::format("  {:<12} {:<10} shape {}", ds["path"].get<std::string>(), ds["dtype"].get<std::string>(),
                             shape_text(ds["shape"]));
    if (!ds["chunk"].is_null()) std::cout << fmt::format("  chunk {}", shape_text(ds["chunk"]));
    std::cout << fmt::format("  maxshape {}  {}\n", shape_text(ds["maxshape"]), format_bytes(ds["bytes"].get<double>()));
    for (auto it = ds["attributes"].begin(); it != ds["attributes"].end(); ++it)
      std::cout << fmt::format("      {} = {}\n", it.key(), value_text(it.value()));
  }
  return kExitDone;
}

// ---------------------------------------------------------------------------------- validate
int validate(const Args& args) {
  po::options_description o("options");
  o.add_options()("spec", po::value<std::string>(), "the workflow spec (positional)")(
      "device", po::value<std::string>()->default_value("cpu"), "check budgets for this device: cpu | cuda | auto")(
      "device-memory", po::value<std::string>(), "device memory budget to check against")(
      "host-memory", po::value<std::string>(), "host memory budget to check against");
  po::positional_options_description pos;
  pos.add("spec", 1);
  auto vm = parse(args, o, pos,
                  "usage: qstage validate SPEC [options]\n\nChecks SPEC against the spec and stage schemas, resolves "
                  "every input (opening input files for their shapes), lets every stage check its parameters against "
                  "its inputs, and checks that one batch of each step fits the budgets. Writes nothing.\n",
                  "examples:\n  qstage validate workflows/quickstart.yaml\n"
                  "  qstage validate big.yaml --device cuda --device-memory 60GiB\n");
  if (!vm) return kExitDone;
  if (!vm->count("spec")) throw InputError("validate: missing the spec; expected `qstage validate SPEC`");
  const auto wf = spec::load_workflow_file((*vm)["spec"].as<std::string>());
  const auto planned = runner::plan_workflow(wf);
  BackendOptions bo;
  bo.device = (*vm)["device"].as<std::string>();
  // A budget on the command line overrides the spec's; an error names the one that was used.
  auto budget = [&](const std::string& option, const std::optional<std::string>& in_spec, const std::string& spec_key) {
    if (vm->count(option)) return parse_budget((*vm)[option].as<std::string>(), "--" + option);
    return in_spec ? parse_budget(*in_spec, "options." + spec_key) : std::uint64_t{0};  // 0: the backend's default
  };
  bo.device_memory = budget("device-memory", wf.options.device_memory, "device_memory");
  bo.host_memory = budget("host-memory", wf.options.host_memory, "host_memory");
  auto backend = make_backend(bo);
  mpi::Comm comm;  // MPI is not initialised here: a single rank
  engine::StreamEngine engine(*backend, comm, {});
  std::cout << fmt::format("{}: valid; workflow '{}', {} steps\n", wf.source, wf.name, wf.steps.size());
  for (const auto& p : planned) {
    engine::BatchPlan bp;
    try {
      bp = engine.plan(p.plan.pass);
    } catch (const InputError& e) {
      throw InputError(fmt::format("step '{}' ({}): {}", p.step->id, p.step->stage, e.what()));
    }
    std::cout << fmt::format("  {:<14} {:<15}", p.step->id, p.step->stage);
    for (const auto& out : p.plan.pass.outputs) {
      std::uint64_t bytes = out.row_bytes() * out.layout.shape[0];
      std::cout << fmt::format(" -> {} {} {} ({})", out.name, h5::dtype_name(out.layout.dtype),
                               qstage::shape_text(out.layout.shape),
                               format_bytes(static_cast<double>(bytes)));
    }
    std::cout << fmt::format("; batches of {} rows, {} device, {} host\n", bp.batch_rows,
                             format_bytes(static_cast<double>(bp.device_bytes)),
                             format_bytes(static_cast<double>(bp.host_bytes)));
  }
  return kExitDone;
}

// ---------------------------------------------------------------------------------- stages
namespace {

json stage_json(const stages::Stage& s) {
  const auto& i = s.info();
  json inputs = json::array();
  for (const auto& in : i.inputs) inputs.push_back({{"name", in.name}, {"description", in.description}});
  return {{"name", i.name}, {"version", i.version}, {"summary", i.summary}, {"inputs", inputs},
          {"parameters", stages::parameter_schema(s)}, {"example", i.example}};
}
// A parameter's type as `qstage stages NAME` shows it: "one of [...]", "list of integer",
// "boolean or list of one of [...]" (a schema's "type" may be one name or a list of them).
std::string type_text(const json& p) {
  if (p.contains("enum")) return fmt::format("one of {}", p["enum"].dump());
  std::vector<std::string> names;
  if (p.contains("type")) {
    if (p["type"].is_array()) {
      for (const auto& t : p["type"]) names.push_back(t.get<std::string>());
    } else {
      names.push_back(p["type"].get<std::string>());
    }
  }
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += " or ";
    out += name == "array" && p.contains("items") ? "list of " + type_text(p["items"]) : name;
  }
  return out.empty() ? "value" : out;
}


void print_stage(const stages::Stage& s) {
  const auto& i = s.info();
  std::cout << fmt::format("{} (version {})\n  {}\n", i.name, i.version, i.summary);
  std::cout << "inputs:\n";
  if (i.inputs.empty()) std::cout << "  (none)\n";
  for (const auto& in : i.inputs) std::cout << fmt::format("  {:<12} {}\n", in.name, in.description);
  std::cout << "parameters:\n";
  const json& schema = stages::parameter_schema(s);
  const auto required = schema.value("required", json::array());
  if (schema["properties"].empty()) std::cout << "  (none)\n";
  for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
    const json& p = it.value();
    const std::string type = type_text(p);
    std::string def = p.contains("default") ? "default " + p["default"].dump()
                      : std::find(required.begin(), required.end(), it.key()) != required.end() ? "required"
                                                                                                : "optional";
    std::cout << fmt::format("  {:<12} {:<40} {}\n      {}\n", it.key(), type, def, p.value("description", ""));
  }
  std::cout << "example:\n";
  std::string ex = i.example;
  for (size_t pos = 0; pos < ex.size();) {
    size_t nl = ex.find('\n', pos);
    std::cout << "  " << ex.substr(pos, nl - pos) << "\n";
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
}

}  // namespace

int stages(const Args& args) {
  po::options_description o("options");
  o.add_options()("name", po::value<std::string>(), "a stage name (positional)")("json", "print JSON");
  po::positional_options_description pos;
  pos.add("name", 1);
  auto vm = parse(args, o, pos, "usage: qstage stages [NAME] [--json]\n\nLists the stages; with NAME, its inputs, "
                                "parameters (type, default) and an example step.\n",
                  "examples:\n  qstage stages\n  qstage stages tensor.matmul\n");
  if (!vm) return kExitDone;
  if (vm->count("name")) {
    const std::string name = (*vm)["name"].as<std::string>();
    const stages::Stage* s = stages::find_stage(name);
    if (!s) {
      std::vector<std::string> names;
      for (const auto* st : stages::all_stages()) names.push_back(st->info().name);
      throw InputError(fmt::format("unknown stage '{}'; expected one of: {}", name, fmt::join(names, ", ")));
    }
    if (vm->count("json")) std::cout << stage_json(*s).dump(2) << "\n";
    else print_stage(*s);
    return kExitDone;
  }
  if (vm->count("json")) {
    json all = json::array();
    for (const auto* s : stages::all_stages()) all.push_back(stage_json(*s));
    std::cout << all.dump(2) << "\n";
    return kExitDone;
  }
  for (const auto* s : stages::all_stages())
    std::cout << fmt::format("{:<16} v{}  {}\n", s->info().name, s->info().version, s->info().summary);
  std::cout << "\n`qstage stages NAME` shows a stage's inputs, parameters and an example.\n";
  return kExitDone;
}

}  // namespace qstage::cli
