#pragma once
// Signals that ask a run to stop at the next step boundary with a checkpoint, rather than end
// at once: what clusters send before they preempt a job (Slurm: SIGTERM, or the signal named by
// --signal, e.g. SIGUSR1, some time before the kill).

#include <signal.h>

#include <string>
#include <vector>

namespace trainyard {

// The signal called `name` ("SIGTERM", "SIGUSR1", ...). Throws Error for an unknown name or one
// that cannot be caught.
int stop_signal_number(const std::string& name);

// Catches `signals` for the lifetime of the object (the previous actions come back with it).
class StopSignals {
 public:
  explicit StopSignals(const std::vector<int>& signals);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first caught signal so far, or 0.
  static int received();

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

}  // namespace trainyard
