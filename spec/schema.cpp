#include "spec/schema.hpp"

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace qstage::spec {

using nlohmann::json;

namespace {

// valijson's context ["<root>", "[steps]", "[1]"] -> "/steps/1".
std::string context_pointer(const std::vector<std::string>& context) {
  std::string p;
  for (const auto& c : context) {
    if (c == "<root>") continue;
    std::string token = c;
    if (token.size() >= 2 && token.front() == '[' && token.back() == ']') token = token.substr(1, token.size() - 2);
    if (token.size() >= 2 && token.front() == '"' && token.back() == '"') token = token.substr(1, token.size() - 2);
    p += '/';
    p += token;
  }
  return p;
}

const json* resolve_ref(const json& root, const json& node) {
  if (node.is_object() && node.contains("$ref")) {
    const std::string ref = node["$ref"].get<std::string>();
    if (ref.rfind("#/", 0) == 0) return &root.at(json::json_pointer(ref.substr(1)));
  }
  return &node;
}

// The subschema that governs the value at `pointer` (follows properties, items and $ref).
const json* subschema(const json& root, const std::string& pointer) {
  const json* s = resolve_ref(root, root);
  size_t pos = 0;
  while (pos < pointer.size() && s) {
    size_t next = pointer.find('/', pos + 1);
    const std::string token = pointer.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    const json* child = nullptr;
    if (s->contains("properties") && (*s)["properties"].contains(token)) child = &(*s)["properties"][token];
    else if (s->contains("additionalProperties") && (*s)["additionalProperties"].is_object())
      child = &(*s)["additionalProperties"];
    else if (s->contains("items") && (*s)["items"].is_object()) child = &(*s)["items"];
    s = child ? resolve_ref(root, *child) : nullptr;
    if (next == std::string::npos) break;
    pos = next;
  }
  return s;
}

std::string json_type(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "a mapping";
    default: return "a value";
  }
}

std::string expected_type(const json& schema) {
  auto name = [](const std::string& t) -> std::string {
    if (t == "integer") return "an integer";
    if (t == "number") return "a number";
    if (t == "string") return "a string";
    if (t == "boolean") return "true or false";
    if (t == "array") return "a list";
    if (t == "object") return "a mapping";
    return t;
  };
  std::string out;
  if (schema.contains("type")) {
    if (schema["type"].is_array()) {
      std::vector<std::string> names;
      for (const auto& t : schema["type"]) names.push_back(name(t.get<std::string>()));
      out = fmt::format("{}", fmt::join(names, " or "));
    } else {
      out = name(schema["type"].get<std::string>());
    }
    if (schema["type"] == "array" && schema.contains("items") && schema["items"].contains("type"))
      out += fmt::format(" of {}s", expected_type(schema["items"]));
  }
  return out;
}

// Rewrites valijson's description into "<problem>; expected <...>".
std::string friendly(const json& root, const json& document, const std::string& pointer, const std::string& text) {
  const json* s = subschema(root, pointer);
  const json* value = nullptr;
  try {
    value = &document.at(json::json_pointer(pointer));
  } catch (...) {
  }
  std::string expectation;
  if (s) {
    if (s->contains("enum")) {
      std::vector<std::string> options;
      for (const auto& e : (*s)["enum"]) options.push_back(e.is_string() ? e.get<std::string>() : e.dump());
      expectation = fmt::format("one of {}", fmt::join(options, ", "));
    } else {
      expectation = expected_type(*s);
    }
    if (s->contains("description"))
      expectation += fmt::format("{}{}", expectation.empty() ? "" : ": ", (*s)["description"].get<std::string>());
  }
  std::string problem = text;
  // Bounds: "got -4; expected an integer >= 1" reads better than valijson's wording.
  for (const auto& [prefix, op] : {std::pair<std::string, std::string>{"Expected number greater than or equal to ", ">="},
                                  {"Expected number greater than ", ">"},
                                  {"Expected number less than or equal to ", "<="},
                                  {"Expected number less than ", "<"}})
    if (text.rfind(prefix, 0) == 0 && value && s) {
      const double bound = std::stod(text.substr(prefix.size()));
      return fmt::format("got {}; expected {} {} {}", value->dump(), expected_type(*s), op, bound);
    }
  if (text.rfind("Missing required property ", 0) == 0) {
    std::string name = text.substr(std::string("Missing required property ").size());
    if (!name.empty() && name.back() == '.') name.pop_back();
    return fmt::format("missing required key {}", name);
  }
  if (text.find("'type' constraint") != std::string::npos && value) problem = fmt::format("got {}", json_type(*value));
  else if (text.find("enum values") != std::string::npos && value) problem = fmt::format("got {}", value->dump());
  else if (text.find("'pattern' constraint") != std::string::npos && value) problem = fmt::format("got {}", value->dump());
  else if (!problem.empty() && problem.back() == '.') problem.pop_back();
  if (expectation.empty()) return problem;
  return fmt::format("{}; expected {}", problem, expectation);
}

bool is_wrapper(const std::string& description) {
  return description.rfind("Failed to validate", 0) == 0 || description.rfind("Cannot validate", 0) == 0;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Unknown keys get their own message (with a suggestion) before the schema runs.
void unknown_keys(const json& root, const json& schema, const json& value, const std::string& pointer,
                  std::vector<SchemaError>& errors) {
  const json* s = resolve_ref(root, schema);
  if (!value.is_object() || !s->is_object()) {
    if (value.is_array() && s->contains("items") && (*s)["items"].is_object())
      for (size_t i = 0; i < value.size(); ++i)
        unknown_keys(root, (*s)["items"], value[i], fmt::format("{}/{}", pointer, i), errors);
    return;
  }
  const bool closed = s->contains("additionalProperties") && (*s)["additionalProperties"] == false;
  std::vector<std::string> known;
  if (s->contains("properties"))
    for (auto it = (*s)["properties"].begin(); it != (*s)["properties"].end(); ++it) known.push_back(it.key());
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string child = fmt::format("{}/{}", pointer, it.key());
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) {
      unknown_keys(root, (*s)["properties"][it.key()], it.value(), child, errors);
    } else if (closed) {
      std::string hint = closest(it.key(), known);
      errors.push_back({child, fmt::format("unknown key '{}'{}; expected one of: {}", it.key(),
                                           hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint),
                                           fmt::join(known, ", "))});
    }
  }
}

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 4;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::vector<SchemaError> validate(const json& schema, const json& value, const std::string& base_pointer) {
  std::vector<SchemaError> errors;
  unknown_keys(schema, schema, value, "", errors);
  if (errors.empty()) {
    valijson::Schema compiled;
    valijson::SchemaParser parser;
    valijson::adapters::NlohmannJsonAdapter schema_adapter(schema);
    parser.populateSchema(schema_adapter, compiled);
    valijson::Validator validator;
    valijson::ValidationResults results;
    valijson::adapters::NlohmannJsonAdapter value_adapter(value);
    if (!validator.validate(compiled, value_adapter, &results)) {
      valijson::ValidationResults::Error e;
      std::vector<SchemaError> raw;
      std::vector<bool> wrapper;
      while (results.popError(e)) {
        raw.push_back({context_pointer(e.context), e.description});
        wrapper.push_back(is_wrapper(e.description));
      }
      // Most specific first: the deepest pointer, and real problems before "failed to validate item".
      std::vector<size_t> order(raw.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (wrapper[a] != wrapper[b]) return !wrapper[a];
        return raw[a].pointer.size() > raw[b].pointer.size();
      });
      for (size_t i : order) errors.push_back({raw[i].pointer, friendly(schema, value, raw[i].pointer, raw[i].message)});
    }
  }
  for (auto& e : errors) e.pointer = base_pointer + e.pointer;
  return errors;
}

void require_valid(const json& schema, const Document& doc, const json& value, const std::string& base_pointer) {
  const auto errors = validate(schema, value, base_pointer);
  if (errors.empty()) return;
  const auto& e = errors.front();
  throw InputError(fmt::format("{}: {}: {}", doc.where(e.pointer), pointer_to_path(e.pointer), e.message));
}

json with_defaults(const json& schema, json value) {
  if (!value.is_object() || !schema.contains("properties")) return value;
  for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it)
    if (!value.contains(it.key()) && it.value().contains("default")) value[it.key()] = it.value()["default"];
  return value;
}

}  // namespace qstage::spec
