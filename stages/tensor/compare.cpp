// tensor.compare: checks one dataset against a reference of the same shape, e.g. amplitudes
// from tn.contract against tn.statevector. Reads both in blocks of rows on the host (the data
// it is meant for is small, but any size works in bounded memory) and sums in row order in
// float64, so the numbers are the same on every run. With `rtol` or `atol` the step fails
// (exit 3, nothing committed) when the bound is broken; without, it only reports.
#include <cmath>
#include <complex>
#include <cstring>
#include <vector>

#include "stages/common/params.hpp"
#include "core/serial.hpp"
#include "stages/common/results.hpp"
#include "stages/tensor/tensor_stages.hpp"

namespace qstage::stages {
namespace {

using nlohmann::json;
using cd = std::complex<double>;

struct Comparison {
  double diff_sq = 0, a_sq = 0, b_sq = 0, max_abs_diff = 0;
  std::uint64_t count = 0, nonfinite = 0;
  double relative_error() const { return b_sq > 0 ? std::sqrt(diff_sq / b_sq) : std::sqrt(diff_sq); }
};

Comparison compare(const h5::Dataset& a, const h5::Dataset& b) {
  const auto ta = *a.dtype(), tb = *b.dtype();
  const std::uint64_t rows = a.shape().empty() ? 1 : a.shape()[0];
  const std::uint64_t row_elements = a.row_bytes() / h5::dtype_size(ta);
  const std::uint64_t block = std::max<std::uint64_t>(1, (std::uint64_t{1} << 20) / std::max<std::uint64_t>(row_elements, 1));
  Comparison c;
  std::vector<std::byte> ra, rb;
  for (std::uint64_t r = 0; r < rows; r += block) {
    const std::uint64_t n = std::min(block, rows - r);
    ra.resize(n * a.row_bytes());
    rb.resize(n * b.row_bytes());
    if (a.shape().empty()) {
      a.read_all(ra.data());
      b.read_all(rb.data());
    } else {
      a.read_rows(r, n, ra.data());
      b.read_rows(r, n, rb.data());
    }
    for (std::uint64_t i = 0; i < n * row_elements; ++i) {
      const cd x = h5::element_as_complex(ra.data(), ta, i), y = h5::element_as_complex(rb.data(), tb, i);
      ++c.count;
      if (!std::isfinite(std::abs(x)) || !std::isfinite(std::abs(y))) {
        ++c.nonfinite;
        continue;
      }
      const double d = std::abs(x - y);
      c.diff_sq += d * d;
      c.a_sq += std::norm(x);
      c.b_sq += std::norm(y);
      c.max_abs_diff = std::max(c.max_abs_diff, d);
    }
  }
  return c;
}

struct Params {
  std::optional<double> rtol, atol;  // bounds that fail the step (exit 3); none: only report
  static Params from_json(const json& p) {
    return {params::optional<double>(p, "rtol"), params::optional<double>(p, "atol")};
  }
};

class CompareStage final : public ComputedStage {
 public:
  const StageInfo& info() const override {
    static const StageInfo info{
        "tensor.compare", 1,
        "relative 2-norm error and largest difference of a dataset against a reference; fails past rtol/atol",
        {{"a", "the values to check (float32, float64, complex64 or complex128)"},
         {"b", "the reference, same shape (any of those types)"}},
        "- id: check\n  stage: tensor.compare\n  inputs: {a: amps, b: reference}\n  params: {rtol: 1.0e-5}\n"};
    return info;
  }
  StagePlan plan(const json&, const std::map<std::string, DatasetInfo>& in) const override {
    const Layout &a = in.at("a").layout, &b = in.at("b").layout;
    for (const auto& [slot, d] : in)
      if (!detail::is_float_type(d.layout.dtype))
        throw InputError(fmt::format("input '{}' has dtype {}; expected float32, float64, complex64 or complex128", slot,
                                     h5::dtype_name(d.layout.dtype)));
    // (An empty shape is one an earlier step learns only when it runs: the run checks it then.)
    if (!a.shape.empty() && !b.shape.empty() && a.shape != b.shape)
      throw InputError(fmt::format("input 'a' has shape {} and 'b' {}; expected the same shape",
                                   shape_text(a.shape), shape_text(b.shape)));
    return computed_plan({{"relative_error", {{h5::DType::float64, {}, {}}}}});
  }
  std::unique_ptr<StepRun> start(const StepContext& ctx) const override { return std::make_unique<Run>(ctx); }

 private:
  class Run final : public ComputedRun {
   public:
    using ComputedRun::ComputedRun;
    void compute() override {
      const h5::Dataset &a = *ctx_.inputs.at("a"), &b = *ctx_.inputs.at("b");
      if (a.shape() != b.shape())  // outputs of computed steps get their shapes only when they run
        throw InputError(fmt::format("input 'a' has shape {} and 'b' {}; expected the same shape",
                                     shape_text(a.shape()), shape_text(b.shape())));
      c_ = compare(a, b);
      const Params p = Params::from_json(ctx_.params);
      std::string broken;
      if (c_.nonfinite) broken = fmt::format("{} of {} elements are NaN or infinite", c_.nonfinite, c_.count);
      if (p.rtol && !(c_.relative_error() <= *p.rtol))
        broken = fmt::format("relative error {:.3e} exceeds rtol {:.3e}", c_.relative_error(), *p.rtol);
      if (p.atol && !(c_.max_abs_diff <= *p.atol))
        broken = fmt::format("largest difference {:.3e} exceeds atol {:.3e}", c_.max_abs_diff, *p.atol);
      if (!broken.empty())
        throw CheckFailed(fmt::format("{} (|a| {:.9g}, |b| {:.9g}, {} elements)", broken, std::sqrt(c_.a_sq),
                                      std::sqrt(c_.b_sq), c_.count));
    }
    std::string save() const override {
      Packer out;
      out.put(c_);
      return out.take();
    }
    void load(std::string_view state) override {
      Unpacker in(state);
      c_ = in.get<Comparison>();
      in.finish();
    }
    void write(const StagePlan&, const StepPass&, h5::File& out) const override {
      auto scalar = [&](const char* name, double v, const char* doc) { detail::write_scalar(out, name, h5::DType::float64, &v, doc); };
      scalar("relative_error", c_.relative_error(), "||a - b|| / ||b|| (2-norms over all elements, float64)");
      scalar("max_abs_difference", c_.max_abs_diff, "largest |a - b| over all elements");
      scalar("norm_a", std::sqrt(c_.a_sq), "||a||");
      scalar("norm_b", std::sqrt(c_.b_sq), "||b||");
      out.set_attribute("count", static_cast<std::int64_t>(c_.count));
      const Params p = Params::from_json(ctx_.params);
      if (p.rtol) out.set_attribute("rtol", *p.rtol);
      if (p.atol) out.set_attribute("atol", *p.atol);
    }
    std::string describe(const StagePlan&, const StepPass&) const override {
      const auto rtol = Params::from_json(ctx_.params).rtol;
      return fmt::format("relative error {:.3e}, largest difference {:.3e} over {} elements{}", c_.relative_error(),
                         c_.max_abs_diff, c_.count, rtol ? fmt::format(" (within rtol {:.1e})", *rtol) : "");
    }

   private:
    Comparison c_;
  };
};

}  // namespace

const Stage& tensor_compare() {
  static const CompareStage stage;
  return stage;
}

}  // namespace qstage::stages
