#include "stages/views.hpp"

#include <algorithm>

#include "stages/mps/mps_stages.hpp"
#include "stages/nnqs/nnqs_stages.hpp"
#include "stages/sci/sci_stages.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {

const std::vector<View>& all_views() {
  // An explicit list of the families (as all_stages()), so nothing depends on link order.
  static const std::vector<View> views = [] {
    std::vector<View> v = tn_views();
    for (View& view : sci_views()) v.push_back(std::move(view));
    for (View& view : mps_views()) v.push_back(std::move(view));
    for (View& view : nnqs_views()) v.push_back(std::move(view));
    std::sort(v.begin(), v.end(), [](const View& a, const View& b) { return a.stage < b.stage; });
    return v;
  }();
  return views;
}

const View* find_view(const h5::File& f) {
  if (!f.has_attribute("qstage.stage")) return nullptr;
  const std::string stage = f.string_attribute("qstage.stage");
  for (const View& v : all_views())
    if (v.stage == stage) return &v;
  return nullptr;
}

}  // namespace qstage::stages
