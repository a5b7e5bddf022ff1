#pragma once
// What a run's steps hold in memory, read from the allocator (AllocationTracker) rather than
// estimated: the bytes live when a step starts, the most a micro-batch's forward allocates and
// keeps (the activations held for backward, whatever the step freed before it), and the step's
// peak with the phase it falls in. The figures
// are the steady state's, from the second step on: the first step also makes the gradients and
// the optimizer's state, which stay. Internal to the SDK library; run.track_memory turns it on.

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/step_phases.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"
#include "trainyard/runtime/memory_exhausted.hpp"

namespace trainyard {

struct StepMemory {
  std::int64_t steps = 0;             // steps the figures come from
  std::int64_t start_bytes = 0;       // live when a step starts (the most over the steps)
  std::int64_t activation_bytes = 0;  // the most a micro-batch's forward allocated and kept
  std::int64_t peak_bytes = 0;
  StepPhase peak_phase = StepPhase::Forward;
};

class MemoryMeter {
 public:
  // Counts what is allocated on `device` from now on, by this thread and the threads that
  // inherit its state; make it before the model is built. Host allocations past `limit_bytes`
  // (0: none) fail as a device's do when it runs out.
  MemoryMeter(c10::DeviceType device, std::int64_t limit_bytes);

  void step_started();                // before the step's data is read
  void phase_ended(StepPhase phase);  // PhaseClock's mark observer
  StepMemory figures() const;

  // The summary's values: memory_step_{start,peak,activation}_bytes, memory_step_peak_phase
  // (the phase's index, step_phases.hpp), and the line that says them beside `held`.
  std::vector<std::pair<std::string, double>> values() const;
  std::string describe(const HeldBytes& held) const;

  // After a step failed: what ran out, when the limit refused an allocation or `device_out`
  // (the device's allocator ran out); nullopt otherwise. `held` is the strategy's.
  std::optional<MemoryShortage> shortage(int rank, std::int64_t step, const HeldBytes& held,
                                         bool device_out) const;

 private:
  c10::DeviceType device_;
  AllocationTracker tracker_;
  std::int64_t limit_bytes_;
  std::int64_t started_steps_ = 0;
  StepPhase last_mark_ = StepPhase::Optimizer;
  StepMemory first_;   // the first step's
  StepMemory steady_;  // the later steps'
};

}  // namespace trainyard
