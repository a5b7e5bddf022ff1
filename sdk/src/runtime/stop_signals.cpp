#include "stop_signals.hpp"

#include <signal.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

std::atomic<int> g_received{0};

void on_stop_signal(int signal) {
  int none = 0;
  g_received.compare_exchange_strong(none, signal);
}

}  // namespace

int stop_signal_number(const std::string& name) {
  static const std::pair<const char*, int> kCatchable[] = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGXCPU", SIGXCPU}};
  for (const auto& [known, number] : kCatchable) {
    if (name == known) return number;
  }
  throw Error("run.stop_signals: unknown or uncatchable signal '" + name +
              "' (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU)");
}

StopSignals::StopSignals(const std::vector<int>& signals) : signals_(signals) {
  g_received = 0;
  previous_.resize(signals_.size());
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Interrupted system calls restart: the step in progress finishes, then the run stops.
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    ::sigaction(signals_[i], &action, &previous_[i]);
  }
}

StopSignals::~StopSignals() {
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    ::sigaction(signals_[i], &previous_[i], nullptr);
  }
}

int StopSignals::received() { return g_received.load(); }

}  // namespace trainyard
