#pragma once
// Logging: spdlog with a console sink on rank 0 (stderr) and one file per rank in the run
// directory (logs/rank-N.log), so SLURM logs stay readable and every rank leaves a trace.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string_view>

namespace qstage::log {

// Parses "trace|debug|info|warn|error|off"; throws InputError otherwise.
spdlog::level::level_enum parse_level(std::string_view name);

// Console-only logging (before a run directory exists). Non-root ranks log only warnings.
void setup_console(spdlog::level::level_enum level, int rank);

// Adds the per-rank log file <run_dir>/logs/rank-<rank>.log (appended across resumes).
void add_run_file(const std::filesystem::path& run_dir, int rank);

}  // namespace qstage::log
