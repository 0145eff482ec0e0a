#include "core/embedded.hpp"

#include <stdexcept>

namespace qstage::embedded {

std::string_view file(std::string_view path) {
  auto it = files().find(path);
  if (it == files().end())
    throw std::out_of_range("embedded file not found: " + std::string(path));
  return it->second;
}

}  // namespace qstage::embedded
