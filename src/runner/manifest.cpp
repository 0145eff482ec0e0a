#include "runner/manifest.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>

#include "core/error.hpp"
#include "core/fsutil.hpp"

namespace qstage::runner {

namespace fs = std::filesystem;
using nlohmann::json;

std::string utc_now() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(now));
}

std::optional<Manifest> Manifest::load(const fs::path& run_dir) {
  const fs::path path = run_dir / "manifest.json";
  if (!fs::exists(path)) return std::nullopt;
  Manifest m;
  try {
    m.data_ = json::parse(fsutil::read_file(path));
    if (m.data_.value("format", "") != "qstage-manifest-1") throw std::runtime_error("unknown format");
    m.data_.at("workflow").get<std::string>();
  } catch (const std::exception& e) {
    throw InputError(fmt::format("'{}' is not a readable qstage manifest ({}); expected a run directory made by qstage",
                                 path.string(), e.what()));
  }
  if (!m.data_.contains("steps")) m.data_["steps"] = json::object();
  return m;
}

Manifest Manifest::create(std::string workflow) {
  Manifest m;
  m.data_ = {{"format", "qstage-manifest-1"}, {"workflow", std::move(workflow)}, {"created", utc_now()},
             {"steps", json::object()}};
  return m;
}

void Manifest::save(const fs::path& run_dir) {
  data_["updated"] = utc_now();
  fsutil::write_file_atomic(run_dir / "manifest.json", data_.dump(1));
}

json& Manifest::step(const std::string& id) {
  json& s = data_["steps"][id];
  if (s.is_null()) s = json::object();
  return s;
}

const json* Manifest::find_step(const std::string& id) const {
  const json& steps = data_.at("steps");
  auto it = steps.find(id);
  return it == steps.end() ? nullptr : &*it;
}

}  // namespace qstage::runner
