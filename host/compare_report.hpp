#pragma once
// What `trainyard compare` learned about each variant, and the two ways it shows them: a text
// table for the terminal and a self-contained HTML page (inline SVG, no scripts, fonts or styles
// fetched at view time). Defined in compare_report.cpp (the page), compare_table.cpp (the text
// table), compare_charts.cpp (the SVG charts) and compare_pipeline.cpp (the pipeline sections).

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compare_statistics.hpp"
#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"

namespace trainyard {

// Per-step train metrics whose mean over the run's steady intervals the table shows; the phase
// keys add up to step_time_ms (data_wait_ms first). Absent keys are left out of the table.
const std::vector<std::string>& compare_phase_keys();
// The engine's collective counts per step, comm_<group>_calls and comm_<group>_bytes: the table
// shows their means per step, one pair of columns per group.
bool is_collective_count_key(const std::string& key);

struct LossPoint {
  std::int64_t step = 0;
  double loss = 0;
};

// A variant whose run declared a pipeline schedule (declared_schedule.hpp): the schedule and
// shape it ran, and the timeline it measured. Any strategy plugin may declare one.
struct PipelineVariant {
  std::optional<DeclaredSchedule> declared;
  std::string declared_error;  // why the declared schedule does not read (one line); else empty
  std::optional<MeasuredPipelineTimeline> measured;
  std::string measured_error;  // why the run's timeline files do not read (one line); else empty
};

// What the run in `output_dir` declared and measured; nullopt when it declared no schedule (a
// timeline file without a declaration is not this run's).
std::optional<PipelineVariant> pipeline_variant(const std::filesystem::path& output_dir);

struct VariantResult {
  std::string label;   // what distinguishes it: "precision.plugin=bf16 strategy.plugin=ddp"
  std::string folder;  // its output folder, relative to the report's folder
  bool succeeded = false;
  std::string error;  // the child's one-line "trainyard: error: ..." when it failed
  double wall_s = 0;  // the child process' wall time

  std::vector<LossPoint> train_loss;  // one point per logged interval, in step order
  std::vector<LossPoint> eval_loss;
  // Step-weighted means of the train records after the first interval (warm-up), or of every
  // record when there is only one: step_time_ms, the phase keys, samples_per_s, tokens_per_s, mfu.
  std::map<std::string, double> steady;
  std::optional<double> peak_memory_bytes;  // largest memory_peak_bytes of any train record
  // The steps' peak on the first rank: planned (trainyard plan) and measured by the allocator
  // (run.track_memory); empty where the planner cannot plan the layout or nothing was measured.
  std::optional<double> planned_step_peak;
  std::optional<double> measured_step_peak;
  std::optional<double> final_train_loss;
  std::optional<double> eval_loss_final;
  std::optional<std::pair<std::string, double>> eval_metric;  // first non-loss eval value
  std::int64_t steps = 0;

  // Largest |loss - reference loss| over the steps both logged; empty for the reference itself
  // or when no step is shared.
  std::optional<double> divergence;
  std::int64_t divergence_step = 0;
  bool reference = false;
  // The dtype the run computed in, from its run_info.toml ("float32", "bfloat16", "float16"):
  // the tolerance of its losses.
  std::string compute_dtype = "float32";
  // Whether every shared step's loss equals the reference's within the looser precision's
  // tolerance (numerically the same run); empty for the reference or when no step is shared.
  std::optional<bool> same_numerics;

  // Per run of the variant (--repeat), the step time of each logging interval after the first;
  // the statistics below are drawn from them.
  RunStepTimes step_times;
  std::optional<StepTimeEstimate> step_time;  // median and 95% interval over every run
  std::optional<SpeedComparison> speed;       // against the reference; empty for it

  std::optional<PipelineVariant> pipeline;  // set when its run declared a pipeline schedule
};

struct CompareReport {
  std::string title;                      // "fashion_mnist_mlp"
  std::vector<std::string> command_line;  // how it was made, shown on the page
  std::vector<VariantResult> variants;
};

// Fills each successful variant's divergence from the first successful one (the reference),
// and whether it is numerically the same run.
void compute_divergences(std::vector<VariantResult>& variants);

// Whether two losses of runs computing in these dtypes are the same within the looser dtype's
// tolerance (PyTorch's assert_close defaults: float32 rtol 1.3e-6, bfloat16 1.6e-2, float16
// 1e-3; atol 1e-5). Other dtypes count as float32.
bool losses_match(double reference, double loss, const std::string& reference_dtype,
                  const std::string& dtype);

// Each successful variant's step-time estimate and, but for the reference, its speed against
// the reference's.
void compute_speeds(std::vector<VariantResult>& variants, const BootstrapSettings& settings);

// The side-by-side table, one row per variant, columns only for values some variant has.
std::string format_table(const std::vector<VariantResult>& variants);

// For the terminal: per pipeline variant with a measured timeline, one line per pp rank with its
// measured idle share and the formula's, and one line per variant whose timeline files do not
// read. Empty when there are none.
std::string format_pipeline_idle_shares(const std::vector<VariantResult>& variants);

// The whole HTML page. Pipeline variants get a section drawing their simulated schedule and,
// when their run recorded one, the measured timeline.
std::string render_html(const CompareReport& report);

// Stroke colour of the variant at `index` in the report's curves (also its bars' hue).
std::string variant_colour(std::size_t index);

}  // namespace trainyard
