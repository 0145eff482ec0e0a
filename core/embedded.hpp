#pragma once
// Files compiled into the binary (schemas/, workflows/quickstart.yaml): see cmake/embed_files.cmake.
#include <map>
#include <string>
#include <string_view>

namespace qstage::embedded {

// Path relative to the source root (e.g. "schemas/spec.schema.json") -> file text.
const std::map<std::string_view, std::string_view>& files();

// The text of one embedded file; throws std::out_of_range naming the path if it is missing.
std::string_view file(std::string_view path);

}  // namespace qstage::embedded
