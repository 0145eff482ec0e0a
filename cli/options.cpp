#include "cli/options.hpp"

#include <fmt/format.h>

#include <iostream>

#include "core/error.hpp"

namespace qstage::cli {

std::optional<po::variables_map> parse(const Args& args, const po::options_description& options,
                                       const po::positional_options_description& positional, const char* usage,
                                       const char* examples) {
  po::options_description all;
  all.add(options);
  all.add_options()("help,h", "show this help");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << all << "\n" << examples;
      return std::nullopt;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(fmt::format("{} (see the command's --help)", e.what()));
  }
  return vm;
}

}  // namespace qstage::cli
