#pragma once
// A YAML document turned into JSON (nlohmann::json), remembering where in the text every value
// came from, so schema errors can point at a line and column.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qstage::spec {

struct Mark {
  int line = 0, column = 0;  // 1-based; 0 if unknown
};

struct Document {
  nlohmann::json value;
  std::map<std::string, Mark> marks;  // JSON pointer ("/steps/1/params") -> position
  std::string source;                 // file name for messages

  // "spec.yaml:12:5" for the value at `pointer` (or the nearest parent that has a mark).
  std::string where(const std::string& pointer) const;
};

// Parses YAML. Plain scalars become null, booleans (true/false), integers (also 0x.., 1_000),
// floats or strings; quoted scalars are always strings. Throws InputError
// "<source>:<line>:<col>: <problem>" for malformed YAML or duplicate keys.
Document parse_yaml(std::string_view text, std::string source);

// "/steps/1/params/shape" -> "steps[1].params.shape".
std::string pointer_to_path(const std::string& pointer);

}  // namespace qstage::spec
