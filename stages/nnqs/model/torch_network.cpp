// The plugin's side of stages/nnqs/network.hpp: the network on LibTorch, float64 on the host,
// AdamW from torch::optim. Built into libqstage_nnqs.so only; it sees nothing of qstage but that
// header.
#include <torch/torch.h>

#include <cstring>
#include <exception>
#include <sstream>

#include "stages/nnqs/network.hpp"
#include "stages/nnqs/model/wavefunction.hpp"

namespace qstage::nnqs {
namespace {

class TorchNetwork final : public Network {
 public:
  explicit TorchNetwork(const NetworkShape& shape) : shape_(shape) {
    torch::manual_seed(shape.seed);  // (the initial weights)
    model_ = Wavefunction(shape);
    model_->to(torch::kFloat64);
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        model_->parameters(), torch::optim::AdamWOptions(shape.learning_rate).weight_decay(shape.weight_decay));
  }
  std::int64_t parameters() const override {
    std::int64_t n = 0;
    for (const auto& p : model_->parameters()) n += p.numel();
    return n;
  }
  void evaluate(const Occupations& x, double* log_amplitude, double* phase) override {
    torch::NoGradGuard no_grad;
    const auto [a, f] = model_->forward(tensor(x));
    std::copy_n(a.contiguous().data_ptr<double>(), x.rows, log_amplitude);
    std::copy_n(f.contiguous().data_ptr<double>(), x.rows, phase);
  }
  void step(const Occupations& x, const Gradient& gradient) override {
    const auto [log_amplitude, phase] = model_->forward(tensor(x));
    const torch::Tensor a = torch::exp(log_amplitude - log_amplitude.max().detach());
    const torch::Tensor psi = torch::cat({a * torch::cos(phase), a * torch::sin(phase)});
    const torch::Tensor values = psi.detach().contiguous();
    std::vector<double> g = gradient(std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + values.numel()));
    optimizer_->zero_grad();
    psi.backward(torch::from_blob(g.data(), {static_cast<std::int64_t>(g.size())}, torch::kFloat64));
    optimizer_->step();
  }
  std::string save() const override {
    return archive([&](torch::serialize::OutputArchive& a) { model_->save(a); }) +
           archive([&](torch::serialize::OutputArchive& a) { optimizer_->save(a); });
  }
  void load(std::string_view state) override {
    // (two archives, each a zip whose size leads it in 8 bytes)
    std::string_view rest = state;
    unarchive(rest, [&](torch::serialize::InputArchive& a) { model_->load(a); });
    unarchive(rest, [&](torch::serialize::InputArchive& a) { optimizer_->load(a); });
  }

 private:
  torch::Tensor tensor(const Occupations& x) const {
    const std::int64_t width = 2 * shape_.norb;
    return torch::from_blob(const_cast<std::uint8_t*>(x.bits), {static_cast<std::int64_t>(x.rows), width}, torch::kUInt8)
        .to(torch::kFloat64);
  }
  static std::string archive(const std::function<void(torch::serialize::OutputArchive&)>& save) {
    torch::serialize::OutputArchive archive;
    save(archive);
    std::ostringstream os;
    archive.save_to(os);
    const std::string bytes = os.str();
    const std::uint64_t size = bytes.size();
    return std::string(reinterpret_cast<const char*>(&size), 8) + bytes;
  }
  static void unarchive(std::string_view& state, const std::function<void(torch::serialize::InputArchive&)>& load) {
    std::uint64_t size = 0;
    if (state.size() < 8) throw std::runtime_error("sci.nnqs: the network's saved state is cut short");
    std::memcpy(&size, state.data(), 8);
    if (state.size() - 8 < size) throw std::runtime_error("sci.nnqs: the network's saved state is cut short");
    std::istringstream is(std::string(state.substr(8, size)));
    state.remove_prefix(8 + size);
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    load(archive);
  }

  NetworkShape shape_;
  Wavefunction model_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace
}  // namespace qstage::nnqs

extern "C" qstage::nnqs::Network* qstage_nnqs_make_network(const qstage::nnqs::NetworkShape* shape, std::string* error) {
  try {
    return new qstage::nnqs::TorchNetwork(*shape);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
