#include "core/log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <fmt/format.h>

#include "core/error.hpp"

namespace qstage::log {

spdlog::level::level_enum parse_level(std::string_view name) {
  static const std::pair<std::string_view, spdlog::level::level_enum> levels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off}};
  for (const auto& [text, level] : levels)
    if (text == name) return level;
  throw InputError(fmt::format("--log-level: unknown level '{}'; expected trace, debug, info, warn, error or off", name));
}

void setup_console(spdlog::level::level_enum level, int rank) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_level(rank == 0 ? level : std::max(level, spdlog::level::warn));
  console->set_pattern(rank == 0 ? "[%Y-%m-%d %H:%M:%S] %^%l%$ %v" : "[%Y-%m-%d %H:%M:%S] rank " +
                                                                      std::to_string(rank) + " %^%l%$ %v");
  auto logger = std::make_shared<spdlog::logger>("qstage", console);
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

void add_run_file(const std::filesystem::path& run_dir, int rank) {
  std::filesystem::create_directories(run_dir / "logs");
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
      (run_dir / "logs" / fmt::format("rank-{}.log", rank)).string(), false);
  file->set_level(spdlog::level::debug);
  file->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %l %v");
  spdlog::default_logger()->sinks().push_back(file);
}

}  // namespace qstage::log
