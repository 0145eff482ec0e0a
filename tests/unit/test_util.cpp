#include "test_util.hpp"

#include "backend/backend.hpp"

namespace qstage::test {

bool gpu_available() { return qstage::cuda_available(); }

}  // namespace qstage::test
