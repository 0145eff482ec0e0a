// Workflow specs: YAML typing, schema errors that point at the line and field, stage checks.
#include <gtest/gtest.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "runner/planner.hpp"
#include "spec/document.hpp"
#include "spec/schema.hpp"
#include "runner/workflow.hpp"
#include "stages/common/stage.hpp"
#include "stages/registry.hpp"
#include "test_util.hpp"

using namespace qstage;

namespace {

// The InputError message of loading `yaml` (and planning it), or "" if it is fine.
std::string error_of(const std::string& yaml) {
  try {
    auto wf = spec::load_workflow(yaml, "spec.yaml", ".");
    runner::plan_workflow(wf);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kGood = R"(name: t
steps:
  - id: a
    stage: tensor.random
    params: {shape: [64, 4], seed: 3}
  - id: b
    stage: tensor.random
    params: {shape: [4, 2]}
  - id: c
    stage: tensor.matmul
    inputs: {a: a, b: b}
)";

}  // namespace

TEST(Yaml, ScalarsAreTyped) {
  auto d = spec::parse_yaml("a: 1_048_576\nb: '12'\nc: 0x10\nd: 2.5e3\ne: true\nf: ~\ng: text\nh: -3\n", "x.yaml");
  EXPECT_EQ(d.value["a"], 1048576);
  EXPECT_EQ(d.value["b"], "12");
  EXPECT_EQ(d.value["c"], 16);
  EXPECT_EQ(d.value["d"], 2500.0);
  EXPECT_EQ(d.value["e"], true);
  EXPECT_TRUE(d.value["f"].is_null());
  EXPECT_EQ(d.value["g"], "text");
  EXPECT_EQ(d.value["h"], -3);
  EXPECT_EQ(d.where("/g"), "x.yaml:7:4");
}

TEST(Yaml, MalformedAndDuplicateKeysNameTheLine) {
  EXPECT_NE(error_of("name: t\nsteps: [\n").find("spec.yaml:"), std::string::npos);
  const std::string dup = error_of("name: t\nname: u\nsteps: []\n");
  EXPECT_NE(dup.find("spec.yaml:2:1"), std::string::npos) << dup;
  EXPECT_NE(dup.find("duplicate key 'name'"), std::string::npos) << dup;
}

TEST(Spec, ValidSpecPlansWithDefaults) {
  auto wf = spec::load_workflow(kGood, "spec.yaml", ".");
  ASSERT_EQ(wf.steps.size(), 3u);
  EXPECT_EQ(wf.steps[0].params["dtype"], "complex64");  // default filled in
  EXPECT_EQ(wf.steps[0].params["chunk_rows"], 0);
  auto planned = runner::plan_workflow(wf);
  EXPECT_EQ(planned[2].plan.pass.outputs[0].layout.shape, (h5::Shape{64, 2}));
}

TEST(Spec, ErrorsPointAtTheField) {
  // wrong type, with line and path
  std::string e = error_of("name: t\nsteps:\n  - id: a\n    stage: tensor.random\n    params: {shape: [4, x]}\n");
  EXPECT_NE(e.find("spec.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("steps[0].params.shape[1]"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an integer"), std::string::npos) << e;
  // unknown parameter with a suggestion
  e = error_of("name: t\nsteps:\n  - id: a\n    stage: tensor.random\n    params: {shape: [4], sede: 1}\n");
  EXPECT_NE(e.find("steps[0].params.sede"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'seed'"), std::string::npos) << e;
  // enum
  e = error_of("name: t\nsteps:\n  - id: a\n    stage: tensor.random\n    params: {shape: [4], dtype: float16}\n");
  EXPECT_NE(e.find("one of float32, float64, complex64, complex128"), std::string::npos) << e;
  // missing required
  e = error_of("name: t\nsteps:\n  - id: a\n    stage: tensor.random\n");
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  // unknown stage
  e = error_of("name: t\nsteps:\n  - id: a\n    stage: tensor.randon\n");
  EXPECT_NE(e.find("unknown stage 'tensor.randon'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'tensor.random'"), std::string::npos) << e;
  // top-level typo
  e = error_of("name: t\nstep: []\n");
  EXPECT_NE(e.find("unknown key 'step'"), std::string::npos) << e;
}

TEST(Spec, InputsAreChecked) {
  const std::string head = "name: t\nsteps:\n  - id: a\n    stage: tensor.random\n    params: {shape: [8, 4]}\n";
  std::string e = error_of(head + "  - id: s\n    stage: tensor.stats\n    inputs: {x: later}\n");
  EXPECT_NE(e.find("step 'later' is not defined before this step"), std::string::npos) << e;
  e = error_of(head + "  - id: s\n    stage: tensor.stats\n");
  EXPECT_NE(e.find("missing input 'x'"), std::string::npos) << e;
  e = error_of(head + "  - id: s\n    stage: tensor.stats\n    inputs: {x: a, y: a}\n");
  EXPECT_NE(e.find("has no input 'y'"), std::string::npos) << e;
  e = error_of(head + "  - id: s\n    stage: tensor.stats\n    inputs: {x: 'a:nothing'}\n");
  EXPECT_NE(e.find("has no output dataset 'nothing'"), std::string::npos) << e;
  e = error_of(head + "  - id: a\n    stage: tensor.stats\n    inputs: {x: a}\n");
  EXPECT_NE(e.find("used twice"), std::string::npos) << e;
  e = error_of(head + "  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: /nonexistent/q.h5, dataset: d}}\n");
  EXPECT_NE(e.find("'/nonexistent/q.h5' does not exist"), std::string::npos) << e;
}

TEST(Spec, StagesCheckShapes) {
  const std::string e = error_of(R"(name: t
steps:
  - id: a
    stage: tensor.random
    params: {shape: [64, 4]}
  - id: b
    stage: tensor.random
    params: {shape: [5, 2]}
  - id: c
    stage: tensor.matmul
    inputs: {a: a, b: b}
)");
  EXPECT_NE(e.find("spec.yaml:9:5"), std::string::npos) << e;
  EXPECT_NE(e.find("id 'c'"), std::string::npos) << e;
  EXPECT_NE(e.find("input 'b' has 5 rows; expected 4"), std::string::npos) << e;
}

TEST(Spec, FileInputsAreDescribed) {
  test::TempDir dir;
  {
    h5::File f = h5::File::create(dir.path / "in.h5");
    f.create_dataset("/m", {h5::DType::complex64, {10, 3}, {5, 3}, false});
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 8);
    hsize_t n = 2;
    hid_t s = H5Screate_simple(1, &n, nullptr);
    H5Dclose(H5Dcreate2(f.id(), "strings", t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(s);
    H5Tclose(t);
    f.close();
  }
  const std::string file = (dir.path / "in.h5").string();
  const std::string head = "name: t\nsteps:\n  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: '" + file + "', ";
  EXPECT_EQ(error_of(head + "dataset: /m}}\n"), "");
  std::string e = error_of(head + "dataset: /q}}\n");
  EXPECT_NE(e.find("has no dataset '/q'; datasets in it: /m, /strings"), std::string::npos) << e;
  e = error_of(head + "dataset: /strings}}\n");
  EXPECT_NE(e.find("element type string"), std::string::npos) << e;
  test::write_text(dir.path / "text.h5", "hello");
  e = error_of("name: t\nsteps:\n  - id: s\n    stage: tensor.stats\n    inputs: {x: {file: '" +
               (dir.path / "text.h5").string() + "', dataset: /m}}\n");
  EXPECT_NE(e.find("is not an HDF5 file"), std::string::npos) << e;
}

TEST(Spec, EveryEmbeddedWorkflowIsValid) {
  for (const auto& [path, text] : embedded::files())
    if (path.rfind("workflows/", 0) == 0) {
      auto wf = spec::load_workflow(std::string(text), std::string(path), ".");
      EXPECT_NO_THROW(runner::plan_workflow(wf)) << path;
    }
}

TEST(Spec, EveryStageHasASchemaAndItsExampleValidates) {
  for (const auto* s : stages::all_stages()) {
    const auto& schema = stages::parameter_schema(*s);
    ASSERT_TRUE(schema.is_object()) << s->info().name;
    auto example = spec::parse_yaml(s->info().example, s->info().name);
    ASSERT_TRUE(example.value.is_array()) << s->info().name;
    EXPECT_EQ(example.value[0]["stage"], s->info().name);
    const auto params = example.value[0].value("params", nlohmann::json::object());
    EXPECT_TRUE(spec::validate(schema, params).empty()) << s->info().name;
  }
}
