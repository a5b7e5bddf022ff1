#include "schedule_choice.hpp"

#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// A file's schedule, its shape checked against what the recipe and the mesh say.
PipelineSchedule read_schedule(const ScheduleRequest& request) {
  PipelineSchedule schedule = read_schedule_file(request.file);
  const PipelineShape& shape = schedule.shape;
  const auto refuse = [&](const std::string& what) {
    throw Error(request.file.string() + ": " + what);
  };
  if (shape.ranks != request.ranks) {
    refuse("the schedule has " + std::to_string(shape.ranks) + " ranks' lines, the pipeline " +
           std::to_string(request.ranks) + " ranks (parallel.pp)");
  }
  if (request.micro_batches != 0 && shape.micro_batches != request.micro_batches) {
    refuse("the schedule runs " + std::to_string(shape.micro_batches) +
           " micro-batches, strategy.micro_batches says " + std::to_string(request.micro_batches));
  }
  if (request.virtual_stages != 1 && shape.virtual_stages != request.virtual_stages) {
    refuse("the schedule holds " + std::to_string(shape.virtual_stages) +
           " stages per rank, strategy.virtual_stages says " +
           std::to_string(request.virtual_stages));
  }
  return schedule;
}

}  // namespace

PipelineSchedule choose_schedule(const ScheduleRequest& request) {
  PipelineSchedule schedule;
  if (request.file.empty()) {
    const PipelineShape shape{request.ranks,
                              request.micro_batches == 0 ? request.ranks : request.micro_batches,
                              request.virtual_stages};
    schedule = build_pipeline_schedule(request.name, shape);
    validate_schedule(schedule);
    return schedule;
  }
  schedule = read_schedule(request);
  try {
    validate_schedule(schedule);
    simulate_schedule(schedule);  // refuses a deadlock
  } catch (const Error& error) {
    throw Error(request.file.string() + ": " + error.what());
  }
  return schedule;
}

}  // namespace trainyard
