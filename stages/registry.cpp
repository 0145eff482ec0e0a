// The registry: the stage families, listed once. An explicit list (not static self-registration
// in the families' libraries) so nothing depends on link order.
#include "stages/registry.hpp"

#include <algorithm>

#include "stages/compress/compress_stages.hpp"
#include "stages/keys/keys_stages.hpp"
#include "stages/mps/mps_stages.hpp"
#include "stages/nnqs/nnqs_stages.hpp"
#include "stages/sci/sci_stages.hpp"
#include "stages/tensor/tensor_stages.hpp"
#include "stages/tn/tn_stages.hpp"

namespace qstage::stages {

namespace {

const std::vector<Family>& families() {
  static const std::vector<Family> all = {tensor_family(), tn_family(),  compress_family(), keys_family(),
                                          sci_family(),    nnqs_family(), mps_family()};
  return all;
}

}  // namespace

const std::vector<const Stage*>& all_stages() {
  static const std::vector<const Stage*> stages = [] {
    std::vector<const Stage*> v;
    for (const Family& f : families()) v.insert(v.end(), f.stages.begin(), f.stages.end());
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->info().name < b->info().name; });
    return v;
  }();
  return stages;
}

const Stage* find_stage(std::string_view name) {
  for (const Stage* s : all_stages())
    if (s->info().name == name) return s;
  return nullptr;
}

const std::vector<View>& all_views() {
  static const std::vector<View> views = [] {
    std::vector<View> v;
    for (const Family& f : families()) v.insert(v.end(), f.views.begin(), f.views.end());
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
