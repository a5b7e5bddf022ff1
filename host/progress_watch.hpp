#pragma once
// The launcher's watchdog: from the ranks' heartbeats it tells a rank that froze (its heartbeat
// stopped: SIGSTOP, a debugger, a machine swapping to death) and a group that stopped making
// progress (heartbeats go on, steps do not: a deadlock, a rank stuck in I/O) apart from a slow
// one, without waiting for a collective's time-out.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/runtime/heartbeat.hpp"

namespace trainyard {

struct Hang {
  std::string reason;
  std::vector<int> ranks;  // the ranks to stop: the frozen or stuck ones
};

class ProgressWatch {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressWatch(std::chrono::milliseconds period, int world_size);

  // Feeds the heartbeats read at `now`; a Hang once a rank's heartbeat or the group's steps have
  // not moved for the period. The steps are watched from the first step any rank takes, so
  // start-up (loading data, building the model) is not counted.
  std::optional<Hang> observe(const std::vector<Heartbeat>& beats, Clock::time_point now);

 private:
  std::chrono::milliseconds period_;
  std::vector<Heartbeat> last_;
  std::vector<Clock::time_point> beat_changed_;
  std::optional<Clock::time_point> step_changed_;  // set by the first step taken
};

}  // namespace trainyard
