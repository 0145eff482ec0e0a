#pragma once
// A stage family as the registry (stages/registry.cpp) sees it: its stages and the `qstage
// inspect --plot` views of their outputs. Each family's header (stages/<family>/<family>_stages.hpp)
// declares its stages and lists them in its <family>_family(): adding a stage to a family is that
// header's two lines, the stage's own file, and its schema (schemas/stages/<name>.json).
#include <vector>

#include "stages/common/stage.hpp"
#include "stages/common/views.hpp"

namespace qstage::stages {

struct Family {
  std::vector<const Stage*> stages;
  std::vector<View> views;
};

}  // namespace qstage::stages
