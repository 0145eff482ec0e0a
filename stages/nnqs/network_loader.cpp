// Loading sci.nnqs's network plugin (network.hpp says why it is one).
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.hpp"
#include "core/units.hpp"
#include "stages/nnqs/network.hpp"

namespace qstage::nnqs {

namespace {
constexpr const char* kPlugin = "libqstage_nnqs.so";

// The plugin's network, its refusals for memory as qstage's budget errors: a batch that needs more
// device memory than the network's share fails the step as any budget does, with one line.
class BudgetedNetwork final : public Network {
 public:
  BudgetedNetwork(std::unique_ptr<Network> network, std::uint64_t share) : network_(std::move(network)), share_(share) {}
  std::int64_t parameters() const override { return network_->parameters(); }
  std::string where() const override { return network_->where(); }
  std::uint64_t peak_device_bytes() const override { return network_->peak_device_bytes(); }
  void evaluate(const Occupations& x, double* log_amplitude, double* phase) override {
    budgeted([&] { network_->evaluate(x, log_amplitude, phase); }, "inferring", x.rows);
  }
  void gradient(const Occupations& x, const double* d_log_amplitude, const double* d_phase, double* out) override {
    budgeted([&] { network_->gradient(x, d_log_amplitude, d_phase, out); }, "training on", x.rows);
  }
  void step(const double* gradient) override {
    budgeted([&] { network_->step(gradient); }, "stepping after", 0);
  }
  std::string save() const override { return network_->save(); }
  void load(std::string_view state) override { network_->load(state); }
  std::vector<NamedWeights> weights() const override { return network_->weights(); }

 private:
  template <class Call>
  void budgeted(Call&& call, const char* doing, std::uint64_t rows) {
    try {
      call();
    } catch (const NetworkMemoryExceeded& e) {
      throw BudgetExceeded(fmt::format("sci.nnqs: the network ran out of its {} of device memory {} {} rows ({}); "
                                       "expected smaller batches (train_batch, inference_batch) or a larger device_memory",
                                       format_bytes(static_cast<double>(share_)), doing, rows, e.what()),
                           "device");
    }
  }
  std::unique_ptr<Network> network_;
  std::uint64_t share_;
};
}  // namespace

// QSTAGE_NNQS_PLUGIN if set; else beside the executable (a build tree), else in ../lib/qstage
// from it (an install).
std::string plugin_path() {
  if (const char* set = std::getenv("QSTAGE_NNQS_PLUGIN"); set && *set) return set;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return kPlugin;
  const std::filesystem::path beside = exe.parent_path() / kPlugin;
  if (std::filesystem::exists(beside)) return beside.string();
  return (exe.parent_path().parent_path() / "lib" / "qstage" / kPlugin).string();
}

bool plugin_present() { return std::filesystem::exists(plugin_path()); }

std::unique_ptr<Network> make_network(const NetworkShape& shape) {
  // Loaded once and never unloaded (LibTorch's threads and registries outlive any step).
  static std::mutex mutex;
  static MakeNetworkFn make = nullptr;
  const std::lock_guard lock(mutex);
  if (!make) {
    const std::string path = plugin_path();
    if (!std::filesystem::exists(path))
      throw InputError(fmt::format("stage 'sci.nnqs' needs its LibTorch plugin, and {} does not exist; expected a build "
                                   "that found LibTorch (install Debian's libtorch-dev, then scripts/setup.sh)", path));
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!handle)
      throw InputError(fmt::format("stage 'sci.nnqs' could not load its LibTorch plugin {}: {}; expected LibTorch where "
                                   "qstage runs (Debian's libtorch-dev)", path, dlerror()));
    make = reinterpret_cast<MakeNetworkFn>(dlsym(handle, kMakeNetworkSymbol));
    if (!make) throw InputError(fmt::format("{} has no {}: not qstage's sci.nnqs plugin", path, kMakeNetworkSymbol));
    spdlog::debug("sci.nnqs: network plugin {}", path);
  }
  std::string error;
  Network* network = make(&shape, &error);
  if (!network) throw InputError(fmt::format("sci.nnqs: the network could not be made: {}", error));
  return std::make_unique<BudgetedNetwork>(std::unique_ptr<Network>(network), shape.device_memory);
}

}  // namespace qstage::nnqs
