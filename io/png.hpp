#pragma once
// Writes 8-bit RGB images as PNG through libpng, under a temporary name renamed into place, so a
// failed write never leaves a half-written file where the user asked for one.
#include <cstdint>
#include <filesystem>
#include <vector>

namespace qstage::png {

// `rgb` holds width * height * 3 bytes, row by row from the top. Rows are stored unfiltered
// (filter type 0), which keeps the file trivial to decode in tests.
void write_rgb(const std::filesystem::path& path, int width, int height, const std::vector<std::uint8_t>& rgb);

}  // namespace qstage::png
