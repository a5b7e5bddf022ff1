#include "step_profiler.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace profiler = torch::profiler::impl;

namespace {

// The host's activity, and the device's by Kineto's names for them. Throws Error naming one
// Kineto does not know.
std::set<profiler::ActivityType> activities_named(const std::vector<std::string>& names) {
  std::set<profiler::ActivityType> activities = {profiler::ActivityType::CPU};
  for (const std::string& name : names) {
    bool known = false;
    for (int index = 0; index < static_cast<int>(profiler::ActivityType::NUM_KINETO_ACTIVITIES);
         ++index) {
      const auto type = static_cast<profiler::ActivityType>(index);
      if (profiler::actToString(type) == name) {
        activities.insert(type);
        known = true;
      }
    }
    if (!known) throw Error("run.profile_steps: the profiler knows no activity '" + name + "'");
  }
  return activities;
}

}  // namespace

// The range of the step being recorded, open from before_step to after_step.
struct StepProfiler::Recording {
  std::string step_name;  // outlives the range that names itself after it
  std::optional<at::RecordFunction> step_range;
};

StepProfiler::StepProfiler(StepProfilerSettings settings,
                           std::function<void(const std::string&)> log)
    : settings_(std::move(settings)), log_(std::move(log)) {}

StepProfiler::~StepProfiler() {
  // A run that ends (or fails) inside the profiled steps leaves the profiler off, unwritten.
  if (recording_) {
    recording_->step_range.reset();
    torch::autograd::profiler::disableProfiler();
  }
}

void StepProfiler::before_step(std::int64_t step) {
  if (step < settings_.first || step > settings_.last) return;
  if (!recording_) {
    std::set<profiler::ActivityType> activities = activities_named(settings_.device_activities);
    // Kineto looks for a GPU even when asked for CPU activities alone, and logs an error line
    // where there is none: a profile of the host alone keeps it quiet (unless the user set the
    // level; 5 is past its last, ERROR).
    if (activities.size() == 1) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
    const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    recording_ = std::make_unique<Recording>();
  }
  recording_->step_name = "trainyard step " + std::to_string(step);
  recording_->step_range.emplace(at::RecordScope::USER_SCOPE);
  recording_->step_range->before(std::string_view(recording_->step_name),
                                 c10::ArrayRef<const c10::IValue>{});
}

void StepProfiler::after_step(std::int64_t step) {
  if (!recording_) return;
  recording_->step_range.reset();  // ends the step's range
  if (step < settings_.last) return;
  recording_.reset();
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  std::filesystem::create_directories(settings_.file.parent_path());
  result->save(settings_.file.string());
  log_("trainyard: profile of steps " + std::to_string(settings_.first) + ".." +
       std::to_string(settings_.last) + " written to " + settings_.file.string() +
       " (a Chrome trace: open it in chrome://tracing or ui.perfetto.dev)");
}

std::unique_ptr<StepProfiler> make_step_profiler(const std::vector<std::int64_t>& steps,
                                                 const std::filesystem::path& output_dir, int rank,
                                                 std::vector<std::string> device_activities,
                                                 std::function<void(const std::string&)> log) {
  if (steps.size() != 2) return nullptr;
  StepProfilerSettings settings;
  settings.first = steps[0];
  settings.last = steps[1];
  settings.file = output_dir / ("profile.rank" + std::to_string(rank) + ".json");
  settings.device_activities = std::move(device_activities);
  return std::make_unique<StepProfiler>(std::move(settings), std::move(log));
}

}  // namespace trainyard
