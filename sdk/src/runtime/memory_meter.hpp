#pragma once
// What a run's steps hold in memory, read from the allocator (AllocationTracker) rather than
// estimated: the bytes live when a step starts, the most a micro-batch's forward allocates and
// keeps (the activations held for backward, whatever the step freed before it), and the step's
// peak with the phase it falls in. The figures
// are the steady state's, from the second step on: the first step also makes the gradients and
// the optimizer's state, which stay. Internal to the SDK library; run.track_memory turns it on.

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/step_phases.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"

namespace trainyard {

struct HeldBytes;

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
  // inherit its state; make it before the model is built.
  explicit MemoryMeter(c10::DeviceType device);

  void step_started();                // before the step's data is read
  void phase_ended(StepPhase phase);  // PhaseClock's mark observer
  StepMemory figures() const;

  // The summary's values: memory_step_{start,peak,activation}_bytes, memory_step_peak_phase
  // (the phase's index, step_phases.hpp), and the line that says them beside `held`.
  std::vector<std::pair<std::string, double>> values() const;
  std::string describe(const HeldBytes& held) const;

 private:
  c10::DeviceType device_;
  AllocationTracker tracker_;
  std::int64_t started_steps_ = 0;
  StepMemory first_;   // the first step's
  StepMemory steady_;  // the later steps'
};

}  // namespace trainyard
