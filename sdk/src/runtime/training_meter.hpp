#pragma once
// The engine's running figures of training: what one logging interval's record says, and what
// the whole run adds up to for the bottleneck report. Internal to the SDK library.

#include <ATen/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/step_phases.hpp"

namespace trainyard {

struct StepResult;

struct MeterSetup {
  std::int64_t tokens_per_sample = 0;  // 0: not a token model
  double flops_per_sample = 0;         // forward + backward, of the first model built; 0: unknown
  double peak_flops = 0;               // per rank, per second; 0: unknown
  // Adds up numbers over the ranks (null in a single process). The logged loss is the mean over
  // the steps of every rank that holds a loss, so each interval sums [held losses, steps held];
  // utilisation is every rank's FLOPs over every rank's peak, so it sums [FLOPs, ranks] too.
  std::function<std::vector<double>(std::vector<double>)> sum_over_ranks;
};

// The interval's figures, in the order the record lists them.
struct IntervalFigures {
  std::vector<std::pair<std::string, double>> values;
  std::vector<PhaseSpan> spans;
  double mean_loss = 0;
};

class TrainingMeter {
 public:
  // `phases` is the clock the strategy marks; it outlives the meter.
  TrainingMeter(const MeterSetup& setup, PhaseClock& phases);

  PhaseClock& phases() { return phases_; }
  void add_step(const StepResult& result);
  bool interval_empty() const { return steps_ == 0; }
  // Restarts the interval's wall clock (after a save or an evaluation, which are not training).
  void restart_clock();
  // Ends the interval: reads its device values (the interval's only sync) and starts the next.
  // Collective in a multi-process run (the loss is added up over the ranks).
  IntervalFigures close_interval();

  // Over the run's closed intervals.
  double train_seconds() const { return total_train_s_; }
  double phase_share(StepPhase phase) const;
  // The strategies' byte counts (metrics named *_bytes: what each group's collectives carried,
  // what the gradient buckets hold) per step over the run, as "<name>_per_step"; with both the
  // data-parallel group's bytes and gradient_bytes, their ratio as "gradient_traffic_share"
  // (below 1 when a compression sends less than the buckets hold).
  std::vector<std::pair<std::string, double>> traffic_per_step() const;
  // A few lines naming what bounds the run and what to try, with the numbers behind it;
  // `faster_precision` is the precision plugin to suggest to a compute-bound run, if any.
  std::vector<std::string> bottleneck_report(
      const std::optional<std::string>& faster_precision) const;

 private:
  using Clock = std::chrono::steady_clock;
  MeterSetup setup_;
  PhaseClock& phases_;
  at::Tensor loss_sum_;
  std::int64_t loss_steps_ = 0;  // steps whose loss this rank holds
  at::Tensor last_grad_norm_;  // the interval's last step's
  at::Tensor max_grad_norm_;   // over the interval's steps, nan left out (fmax)
  at::Tensor last_block_grad_norms_;  // the interval's last step's, with run.grad_norm_blocks
  std::vector<std::string> block_names_;
  std::int64_t steps_ = 0;
  std::int64_t samples_ = 0;
  double flops_ = 0;  // this rank's, over the interval
  std::int64_t skipped_ = 0;
  std::map<std::string, double> metric_sums_;
  Clock::time_point interval_start_;
  double total_train_s_ = 0;
  std::int64_t total_steps_ = 0;
  std::array<double, kStepPhaseCount> total_phase_ms_{};
  std::map<std::string, double> total_bytes_;  // over the run's closed intervals
};

}  // namespace trainyard
