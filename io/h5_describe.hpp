#pragma once
// A JSON description of an HDF5 file (what `qstage inspect --json` prints, and what the output
// layout schemas in schemas/outputs/ describe): root attributes and every dataset's dtype, shape,
// chunk, maxshape and attributes.
#include <filesystem>
#include <nlohmann/json.hpp>

namespace qstage::h5 {

// Throws h5::Error if the file cannot be read.
nlohmann::json describe_file(const std::filesystem::path& path);

}  // namespace qstage::h5
