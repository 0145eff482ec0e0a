#pragma once
// sci.nnqs's network as the run sees it: amplitudes and phases of determinants, and AdamW steps on
// a loss the run computes from them. The network itself (model/wavefunction.hpp) is LibTorch's,
// built into a plugin (libqstage_nnqs.so) that this interface loads when a sci.nnqs step starts,
// so that qstage itself neither links LibTorch nor pays its start-up (over a second and 150 MB).
//
// Both sides are built together, by the same compiler, from this header alone.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qstage::nnqs {

struct NetworkShape {
  int norb = 0, nalpha = 0, nbeta = 0;
  int embedding = 32, layers = 4, heads = 4;
  std::vector<int> phase_hidden = {512, 512, 512};
  double learning_rate = 1e-3, weight_decay = 0;
  std::uint64_t seed = 1;  // the initial weights
  // Where the network runs: -1 the host, else that CUDA device (the run's GPU) when the plugin's
  // LibTorch was built with CUDA; else the host, which where() then says.
  int cuda_device = -1;
  // On a GPU, the most device memory the network's library may hold (its allocator is capped
  // there, so a batch that needs more fails instead of taking the run's memory); 0: no cap.
  std::uint64_t device_memory = 0;
  // A TorchScript module (torch.jit.save) to train instead of the built-in network, with its own
  // weights: forward(x) of x (batch, 2 norb) float64 occupations returns (log |psi|, phi), each
  // (batch,). Empty: the built-in network of the sizes above.
  std::string model_file;
};

// One named parameter tensor of the network, row-major (its values as float64).
struct NamedWeights {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<double> values;
};

// Occupations, n rows of 2 norb bytes (0 or 1): spin orbital 2p is orbital p's alpha, 2p + 1 its
// beta (Dice's numbering, as the `occupation` parameter).
struct Occupations {
  const std::uint8_t* bits = nullptr;
  std::uint64_t rows = 0;
};

class Network {
 public:
  virtual ~Network() = default;
  virtual std::int64_t parameters() const = 0;
  // Where it runs and on what, for the log and the output: "cuda:0 (LibTorch 2.11.0)".
  virtual std::string where() const = 0;
  // The most device memory the network's library held so far (its allocator's peak); 0 on the host.
  virtual std::uint64_t peak_device_bytes() const = 0;
  // log |psi| and phi of each row, no gradient kept (rows at a time as the caller batches them).
  virtual void evaluate(const Occupations& x, double* log_amplitude, double* phase) = 0;
  // The gradient over the parameters of sum_i (d_log_amplitude[i] log |psi(x_i)| + d_phase[i] phi(x_i))
  // over x's rows, into `out` (parameters() values, in the network's order): a loss's gradient
  // once the run has turned dL/dpsi into dL/d(log |psi|) and dL/dphi. The sum over the rows is the
  // network's own, so the same rows give the same bits; the run folds such pieces in a fixed tree.
  virtual void gradient(const Occupations& x, const double* d_log_amplitude, const double* d_phase, double* out) = 0;
  // One AdamW step taking `gradient` (parameters() values) as the loss's gradient.
  virtual void step(const double* gradient) = 0;
  // The parameters and AdamW's state, bit for bit.
  virtual std::string save() const = 0;
  virtual void load(std::string_view state) = 0;
  // The parameters by name, in the network's order (written with the output for h5py).
  virtual std::vector<NamedWeights> weights() const = 0;
};

// What evaluate, gradient and step throw when a batch needs more device memory than
// NetworkShape::device_memory (make_network's network throws qstage's BudgetExceeded instead).
class NetworkMemoryExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The plugin's network of `shape`: the built-in one, its weights drawn from shape.seed, or
// shape.model_file's. Throws InputError when the plugin cannot be loaded (a build without
// LibTorch, or LibTorch missing where it runs) or the model file is not a usable module. Its
// calls throw BudgetExceeded where the plugin's throw NetworkMemoryExceeded.
std::unique_ptr<Network> make_network(const NetworkShape& shape);
// Where the plugin is looked for, and whether it is there (the stage's plan checks this).
std::string plugin_path();
bool plugin_present();

// The plugin's entry point.
extern "C" {
using MakeNetworkFn = Network* (*)(const NetworkShape* shape, std::string* error);
}
inline constexpr const char* kMakeNetworkSymbol = "qstage_nnqs_make_network";

}  // namespace qstage::nnqs
