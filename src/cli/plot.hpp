#pragma once
// `qstage inspect PLAN.h5 --plot OUT.png`: the size of every intermediate along a tn.plan's path
// (log2 bytes per step, with the arena in use and the plan's arena size), like seed 000's Fig. 5.
#include <filesystem>

namespace qstage::cli {

// Throws InputError if `plan_file` is not a tn.plan output.
void plot_plan(const std::filesystem::path& plan_file, const std::filesystem::path& png_file);

}  // namespace qstage::cli
