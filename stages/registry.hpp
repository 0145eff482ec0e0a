#pragma once
// Every stage qstage knows, and the views of their outputs: the families listed once
// (stages/registry.cpp), each family's stages in its own header (stages/common/family.hpp).
#include <string_view>
#include <vector>

#include "io/h5.hpp"
#include "stages/common/stage.hpp"
#include "stages/common/views.hpp"

namespace qstage::stages {

// Every stage, in name order.
const std::vector<const Stage*>& all_stages();
const Stage* find_stage(std::string_view name);
// Every family's views, in stage name order.
const std::vector<View>& all_views();
// The view of the output `f` (by its qstage.stage attribute); nullptr if none has one.
const View* find_view(const h5::File& f);

}  // namespace qstage::stages
