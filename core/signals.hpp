#pragma once
// Cooperative stop on SIGTERM/SIGINT. The handler only sets a flag; the streaming engine reads
// it at every batch boundary, all ranks agree, commit, and exit with code 75. A second signal
// restores the default action, so pressing Ctrl-C twice stops at once.
namespace qstage::signals {

void install_stop_handlers();
// The signal number that asked us to stop, or 0.
int stop_requested();
// For tests: pretend a signal arrived.
void request_stop(int signal_number);
const char* signal_name(int signal_number);

}  // namespace qstage::signals
