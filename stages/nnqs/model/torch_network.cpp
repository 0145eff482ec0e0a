// The plugin's side of stages/nnqs/network.hpp: the network on LibTorch, float64, on the run's GPU
// when LibTorch has CUDA (else on the host), AdamW from torch::optim. Built into libqstage_nnqs.so
// only; it sees nothing of qstage but that header.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include "stages/nnqs/model/wavefunction.hpp"
#include "stages/nnqs/network.hpp"

#ifdef QSTAGE_NNQS_CUDA  // (a LibTorch with CUDA: its allocator, to cap and to read)
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace qstage::nnqs {
namespace {

// Where the network runs: the GPU the run asked for if this LibTorch has CUDA, else the host.
// On the GPU every kernel is asked to be deterministic (cuBLAS with a fixed workspace: set
// before LibTorch's first cuBLAS call), so that a run repeated, or resumed, gives the same bits.
torch::Device device_for(const NetworkShape& shape) {
  if (shape.cuda_device < 0 || !torch::cuda::is_available()) return torch::kCPU;
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(shape.cuda_device)};
}

// What the network trains: the built-in Wavefunction, or a user's TorchScript module of the same
// interface. Either gives (log |psi|, phi) of occupations and its parameters by name.
class Model {
 public:
  virtual ~Model() = default;
  virtual std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& occupations) = 0;
  virtual std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const = 0;
};

class BuiltinModel final : public Model {
 public:
  BuiltinModel(const NetworkShape& shape, torch::Device device) {
    torch::manual_seed(shape.seed);  // (the initial weights, drawn on the host: the same on any device)
    module_ = Wavefunction(shape);
    module_->to(device, torch::kFloat64);
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& occupations) override {
    return module_->forward(occupations);
  }
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : module_->named_parameters()) out.emplace_back(p.key(), p.value());
    return out;
  }

 private:
  Wavefunction module_{nullptr};
};

// The first line of a LibTorch error (its messages run on with C++ and Python stacks).
std::string first_line(const std::exception& e) {
  const c10::Error* torch_error = dynamic_cast<const c10::Error*>(&e);
  const std::string what = torch_error ? torch_error->what_without_backtrace() : e.what();
  std::string line = what.substr(0, what.find('\n'));
  return line.empty() ? "(no message)" : line;
}

class ScriptModel final : public Model {
 public:
  ScriptModel(const NetworkShape& shape, torch::Device device) : file_(shape.model_file), device_(device) {
    try {
      module_ = torch::jit::load(file_, device);
    } catch (const std::exception& e) {
      throw std::runtime_error("model_file '" + file_ + "' could not be read as a TorchScript module (" + first_line(e) +
                               "); expected a file written by torch.jit.save");
    }
    module_.to(device, torch::kFloat64);
    module_.train();
    if (named_parameters().empty())
      throw std::runtime_error("model_file '" + file_ + "' has no parameters to train; expected a module with parameters");
    check_interface(shape);
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& occupations) override {
    const c10::IValue out = module_.forward({occupations});
    if (!out.isTuple() || out.toTuple()->elements().size() != 2 || !out.toTuple()->elements()[0].isTensor() ||
        !out.toTuple()->elements()[1].isTensor())
      throw std::runtime_error("model_file '" + file_ + "' returned " + out.tagKind() +
                               "; expected a pair of tensors (log |psi|, phase)");
    const auto& pair = out.toTuple()->elements();
    return {pair[0].toTensor().reshape({-1}), pair[1].toTensor().reshape({-1})};
  }
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }

 private:
  // One determinant (the first orbitals filled) through forward: a module of another input width
  // or another output fails here, once, with one line, not inside the first step.
  void check_interface(const NetworkShape& shape) {
    const std::int64_t width = 2 * shape.norb;
    torch::Tensor x = torch::zeros({2, width}, torch::TensorOptions(torch::kFloat64).device(device_));
    for (int p = 0; p < shape.nalpha; ++p) x.index_put_({torch::indexing::Slice(), 2 * p}, 1.0);
    for (int p = 0; p < shape.nbeta; ++p) x.index_put_({torch::indexing::Slice(), 2 * p + 1}, 1.0);
    std::pair<torch::Tensor, torch::Tensor> out;
    try {
      torch::NoGradGuard no_grad;
      out = forward(x);
    } catch (const std::exception& e) {
      throw std::runtime_error("model_file '" + file_ + "' does not take this FCIDUMP's occupations, a (batch, 2 NORB = " +
                               std::to_string(width) + ") float64 tensor: " + first_line(e));
    }
    for (const torch::Tensor& t : {out.first, out.second})
      if (t.numel() != 2 || t.scalar_type() != torch::kFloat64)
        throw std::runtime_error("model_file '" + file_ + "' returned " + std::to_string(t.numel()) + " " +
                                 std::string(c10::toString(t.scalar_type())) + " values for 2 determinants; expected " +
                                 "(log |psi|, phase), one float64 each a determinant");
  }

  std::string file_;
  torch::Device device_;
  mutable torch::jit::Module module_;
};

class TorchNetwork final : public Network {
 public:
  explicit TorchNetwork(const NetworkShape& shape) : shape_(shape), device_(device_for(shape)) {
    if (shape.model_file.empty()) model_ = std::make_unique<BuiltinModel>(shape, device_);
    else model_ = std::make_unique<ScriptModel>(shape, device_);
    for (const auto& [name, p] : model_->named_parameters()) parameters_.push_back(p);
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        parameters_, torch::optim::AdamWOptions(shape.learning_rate).weight_decay(shape.weight_decay));
    cap_device_memory();
  }
  std::int64_t parameters() const override {
    std::int64_t n = 0;
    for (const auto& p : parameters_) n += p.numel();
    return n;
  }
  std::string where() const override { return device_.str() + " (LibTorch " + TORCH_VERSION + ")"; }
  std::uint64_t peak_device_bytes() const override {
#ifdef QSTAGE_NNQS_CUDA
    if (device_.is_cuda())  // (index 0 of the stat arrays: every pool together)
      return static_cast<std::uint64_t>(c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index()).reserved_bytes[0].peak);
#endif
    return 0;
  }
  void evaluate(const Occupations& x, double* log_amplitude, double* phase) override {
    within_cap([&] {
      torch::InferenceMode values_only;  // (no autograd records at all, which no_grad still keeps)
      const auto [a, f] = model_->forward(tensor(x));
      const torch::Tensor both = host(torch::stack({a, f}));  // (one copy back, not two)
      std::copy_n(both.data_ptr<double>(), x.rows, log_amplitude);
      std::copy_n(both.data_ptr<double>() + x.rows, x.rows, phase);
    });
  }
  void gradient(const Occupations& x, const double* d_log_amplitude, const double* d_phase, double* out) override {
    within_cap([&] {
      const auto [log_amplitude, phase] = model_->forward(tensor(x));
      backward(log_amplitude, phase, d_log_amplitude, d_phase, out);
    });
  }
  void step(const double* gradient) override {
    within_cap([&] {
      // (one copy to the device, then each parameter's gradient a view of it)
      const torch::Tensor all =
          torch::from_blob(const_cast<double*>(gradient), {parameters()}, torch::kFloat64).to(device_, false, true);
      std::int64_t at = 0;
      for (auto& p : parameters_) {
        p.mutable_grad() = all.narrow(0, at, p.numel()).view(p.sizes());
        at += p.numel();
      }
      optimizer_->step();
    });
  }
  std::string save() const override {
    return archive([&](torch::serialize::OutputArchive& a) {
             for (const auto& [name, p] : model_->named_parameters()) a.write(name, p);
           }) +
           archive([&](torch::serialize::OutputArchive& a) { optimizer_->save(a); });
  }
  void load(std::string_view state) override {
    // (two archives, each a zip whose size leads it in 8 bytes)
    std::string_view rest = state;
    unarchive(rest, [&](torch::serialize::InputArchive& a) {
      torch::NoGradGuard no_grad;
      for (auto& [name, p] : model_->named_parameters()) {
        torch::Tensor saved;
        a.read(name, saved);
        p.copy_(saved);
      }
    });
    unarchive(rest, [&](torch::serialize::InputArchive& a) { optimizer_->load(a); });
  }
  std::vector<NamedWeights> weights() const override {
    std::vector<NamedWeights> out;
    for (const auto& [name, p] : model_->named_parameters()) {
      const torch::Tensor t = host(p.detach());
      NamedWeights w{name, {}, std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel())};
      for (const std::int64_t d : t.sizes()) w.shape.push_back(static_cast<std::uint64_t>(d));
      out.push_back(std::move(w));
    }
    return out;
  }

 private:
  // The gradient over the parameters of sum_i d_log_amplitude[i] log_amplitude[i] + d_phase[i]
  // phase[i] through their graph, into `out` (every parameter's, in order: one copy to the host).
  void backward(const torch::Tensor& log_amplitude, const torch::Tensor& phase, const double* d_log_amplitude,
                const double* d_phase, double* out) {
    const std::int64_t rows = log_amplitude.size(0);
    const auto weights = [&](const double* d) {
      return torch::from_blob(const_cast<double*>(d), {rows}, torch::kFloat64).to(device_);
    };
    for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
    ((log_amplitude * weights(d_log_amplitude)).sum() + (phase * weights(d_phase)).sum()).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : parameters_)  // (zeros for a parameter the loss does not reach)
      grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
    const torch::Tensor all = host(torch::cat(grads));
    std::copy_n(all.data_ptr<double>(), all.numel(), out);
  }
  // LibTorch's allocator on the network's GPU held to shape.device_memory (once the network's first
  // tensors made it), and its refusals as NetworkMemoryExceeded.
  void cap_device_memory() {
#ifdef QSTAGE_NNQS_CUDA
    if (!device_.is_cuda() || shape_.device_memory == 0) return;
    std::size_t free = 0, total = 0;
    if (cudaSetDevice(device_.index()) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess || total == 0)
      throw std::runtime_error("the network's GPU " + device_.str() + " did not say how much memory it has");
    const double fraction = std::min(1.0, static_cast<double>(shape_.device_memory) / static_cast<double>(total));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device_.index());
#endif
  }
  template <class Call>
  static void within_cap(Call&& call) {
#ifdef QSTAGE_NNQS_CUDA
    try {
      call();
    } catch (const c10::OutOfMemoryError& e) {
      throw NetworkMemoryExceeded(first_line(e));
    }
#else
    call();
#endif
  }
  // Occupations as the network reads them: bytes to the device, float64 there.
  torch::Tensor tensor(const Occupations& x) const {
    const std::int64_t width = 2 * shape_.norb;
    return torch::from_blob(const_cast<std::uint8_t*>(x.bits), {static_cast<std::int64_t>(x.rows), width}, torch::kUInt8)
        .to(device_)
        .to(torch::kFloat64);
  }
  // A tensor's values as contiguous float64 on the host.
  static torch::Tensor host(const torch::Tensor& t) { return t.to(torch::kCPU, torch::kFloat64).contiguous(); }
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
    if (state.size() < 8) throw std::runtime_error("the network's saved state is cut short");
    std::memcpy(&size, state.data(), 8);
    if (state.size() - 8 < size) throw std::runtime_error("the network's saved state is cut short");
    std::istringstream is(std::string(state.substr(8, size)));
    state.remove_prefix(8 + size);
    torch::serialize::InputArchive archive;
    archive.load_from(is);
    load(archive);
  }

  NetworkShape shape_;
  torch::Device device_;
  std::unique_ptr<Model> model_;
  std::vector<torch::Tensor> parameters_;  // (the model's, in its order: AdamW's state follows it)
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

}  // namespace
}  // namespace qstage::nnqs

extern "C" qstage::nnqs::Network* qstage_nnqs_make_network(const qstage::nnqs::NetworkShape* shape, std::string* error) {
  try {
    return new qstage::nnqs::TorchNetwork(*shape);
  } catch (const std::exception& e) {
    *error = qstage::nnqs::first_line(e);
    return nullptr;
  }
}
