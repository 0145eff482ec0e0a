#include "core/signals.hpp"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace qstage::signals {
namespace {

std::atomic<int> g_stop{0};

void on_signal(int sig) {
  if (g_stop.exchange(sig) != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  static const char msg[] = "qstage: stop requested; finishing the current batch and committing progress "
                            "(send the signal again to abort at once)\n";
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_requested() { return g_stop.load(std::memory_order_relaxed); }

void request_stop(int signal_number) { g_stop.store(signal_number); }

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "signal";
  }
}

}  // namespace qstage::signals
