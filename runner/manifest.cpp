#include "runner/manifest.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>

#include "core/error.hpp"
#include "core/fsutil.hpp"
#include "io/h5.hpp"
#include "stages/common/kept.hpp"

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
  const fsutil::DurableNow durable;  // (what the run directory says of its steps is always durable)
  fsutil::write_file_atomic(run_dir / "manifest.json", data_.dump(1));
}

std::string output_problem(const fs::path& output, const json& record) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return "is missing";
  const auto size = fs::file_size(output, ec);
  if (ec) return fmt::format("cannot be read ({})", ec.message());
  if (record.contains("output_bytes") && record["output_bytes"].get<std::uintmax_t>() != size)
    return fmt::format("has {} bytes; {} were committed", size, record["output_bytes"].get<std::uintmax_t>());
  if (!h5::File::is_hdf5(output)) return "is not an HDF5 file";
  try {
    const h5::File f = h5::File::open(output, h5::Mode::read_only);
    if (stages::step_key_of(f) != record.value("key", ""))
      return "is not the one its step committed (another step key)";
    const json sums = record.value("checksums", json::object());
    for (auto it = sums.begin(); it != sums.end(); ++it) {
      const std::string name = "/" + it.key();
      if (!f.exists(name)) return fmt::format("has no dataset '{}'", name);
      const h5::Dataset d = f.open_dataset(name);
      const char* attribute = d.has_attribute("qsum64") ? "qsum64" : "stored_xxh64";
      if (!d.has_attribute(attribute) || d.string_attribute(attribute) != it.value().get<std::string>())
        return fmt::format("has another checksum of '{}' than was committed", name);
    }
  } catch (const std::exception& e) {
    return fmt::format("cannot be opened ({})", e.what());
  }
  return "";
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
