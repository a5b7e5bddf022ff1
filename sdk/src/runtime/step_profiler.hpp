#pragma once
// An op-level profile of chosen steps ([run] profile_steps): the Kineto profiler, as
// torch.profiler runs it, records every ATen op (and the device's own work, where its backend
// names the activities that record it) of those steps, each step under its own range, and
// writes a Chrome trace JSON that chrome://tracing and ui.perfetto.dev open. Off, it costs a
// comparison per step. Internal to the SDK library.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trainyard {

struct StepProfilerSettings {
  std::int64_t first = 0;  // steps counted from 1, as the console counts; 0: no profile
  std::int64_t last = 0;
  std::filesystem::path file;  // where the trace goes
  // Kineto activities beyond the host's (DeviceBackend::profiler_activities).
  std::vector<std::string> device_activities;
};

class StepProfiler {
 public:
  StepProfiler(StepProfilerSettings settings, std::function<void(const std::string&)> log);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around step `step` (counted from 1): starts recording at the first profiled step, and
  // after the last one writes the trace.
  void before_step(std::int64_t step);
  void after_step(std::int64_t step);

 private:
  struct Recording;
  StepProfilerSettings settings_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<Recording> recording_;  // while profiling
};

// A profiler of steps `steps` ([first, last]) writing `<output_dir>/profile.rank<rank>.json`,
// recording the host and `device_activities` (the device backend's profiler_activities), or null
// for none (`steps` empty).
std::unique_ptr<StepProfiler> make_step_profiler(const std::vector<std::int64_t>& steps,
                                                 const std::filesystem::path& output_dir, int rank,
                                                 std::vector<std::string> device_activities,
                                                 std::function<void(const std::string&)> log);

}  // namespace trainyard
