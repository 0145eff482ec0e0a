#pragma once
// A workflow spec: YAML with a name, options and an ordered list of steps. Each step names a
// stage, its parameters and its inputs (outputs of earlier steps, or datasets in files).
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "spec/document.hpp"

namespace qstage::stages {
class Stage;
}

namespace qstage::spec {

struct InputRef {
  std::string step;             // producing step id (empty for a file)
  std::filesystem::path file;   // absolute path (empty for a step)
  std::string dataset;          // empty: the producing step's primary output
  std::string pointer;          // where in the spec, for messages
  std::string describe() const; // "step 'a'", "step 'a' dataset 'data'", "file 'x.h5' dataset '/psi'"
};

struct Step {
  std::size_t index = 0;
  std::string id, stage, description;
  nlohmann::json params;  // schema-valid, with defaults filled in
  std::map<std::string, InputRef> inputs;
  std::map<std::string, std::filesystem::path> files;  // file parameters (JSON pointer -> absolute path)
  // The step's compress_output (defaults filled in), or null: its streamed outputs are written
  // compressed (engine::OutputDecl::codec).
  nlohmann::json compress_output;
  const stages::Stage* impl = nullptr;
  std::string pointer() const { return "/steps/" + std::to_string(index); }
};

// Engine settings a spec may carry; command-line options override them.
struct Options {
  std::optional<std::string> checkpoint_interval, device_memory, host_memory;
  std::optional<std::uint64_t> max_batch_rows;
};

struct Workflow {
  std::string name, description;
  std::vector<Step> steps;
  Options options;
  std::string text;                // the YAML as given
  std::string source;              // file path, or "<embedded quickstart>"
  std::filesystem::path base_dir;  // relative file paths are resolved against it
  Document doc;
  const Step* find(std::string_view id) const;
};

// Parses and validates a spec: YAML, the spec schema, unique step ids, known stages, each
// step's parameters against its stage's schema, input slots, and references to earlier steps.
// Throws InputError pointing at the offending field ("spec.yaml:12:5: steps[1].params.seed: ...").
Workflow load_workflow(std::string text, std::string source, std::filesystem::path base_dir);
Workflow load_workflow_file(const std::filesystem::path& path);
// The embedded default (workflows/quickstart.yaml), resolved against the current directory.
Workflow quickstart_workflow();

}  // namespace qstage::spec
