#include "trainyard/step_phases.hpp"

#include <algorithm>

#include "trainyard/device.hpp"
#include "trainyard/error.hpp"

namespace trainyard {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::DataWait: return "data_wait";
    case StepPhase::HostToDevice: return "h2d";
    case StepPhase::Forward: return "forward";
    case StepPhase::Backward: return "backward";
    case StepPhase::CommWait: return "comm_wait";
    case StepPhase::Optimizer: return "optimizer";
  }
  return "unknown";
}

namespace {

// Steady-clock events for a clock without a device backend.
class HostEvent final : public DeviceEvent {
 public:
  void record() override { time_ = std::chrono::steady_clock::now(); }
  double elapsed_ms(const DeviceEvent& later) const override {
    const auto& other = static_cast<const HostEvent&>(later);
    return std::chrono::duration<double, std::milli>(other.time_ - time_).count();
  }

 private:
  std::chrono::steady_clock::time_point time_;
};

double microseconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

}  // namespace

PhaseClock::PhaseClock(DeviceBackend* backend, int device_index, bool keep_spans)
    : backend_(backend), device_index_(device_index), keep_spans_(keep_spans), origin_(Clock::now()) {}

PhaseClock::~PhaseClock() = default;

std::size_t PhaseClock::record_event() {
  if (events_used_ == events_.size()) {
    events_.push_back(backend_ ? backend_->create_event(device_index_)
                               : std::make_unique<HostEvent>());
  }
  events_[events_used_]->record();
  return events_used_++;
}

void PhaseClock::begin_step(std::int64_t step) {
  if (in_step_) throw Error("PhaseClock: begin_step before the previous step ended");
  in_step_ = true;
  Step& current = steps_.emplace_back();
  current.step = step;
  current.begin = Clock::now();
  current.data_ready = current.begin;
  current.first_event = record_event();
}

void PhaseClock::end_data_wait() {
  if (!in_step_) return;
  Step& current = steps_.back();
  current.data_ready = Clock::now();
  // The device timeline of the step starts when its data is on the host.
  current.first_event = record_event();
}

void PhaseClock::mark(StepPhase phase) {
  if (!in_step_) return;  // a strategy driven outside the engine's step loop
  steps_.back().marks.push_back({phase, record_event()});
}

void PhaseClock::end_step() {
  if (!in_step_) return;
  mark(StepPhase::Optimizer);
  in_step_ = false;
}

PhaseRollup PhaseClock::rollup() {
  PhaseRollup rollup;
  // A step still open (its data wait is being timed) stays for the next rollup.
  std::vector<Step> open;
  if (in_step_) {
    open.push_back(std::move(steps_.back()));
    steps_.pop_back();
  }
  for (const Step& step : steps_) {
    ++rollup.steps;
    const double wait_us = microseconds(step.data_ready - step.begin);
    rollup.total_ms[static_cast<int>(StepPhase::DataWait)] += wait_us / 1000.0;
    const double step_start_us = microseconds(step.begin - origin_);
    if (keep_spans_) rollup.spans.push_back({StepPhase::DataWait, step.step, step_start_us, wait_us});
    double at_us = step_start_us + wait_us;
    std::size_t previous = step.first_event;
    for (const Mark& mark : step.marks) {
      const double ms = std::max(0.0, events_[previous]->elapsed_ms(*events_[mark.event]));
      rollup.total_ms[static_cast<int>(mark.phase)] += ms;
      if (keep_spans_) rollup.spans.push_back({mark.phase, step.step, at_us, ms * 1000.0});
      at_us += ms * 1000.0;
      previous = mark.event;
    }
  }
  steps_ = std::move(open);
  if (steps_.empty()) {
    events_used_ = 0;
  } else {
    // Keep the open step's events: move them to the front of the pool.
    Step& step = steps_.front();
    std::size_t next = 0;
    auto adopt = [&](std::size_t& index) {
      std::swap(events_[next], events_[index]);
      index = next++;
    };
    adopt(step.first_event);
    for (Mark& mark : step.marks) adopt(mark.event);
    events_used_ = next;
  }
  return rollup;
}

}  // namespace trainyard
