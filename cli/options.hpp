#pragma once
// Parsing helpers around Boost.program_options: errors become InputError (exit 2) with the
// option's name, and --help prints the command's text.
#include <boost/program_options.hpp>

#include <optional>
#include <string>

#include "cli/cli.hpp"

namespace qstage::cli {

namespace po = boost::program_options;

// Parses `args` against `options` (+ positional names). Returns nullopt if --help was printed.
std::optional<po::variables_map> parse(const Args& args, const po::options_description& options,
                                       const po::positional_options_description& positional, const char* usage,
                                       const char* examples);

}  // namespace qstage::cli
