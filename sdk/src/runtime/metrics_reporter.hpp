#pragma once
// The run's records to every metric sink: one train record per logging interval (the meter's
// figures, the loss over the ranks that hold one, the learning rate, progress, precision and
// memory and utilisation figures), one per evaluation, and the summary at the end with the
// bottleneck report. Also where the peak FLOP/s comes from, said at start and written down.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device_placement.hpp"
#include "memory_meter.hpp"
#include "training_meter.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/support/host_cpu.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/peak_flops.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

class Loader;
class LrScheduler;
class Precision;
class Strategy;

// What the train and summary records describe besides the step figures.
struct ReportedRun {
  std::shared_ptr<Strategy> strategy;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<LrScheduler> scheduler;
  DevicePlacement placement;
  const Loader* loader = nullptr;
  double base_lr = 0;
  std::int64_t total_steps = 0;
  int rank = 0;
  const MemoryMeter* memory = nullptr;  // with run.track_memory
};

class MetricsReporter {
 public:
  // Builds the enabled [sinks.*]; `meter` holds the model's FLOPs and the peak they are a
  // fraction of (`peak_tflops`, or 0: cached or measured on the device when the model reports
  // its FLOPs; see peak_flops.hpp). Rank 0 logs the peak and its source.
  MetricsReporter(const Recipe& recipe, const Registry& registry, const BuildContext& build,
                  PhaseClock& phases, MeterSetup meter, double peak_tflops, ReportedRun run,
                  std::function<void(const std::string&)> log);

  TrainingMeter& meter() { return *meter_; }
  // Starts the sinks and the utilisation intervals, and writes `run_info.toml` (per rank) into the
  // run's folder: the peak FLOP/s with its source, and the device.
  void begin(const RunInfo& info);
  // The interval's train record, when a step was taken since the last one. Collective in a
  // multi-process run, so every rank flushes at the same steps.
  void flush_train(std::int64_t step, std::int64_t epoch, double elapsed_s);
  void write_eval(std::int64_t step, std::int64_t epoch, double elapsed_s,
                  std::vector<std::pair<std::string, double>> values);
  // A record of something that happened at `step` (phase "spike": a loss spike), in every sink.
  void write_event(const std::string& phase, std::int64_t step, std::int64_t epoch,
                   double elapsed_s, std::vector<std::pair<std::string, double>> values);
  // Adds the last train loss and evaluation to `summary`, writes the summary record (rank 0 logs
  // the bottleneck report) and ends every sink.
  RunSummary finish(RunSummary summary, std::int64_t epoch, double elapsed_s);
  // What the automatic loader measured before it chose (LoaderTuner): the milliseconds to
  // prepare a step's batches in line and their share of the step, for the summary.
  void set_loader_choice(double prepare_ms, double prepare_share);

 private:
  void emit(const MetricRecord& record);
  // Measures the cached peak again when the run's model outran it (mfu above 1).
  void refresh_outrun_peak();
  void append_memory_figures(std::vector<std::pair<std::string, double>>& values) const;
  void append_loader_figures(std::vector<std::pair<std::string, double>>& values) const;
  void report_loader_threads(double wall_s) const;
  void append_utilisation_figures(std::vector<std::pair<std::string, double>>& values);
  void write_run_info(const RunInfo& info) const;

  ReportedRun run_;
  std::function<void(const std::string&)> log_;
  std::vector<std::shared_ptr<MetricsSink>> sinks_;
  std::unique_ptr<TrainingMeter> meter_;
  std::string comm_settings_;  // the recipe's [comm] as TOML, for run_info.toml
  std::optional<PeakFlops> peak_;  // none when the model reports no FLOPs and none is declared
  double highest_mfu_ = 0;         // of the records emitted
  ProcessCpuUsage process_cpu_;
  double final_train_loss_ = 0;
  std::map<std::string, double> last_eval_;
  std::vector<std::pair<std::string, double>> loader_choice_;
};

}  // namespace trainyard
