#include "memory_meter.hpp"

#include <algorithm>
#include <utility>

#include "trainyard/api/held_bytes.hpp"
#include "trainyard/runtime/byte_size.hpp"

namespace trainyard {

MemoryMeter::MemoryMeter(c10::DeviceType device, std::int64_t limit_bytes)
    : device_(device), limit_bytes_(limit_bytes) {
  if (limit_bytes > 0) tracker_.limit_cpu_bytes(limit_bytes);
}

void MemoryMeter::step_started() {
  ++started_steps_;
  last_mark_ = StepPhase::DataWait;
  const std::int64_t start = tracker_.current_bytes(device_);
  tracker_.reset_peak();
  StepMemory& figures = started_steps_ == 1 ? first_ : steady_;
  ++figures.steps;
  figures.start_bytes = std::max(figures.start_bytes, start);
}

void MemoryMeter::phase_ended(StepPhase phase) {
  if (started_steps_ == 0) return;
  last_mark_ = phase;
  StepMemory& figures = started_steps_ == 1 ? first_ : steady_;
  const std::int64_t peak = tracker_.peak_bytes(device_);
  if (peak > figures.peak_bytes) {
    figures.peak_bytes = peak;
    figures.peak_phase = phase;
  }
  if (phase == StepPhase::Forward) {
    figures.activation_bytes =
        std::max(figures.activation_bytes, tracker_.generation_bytes(device_));
  }
  // A forward's activations are what it allocates and keeps: counted from the batch's arrival
  // on the device, or from the previous micro-batch's backward.
  if (phase == StepPhase::HostToDevice || phase == StepPhase::Backward) {
    tracker_.start_generation();
  }
  tracker_.reset_peak();
}

StepMemory MemoryMeter::figures() const { return steady_.steps > 0 ? steady_ : first_; }

std::vector<std::pair<std::string, double>> MemoryMeter::values() const {
  const StepMemory memory = figures();
  return {{"memory_step_start_bytes", static_cast<double>(memory.start_bytes)},
          {"memory_step_peak_bytes", static_cast<double>(memory.peak_bytes)},
          {"memory_step_peak_phase", static_cast<double>(static_cast<int>(memory.peak_phase))},
          {"memory_activation_bytes", static_cast<double>(memory.activation_bytes)}};
}

std::string MemoryMeter::describe(const HeldBytes& held) const {
  const StepMemory memory = figures();
  return "memory by the allocator: peak " + format_mib(memory.peak_bytes) + " in the " +
         step_phase_name(memory.peak_phase) + " phase, " + format_mib(memory.start_bytes) +
         " at a step's start, activations " + format_mib(memory.activation_bytes) +
         "; held: parameters " + format_mib(held.parameters) + ", gradients " +
         format_mib(held.gradients) + ", optimizer state " + format_mib(held.optimizer_state);
}

std::optional<MemoryShortage> MemoryMeter::shortage(int rank, std::int64_t step,
                                                    const HeldBytes& held, bool device_out) const {
  const auto refusal = tracker_.refusal();
  if (!refusal && !device_out) return std::nullopt;
  // Marks end phases: the one in progress is the next.
  static constexpr StepPhase kNext[kStepPhaseCount] = {
      StepPhase::HostToDevice, StepPhase::Forward,   StepPhase::Backward,
      StepPhase::Optimizer,    StepPhase::Optimizer, StepPhase::DataWait};
  MemoryShortage out;
  out.rank = rank;
  out.step = step;
  out.phase = step_phase_name(kNext[static_cast<int>(last_mark_)]);
  out.live_bytes = refusal ? refusal->live : tracker_.current_bytes(device_);
  out.asked_bytes = refusal ? refusal->asked : 0;
  out.limit_bytes = refusal ? limit_bytes_ : 0;
  out.held = held;
  return out;
}

MemoryExhausted::MemoryExhausted(MemoryShortage shortage)
    : Error("rank " + std::to_string(shortage.rank) + " ran out of memory in the " +
            shortage.phase + " phase of step " + std::to_string(shortage.step) + ": " +
            format_mib(shortage.live_bytes) + " held" +
            (shortage.asked_bytes > 0 ? " and " + format_mib(shortage.asked_bytes) + " more asked"
                                      : "") +
            (shortage.limit_bytes > 0
                 ? ", over run.memory_limit (" + format_mib(shortage.limit_bytes) + ")"
                 : "")),
      shortage_(std::move(shortage)) {}

}  // namespace trainyard
