#pragma once
// JSON Schema validation (valijson, draft 7) with errors that point at the offending field.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spec/document.hpp"

namespace qstage::spec {

struct SchemaError {
  std::string pointer;  // JSON pointer of the offending value in the document
  std::string message;  // what is wrong and what was expected
};

// Validates `value` (the part of a document at `base_pointer`) against `schema`. Returns the
// most specific error first; empty if valid.
std::vector<SchemaError> validate(const nlohmann::json& schema, const nlohmann::json& value,
                                  const std::string& base_pointer = "");

// Throws InputError "<file:line:col>: <path>: <message>" for the first error, if any.
void require_valid(const nlohmann::json& schema, const Document& doc, const nlohmann::json& value,
                   const std::string& base_pointer);

// Fills in "default" values of the schema's top-level properties that `value` lacks.
nlohmann::json with_defaults(const nlohmann::json& schema, nlohmann::json value);

// The closest of `candidates` to `word` (edit distance <= 3), or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace qstage::spec
