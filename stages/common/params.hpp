#pragma once
// Reading a stage's parameters: each stage reads them once, in its `struct Params` with a
// `static Params from_json(const nlohmann::json&)`, and its plan, kernel and compute use the
// typed fields. The JSON has passed the stage's schema (schemas/stages/<name>.json) with the
// defaults filled in, so a required or defaulted field is there with its type (read it with at());
// the helpers below read the rest.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/units.hpp"
#include "io/h5.hpp"

namespace qstage::stages::params {

// A field the schema leaves optional (no default): its value, or nullopt if not given.
template <typename T>
std::optional<T> optional(const nlohmann::json& p, const char* key) {
  const auto it = p.find(key);
  if (it == p.end()) return std::nullopt;
  return it->get<T>();
}

// An optional size ("64MiB", "1.5GB") in bytes; a malformed one is an InputError naming params.KEY.
inline std::optional<std::uint64_t> optional_size(const nlohmann::json& p, const char* key) {
  const auto text = optional<std::string>(p, key);
  if (!text) return std::nullopt;
  return parse_size(*text, std::string("params.") + key);
}

// The complex element type the tn stages compute in ("precision": complex64 or complex128).
inline h5::DType precision(const nlohmann::json& p) {
  return p.at("precision") == "complex128" ? h5::DType::complex128 : h5::DType::complex64;
}

}  // namespace qstage::stages::params
