#pragma once
// Where a training step's time goes: data wait, host-to-device copy, forward, backward,
// communication wait and optimizer, timed without a device sync per step.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

namespace trainyard {

class DeviceBackend;
class DeviceEvent;

enum class StepPhase : int { DataWait, HostToDevice, Forward, Backward, CommWait, Optimizer };
inline constexpr int kStepPhaseCount = 6;

// "data_wait", "h2d", "forward", "backward", "comm_wait", "optimizer".
const char* step_phase_name(StepPhase phase);

// One phase of one step, for traces. Times are microseconds since the clock was made.
struct PhaseSpan {
  StepPhase phase = StepPhase::DataWait;
  std::int64_t step = 0;
  double start_us = 0;
  double duration_us = 0;
};

// The phases of the steps since the last rollup.
struct PhaseRollup {
  std::int64_t steps = 0;
  std::array<double, kStepPhaseCount> total_ms{};  // summed over the steps
  std::vector<PhaseSpan> spans;                    // in order; empty unless spans were kept

  double at(StepPhase phase) const { return total_ms[static_cast<int>(phase)]; }
};

// What bounds a run whose steps took `total_ms` per phase over `steps` steps of
// `step_time_ms` each: a line with the breakdown, then a line naming the bottleneck (data-,
// communication-, copy- or compute-bound) and what to try, after the seeds' self-check table.
// A compute-bound run is told to try `faster_precision` only when there is one (see below).
std::vector<std::string> describe_bottleneck(const std::array<double, kStepPhaseCount>& total_ms,
                                             std::int64_t steps, double step_time_ms,
                                             const std::optional<std::string>& faster_precision);

// The precision plugin worth suggesting to a compute-bound run on a device that computes
// `fast_dtypes` natively at full speed (DeviceBackend::fast_compute_dtypes): "bf16" when the
// device is fast in bfloat16, else "fp16" when fast in float16; none when the run already
// autocasts (`run_autocast`) or the device would only emulate half precision, which is slower.
std::optional<std::string> faster_precision(const std::vector<c10::ScalarType>& fast_dtypes,
                                            std::optional<c10::ScalarType> run_autocast);

// The engine's clock of step phases. A step is a sequence of marks: the time between one mark
// and the next belongs to the phase the later mark names. Data wait is host time (the host is
// what waits); every other phase is measured between device events, so on an asynchronous
// device it is the device's time, read once per rollup instead of synchronising every step.
// On the host device the events are steady-clock readings and the phases add up to the step.
//
// Strategies mark what only they can see: mark(Forward) when a micro-batch's forward ends,
// mark(Backward) when its backward has been issued, mark(CommWait) after waiting on
// communication. The engine marks the rest and ends the step; whatever follows the strategy's
// last mark (the optimizer step, gradient clipping, precision updates) counts as Optimizer.
class PhaseClock {
 public:
  // `backend` null: host clock only. Spans (for traces) are kept only when asked.
  PhaseClock(DeviceBackend* backend, int device_index, bool keep_spans);
  void keep_spans(bool keep) { keep_spans_ = keep; }
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  void begin_step(std::int64_t step);  // the step starts waiting for its data
  void end_data_wait();                // its data is on the host
  void cancel_step();                  // no data came: the step does not happen
  void mark(StepPhase phase);          // the time since the previous mark was `phase`
  void end_step();                     // the rest of the step was the optimizer's
  // Called on the marking thread after every mark of a timed step with the phase that just
  // ended: where the engine's memory meter reads the allocator, so that a peak is attributed to
  // the phase it happened in.
  void on_mark(std::function<void(StepPhase)> observer);

  // The phases of the steps ended since the last rollup; waits for their device events.
  PhaseRollup rollup();

 private:
  using Clock = std::chrono::steady_clock;
  struct Mark {
    StepPhase phase;
    std::size_t event;  // index into events_
  };
  struct Step {
    std::int64_t step = 0;
    Clock::time_point begin;
    Clock::time_point data_ready;
    std::size_t first_event = 0;  // recorded at data_ready
    std::vector<Mark> marks;
  };
  std::size_t record_event();

  DeviceBackend* backend_;
  int device_index_;
  bool keep_spans_;
  Clock::time_point origin_;
  // Events are pooled: an interval reuses the previous interval's events once they are read.
  std::vector<std::shared_ptr<DeviceEvent>> events_;
  std::size_t events_used_ = 0;
  std::vector<Step> steps_;
  bool in_step_ = false;
  bool data_ready_ = false;
  std::function<void(StepPhase)> observer_;
};

}  // namespace trainyard
