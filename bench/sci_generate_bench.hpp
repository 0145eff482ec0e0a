#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace qstage::bench {
// qstage_bench sci-generate --fcidump FILE [--sources 100000] [--batch 2000] [--eps 0] [--device cuda|cpu]
nlohmann::json sci_generate_bench(const std::map<std::string, std::string>& args);
}  // namespace qstage::bench
