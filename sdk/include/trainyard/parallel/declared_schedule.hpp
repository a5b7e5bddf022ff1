#pragma once
// The pipeline schedule a strategy runs, declared in the run's output folder. A strategy that
// drives its stages by a schedule (any plugin, not only the bundled pipeline) writes this once at
// setup; reports such as `trainyard compare` read it to simulate and draw the schedule the run
// used, without knowing which plugin ran it or how its options are spelled.

#include <filesystem>
#include <optional>
#include <string>

#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {

struct DeclaredSchedule {
  std::string schedule;  // a pipeline_schedule_names() name, or the plugin's own
  PipelineShape shape;   // pipeline ranks, micro-batches per step, stages per rank
};

// <output_dir>/pipeline_schedule.json
std::filesystem::path declared_schedule_file(const std::filesystem::path& output_dir);

// Writes {"schedule", "ranks", "micro_batches", "virtual_stages"} to
// declared_schedule_file(output_dir), whole (written beside it, then renamed). One rank of the
// run writes it. Throws Error naming the file when it cannot be written.
void write_declared_schedule(const std::filesystem::path& output_dir,
                             const DeclaredSchedule& declared);

// The schedule declared in `run_dir`; nullopt when the run declared none. Throws Error
// "<file>: <what is wrong>" (one line) on malformed JSON, a missing or mistyped member, or a
// count below 1.
std::optional<DeclaredSchedule> read_declared_schedule(const std::filesystem::path& run_dir);

}  // namespace trainyard
