#pragma once
// Measured pipeline timelines: what each rank of a pipeline run spent on the actions of one
// recorded step, as the pipeline strategy writes them into the run's output folder and as
// reports read them back. Times are microseconds since the pipeline's ranks left a common
// barrier at the start of that step, so every rank's actions lie on one time axis.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {

// One action as it ran. For sends and receives, the time spent posting them; a forward or
// backward starts once the message it needs has arrived, so a wait is the gap before it.
struct MeasuredAction {
  PipelineAction action;
  double start_us = 0;
  double end_us = 0;
};

// One rank's file: the step's schedule and shape, where the rank sits, and its actions in the
// order it ran them.
struct RankTimeline {
  std::string schedule;  // a pipeline_schedule_names() name, "1f1b"
  int ranks = 1;         // pipeline ranks (parallel.pp)
  int micro_batches = 1;
  int virtual_stages = 1;
  std::int64_t step = 0;
  int rank = 0;  // global rank
  int pp_rank = 0;
  int dp_rank = 0;
  std::vector<MeasuredAction> actions;
};

// A run's measured step: per pp rank (indexed by it), the actions of data-parallel rank 0's
// pipeline.
struct MeasuredPipelineTimeline {
  std::string schedule;
  int ranks = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  std::int64_t step = 0;
  std::vector<std::vector<MeasuredAction>> rank_actions;
};

// Where global rank `rank` of a run of `world_size` processes writes its timeline:
// <output_dir>/pipeline_timeline.json for one process, else pipeline_timeline.rank<R>.json.
std::filesystem::path measured_timeline_file(const std::filesystem::path& output_dir, int rank,
                                             int world_size);

// The timeline files in `run_dir` (either name above): the one-process file first, then by rank
// number; empty when there are none or the folder does not exist.
std::vector<std::filesystem::path> measured_timeline_files(const std::filesystem::path& run_dir);

// Writes `timeline` to `file` as one JSON object: {"schedule", "ranks", "micro_batches",
// "virtual_stages", "step", "rank", "pp_rank", "dp_rank", "actions": [{"kind" (an
// action_kind_name()), "stage", "micro_batch", "start_us", "end_us"}, ...]}. The file appears
// whole (written beside it, then renamed). Throws Error naming the file when it cannot be
// written or a time is not finite.
void write_measured_timeline(const std::filesystem::path& file, const RankTimeline& timeline);

// Reads one rank's file. Throws Error "<file>: <what is wrong>" (one line) on malformed JSON,
// a missing or mistyped member, an unknown action kind, or a number out of range.
RankTimeline read_rank_timeline(const std::filesystem::path& file);

// The measured timeline of the run whose output folder is `run_dir`: nullopt when it holds no
// timeline file. Where several data-parallel ranks share a pp rank, dp rank 0's file is kept.
// When rank files exist, a stray pipeline_timeline.json is ignored. Throws Error naming the
// file on a file that does not read, that names another rank than its file name, or that
// disagrees with the others on the schedule, shape or step; and naming the folder when a pp
// rank has no file from dp rank 0.
std::optional<MeasuredPipelineTimeline> read_measured_timeline(
    const std::filesystem::path& run_dir);

// Per pp rank, 1 - its compute time / the makespan of the compute actions (from the earliest
// compute start to the latest compute end, over every rank): the measured counterpart of
// RankSimulation::idle_share(). Communication counts as idle. 0 for every rank when no rank
// computed.
std::vector<double> measured_idle_shares(const MeasuredPipelineTimeline& timeline);

// Each compute kind's mean measured duration in whole microseconds (at least 1), as the costs
// the idle-share formula and the simulation weigh (zero bubble's depend on F, I and W); `text`
// names the kinds measured ("F=300 B=731 us").
struct MeasuredCosts {
  PipelineCosts costs;
  std::string text;
};
MeasuredCosts measured_costs(const MeasuredPipelineTimeline& timeline);

// One line comparing, per pp rank, the idle share measured in `timeline` with the share the
// schedule's simulation at the measured costs gives that rank, beside the literature's formula:
// "idle share at step 3 per pp rank, measured (simulated at F=.. B=.. us): rank 0 13.2% (11.1%),
// rank 1 ...; formula (p-1)/(m+p-1) = 11.1%". Throws Error when the schedule does not build.
std::string describe_idle_shares(const MeasuredPipelineTimeline& timeline);

}  // namespace trainyard
