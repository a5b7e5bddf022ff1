#include "trainyard/api/step_phases.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::DataWait:
      return "data_wait";
    case StepPhase::HostToDevice:
      return "h2d";
    case StepPhase::Forward:
      return "forward";
    case StepPhase::Backward:
      return "backward";
    case StepPhase::CommWait:
      return "comm_wait";
    case StepPhase::Optimizer:
      return "optimizer";
  }
  return "unknown";
}

namespace {

double microseconds(std::chrono::steady_clock::duration duration) {
  return std::chrono::duration<double, std::micro>(duration).count();
}

}  // namespace

PhaseClock::PhaseClock(DeviceBackend* backend, int device_index, bool keep_spans)
    : backend_(backend),
      device_index_(device_index),
      keep_spans_(keep_spans),
      origin_(Clock::now()) {}

PhaseClock::~PhaseClock() = default;

std::size_t PhaseClock::record_event() {
  if (events_used_ == events_.size()) {
    events_.push_back(backend_ ? backend_->create_event(device_index_)
                               : std::shared_ptr<DeviceEvent>(std::make_shared<HostClockEvent>()));
  }
  events_[events_used_]->record();
  return events_used_++;
}

void PhaseClock::begin_step(std::int64_t step) {
  if (in_step_) throw Error("PhaseClock: begin_step before the previous step ended");
  in_step_ = true;
  data_ready_ = false;
  Step& current = steps_.emplace_back();
  current.step = step;
  current.begin = Clock::now();
  current.data_ready = current.begin;
}

void PhaseClock::end_data_wait() {
  if (!in_step_) return;
  Step& current = steps_.back();
  current.data_ready = Clock::now();
  // The device timeline of the step starts when its data is on the host.
  current.first_event = record_event();
  data_ready_ = true;
}

void PhaseClock::cancel_step() {
  if (!in_step_) return;
  in_step_ = false;
  steps_.pop_back();
}

void PhaseClock::mark(StepPhase phase) {
  // Outside the engine's step loop (a strategy driven directly) nothing is timed.
  if (!in_step_ || !data_ready_) return;
  steps_.back().marks.push_back({phase, record_event()});
  if (observer_) observer_(phase);
}

void PhaseClock::on_mark(std::function<void(StepPhase)> observer) { observer_ = std::move(observer); }

void PhaseClock::end_step() {
  if (!in_step_) return;
  if (!data_ready_) end_data_wait();
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
    if (keep_spans_)
      rollup.spans.push_back({StepPhase::DataWait, step.step, step_start_us, wait_us});
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
  if (steps_.empty() || !data_ready_) {
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

std::optional<std::string> faster_precision(const std::vector<c10::ScalarType>& fast_dtypes,
                                            std::optional<c10::ScalarType> run_autocast) {
  if (run_autocast && *run_autocast != c10::kFloat) return std::nullopt;
  auto fast = [&](c10::ScalarType dtype) {
    return std::find(fast_dtypes.begin(), fast_dtypes.end(), dtype) != fast_dtypes.end();
  };
  if (fast(c10::kBFloat16)) return "bf16";
  if (fast(c10::kHalf)) return "fp16";
  return std::nullopt;
}

std::vector<std::string> describe_bottleneck(const std::array<double, kStepPhaseCount>& total_ms,
                                             std::int64_t steps, double step_time_ms,
                                             const std::optional<std::string>& faster_precision) {
  std::vector<std::string> lines;
  if (steps <= 0) return lines;
  double all_ms = 0;
  for (double ms : total_ms) all_ms += ms;
  auto phase_share = [&](StepPhase phase) {
    return all_ms > 0 ? total_ms[static_cast<std::size_t>(phase)] / all_ms : 0.0;
  };
  char buffer[512];
  std::string breakdown;
  for (int index = 0; index < kStepPhaseCount; ++index) {
    const auto phase = static_cast<StepPhase>(index);
    std::snprintf(buffer, sizeof buffer, "%s%s %.2f ms (%.0f%%)", breakdown.empty() ? "" : ", ",
                  step_phase_name(phase),
                  total_ms[static_cast<std::size_t>(index)] / static_cast<double>(steps),
                  100.0 * phase_share(phase));
    breakdown += buffer;
  }
  std::snprintf(buffer, sizeof buffer, "step time %.2f ms over %lld steps: ", step_time_ms,
                static_cast<long long>(steps));
  lines.push_back(buffer + breakdown);

  const double data = phase_share(StepPhase::DataWait);
  const double copy = phase_share(StepPhase::HostToDevice);
  const double comm = phase_share(StepPhase::CommWait);
  const double compute = phase_share(StepPhase::Forward) + phase_share(StepPhase::Backward) +
                         phase_share(StepPhase::Optimizer);
  // The seeds' self-check table: data loading, communication, compute; the largest share that
  // crosses its threshold names the bottleneck.
  if (data >= 0.2 && data >= comm) {
    std::snprintf(buffer, sizeof buffer,
                  "data-bound: steps wait %.0f%% of their time for batches; raise loader.workers "
                  "or loader.prefetch, or make the dataset's samples cheaper to read",
                  100.0 * data);
  } else if (comm >= 0.2) {
    std::snprintf(buffer, sizeof buffer,
                  "communication-bound: %.0f%% of the step waits on gradient communication after "
                  "backward; accumulate more micro-batches per step (run.grad_accumulation), "
                  "raise bucket_cap_mb, or use faster links",
                  100.0 * comm);
  } else if (copy >= 0.15) {
    std::snprintf(buffer, sizeof buffer,
                  "copy-bound: host-to-device copies take %.0f%% of the step; keep more batches "
                  "in flight (loader.prefetch) so copies overlap compute",
                  100.0 * copy);
  } else if (faster_precision) {
    std::snprintf(buffer, sizeof buffer,
                  "compute-bound: forward, backward and optimizer take %.0f%% of the step; "
                  "consider %s precision (this device computes it natively) and a larger batch "
                  "(activation checkpointing frees memory for one)",
                  100.0 * compute, faster_precision->c_str());
  } else {
    std::snprintf(buffer, sizeof buffer,
                  "compute-bound: forward, backward and optimizer take %.0f%% of the step; "
                  "consider a larger batch (activation checkpointing frees memory for one)",
                  100.0 * compute);
  }
  lines.emplace_back(buffer);
  return lines;
}

}  // namespace trainyard
