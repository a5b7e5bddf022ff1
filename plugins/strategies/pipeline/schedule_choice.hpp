#pragma once
// Which schedule a pipeline runs: one of the built ones by name, or one read from a file
// (strategy.schedule_file), checked against the pipeline it must drive.

#include <filesystem>
#include <string>

#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {

struct ScheduleRequest {
  std::string name;            // a pipeline_schedule_names() name
  std::filesystem::path file;  // a schedule file (parse_schedule_csv); empty: build `name`
  int ranks = 1;               // the pipeline's ranks
  int micro_batches = 0;       // 0: as many as the ranks, or as the file's
  int virtual_stages = 1;      // with a file: 1, or the file's
};

// The schedule, validated (validate_schedule). Throws Error when it does not build, does not
// read, does not fit the pipeline (naming the file) or is not one training step.
PipelineSchedule choose_schedule(const ScheduleRequest& request);

}  // namespace trainyard
