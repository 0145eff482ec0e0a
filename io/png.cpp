#include "io/png.hpp"

#include <fmt/format.h>
#include <png.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.hpp"

namespace qstage::png {

namespace {

// libpng reports errors by longjmp to the setjmp in write_rows (no C++ objects live in between).
bool write_rows(png_structp png, png_infop info, FILE* file, int width, int height, const std::uint8_t* rgb) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_NONE);
  png_write_info(png, info);
  for (int y = 0; y < height; ++y) png_write_row(png, rgb + static_cast<size_t>(y) * static_cast<size_t>(width) * 3);
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

void write_rgb(const std::filesystem::path& path, int width, int height, const std::vector<std::uint8_t>& rgb) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * static_cast<size_t>(height) * 3)
    throw std::invalid_argument("png::write_rgb: the pixels do not match width x height x 3");
  const std::filesystem::path tmp = path.string() + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!file)
    throw InputError(fmt::format("cannot write '{}': {}; expected a writable path", tmp.string(), std::strerror(errno)));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  const bool written = info && write_rows(png, info, file.get(), width, height, rgb.data());
  png_destroy_write_struct(&png, info ? &info : nullptr);
  if (!written) {
    file.reset();
    std::filesystem::remove(tmp);
    throw RuntimeFailure(fmt::format("libpng could not write '{}'", path.string()));
  }
  if (std::fclose(file.release()) != 0) {
    std::filesystem::remove(tmp);
    throw InputError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace qstage::png
