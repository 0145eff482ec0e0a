#pragma once
// How `qstage inspect` shows a stage's output beyond the generic listing (attributes, datasets):
// `--plot` draws it into a PNG. Each stage family lists the views of its own outputs in its
// Family (stages/common/family.hpp; stages/registry.hpp's all_views() gathers them), so the
// command line dispatches on a file's qstage.stage attribute and knows no stage's output format.
#include <filesystem>
#include <string>
#include <vector>

#include "io/h5.hpp"

namespace qstage::stages {

struct View {
  std::string stage;  // the outputs it shows: files whose qstage.stage attribute is this stage's name
  std::string draws;  // what the plot shows, for --help and errors: "a plan's tensor sizes along its path"
  std::string help;   // the same at more length, for `qstage inspect --help`
  // Draws `file` (opened as `f`) into `png` (through io/canvas). Throws InputError if the file
  // lacks what the plot needs, or the PNG cannot be written.
  void (*plot)(const h5::File& f, const std::filesystem::path& file, const std::filesystem::path& png);
};


}  // namespace qstage::stages
