// The network's two decoders agree: LibTorch's TransformerEncoder module and the same layers written
// out (wavefunction.hpp says why there are two), in values and in every parameter's gradient, on the
// host and, where this LibTorch has CUDA, on the GPU; and the GPU's forward pass (written out) gives
// the host's (the module) for the same weights. Exit 0 when all agree, 1 with the first mismatch.
//
//   qstage_nnqs_model_check            # ctest runs it where the build has LibTorch
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "stages/nnqs/model/wavefunction.hpp"

namespace {

using qstage::nnqs::Wavefunction;
using Decoder = qstage::nnqs::WavefunctionImpl::Decoder;

int failures = 0;

// |a - b| / max(1, |b|) at its largest.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs() / b.abs().clamp_min(1.0)).max().item<double>();
}

// A line for a comparison, failed where `error` exceeds `tolerance`.
void expect_within(double error, double tolerance, const std::string& what) {
  const bool ok = error <= tolerance;
  std::printf("%s %s: largest relative difference %.3g (at most %.3g)\n", ok ? "ok  " : "FAIL", what.c_str(), error, tolerance);
  failures += ok ? 0 : 1;
}

qstage::nnqs::NetworkShape small_shape() {
  qstage::nnqs::NetworkShape shape;
  shape.norb = 10, shape.nalpha = 3, shape.nbeta = 2;
  shape.embedding = 16, shape.layers = 2, shape.heads = 4, shape.phase_hidden = {32, 32};
  return shape;
}

// Determinants of the shape's electrons, orbitals drawn at random (occupations as the network reads them).
torch::Tensor determinants(const qstage::nnqs::NetworkShape& shape, std::int64_t rows) {
  torch::Tensor x = torch::zeros({rows, 2 * shape.norb}, torch::kFloat64);
  for (std::int64_t r = 0; r < rows; ++r) {
    const torch::Tensor alpha = torch::randperm(shape.norb).narrow(0, 0, shape.nalpha);
    const torch::Tensor beta = torch::randperm(shape.norb).narrow(0, 0, shape.nbeta);
    for (std::int64_t i = 0; i < shape.nalpha; ++i) x[r][2 * alpha[i].item<std::int64_t>()] = 1.0;
    for (std::int64_t i = 0; i < shape.nbeta; ++i) x[r][2 * beta[i].item<std::int64_t>() + 1] = 1.0;
  }
  return x;
}

// Both decoders on `device`: the values, then each parameter's gradient of a weighted sum of them.
void compare_decoders(torch::Device device) {
  const qstage::nnqs::NetworkShape shape = small_shape();
  torch::manual_seed(3);
  Wavefunction net(shape);
  net->to(device, torch::kFloat64);
  const torch::Tensor h = torch::randn({37, shape.norb, shape.embedding}, torch::kFloat64).to(device);
  const torch::Tensor weights = torch::randn({37, shape.norb, shape.embedding}, torch::kFloat64).to(device);
  std::vector<torch::Tensor> values;
  std::vector<std::pair<std::string, torch::Tensor>> gradients[2];
  for (const Decoder how : {Decoder::module, Decoder::written_out}) {
    net->zero_grad();
    const torch::Tensor out = net->decode(h, how);
    (out * weights).sum().backward();
    values.push_back(out.detach());
    for (const auto& p : net->named_parameters())
      if (p.value().grad().defined()) gradients[values.size() - 1].emplace_back(p.key(), p.value().grad().clone());
  }
  const std::string where = device.str();
  expect_within(relative_difference(values[1], values[0]), 1e-12, where + " decoder values, written out against the module");
  if (gradients[0].size() != gradients[1].size() || gradients[0].empty()) {
    std::printf("FAIL %s: %zu parameters have gradients through the module, %zu written out\n", where.c_str(),
                gradients[0].size(), gradients[1].size());
    ++failures;
    return;
  }
  double largest = 0;
  std::string worst;
  for (std::size_t i = 0; i < gradients[0].size(); ++i) {
    const double error = relative_difference(gradients[1][i].second, gradients[0][i].second);
    if (error >= largest) largest = error, worst = gradients[0][i].first;
  }
  expect_within(largest, 1e-10, where + " gradients of " + std::to_string(gradients[0].size()) + " parameters (the worst: " + worst + ")");
}

}  // namespace

int main() {
  torch::manual_seed(1);
  compare_decoders(torch::kCPU);
  if (torch::cuda::is_available()) {
    compare_decoders(torch::Device(torch::kCUDA, 0));
    // The whole network: the host's forward (the module) against the GPU's (written out).
    const qstage::nnqs::NetworkShape shape = small_shape();
    torch::manual_seed(5);
    Wavefunction net(shape);
    net->to(torch::kFloat64);
    const torch::Tensor x = determinants(shape, 53);
    torch::NoGradGuard no_grad;
    const auto [host_amplitude, host_phase] = net->forward(x);
    net->to(torch::Device(torch::kCUDA, 0));
    const auto [gpu_amplitude, gpu_phase] = net->forward(x.to(torch::Device(torch::kCUDA, 0)));
    expect_within(relative_difference(gpu_amplitude.cpu(), host_amplitude), 1e-12, "log |psi|, GPU against host");
    expect_within(relative_difference(gpu_phase.cpu(), host_phase), 1e-12, "phase, GPU against host");
  } else {
    std::printf("skip the GPU comparisons: this LibTorch has no CUDA device\n");
  }
  if (failures) std::printf("%d comparisons failed\n", failures);
  return failures ? 1 : 0;
}
