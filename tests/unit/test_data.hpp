#pragma once
// Where the unit tests' data files are: $QSTAGE_TEST_DATA when set (a build run elsewhere than
// where it was configured, as on the GPU machine: point it at the checkout's tests/data), else
// the tests/data folder of the source tree the build was configured from.
#include <cstdlib>
#include <string>

namespace qstage::testing {

inline std::string test_data(const std::string& relative) {
  const char* set = std::getenv("QSTAGE_TEST_DATA");
  return std::string(set && *set ? set : QSTAGE_TEST_DATA_DEFAULT) + "/" + relative;
}

}  // namespace qstage::testing
