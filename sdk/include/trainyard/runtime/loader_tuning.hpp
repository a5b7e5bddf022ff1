#pragma once
// The automatic loader: with `loader.workers = -1` the run measures what preparing a batch costs
// against the step before it spends cores on it. The first steps prepare their batches in line
// (no worker), timing the preparation and the rest of the step. When the preparation is under
// the target share of the step (2%), it stays in line and every core computes. Otherwise
// workers are added, taking their cores from the compute threads when those are automatic too,
// and measured again, until the data wait is under the target or the cores are spent; the run
// keeps the fastest measured configuration. The worker count never changes the batches or their
// order (Loader::set_workers), so the choice is free to depend on timing.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {

// A loader and compute configuration, and why it was chosen.
struct LoaderChoice {
  int workers = 0;
  int threads = 1;
  std::string reason;
};

struct LoaderTuningSettings {
  // Cores this rank may use: the compute threads and the workers share them.
  int cores = 1;
  // The compute threads at start; they give cores to workers only when `tune_threads`.
  int threads = 1;
  bool tune_threads = true;
  // Steps after each change that are not measured (allocations, caches, thread start-up).
  int settle_steps = 2;
  // Steps measured per configuration; their medians are compared.
  int measured_steps = 6;
  // The share of the step the data wait may take.
  double wait_target = 0.02;
};

class LoaderTuner {
 public:
  explicit LoaderTuner(LoaderTuningSettings settings);

  // The configuration in effect: in line, with the starting threads, until the first change.
  const LoaderChoice& current() const { return current_; }
  bool settled() const { return settled_; }
  // Called after every step with the seconds it waited for its batches and its whole time.
  // Returns the configuration to switch to when the tuner changes it or settles (then
  // settled() is true and `reason` says why).
  std::optional<LoaderChoice> observe(double wait_s, double step_s);
  // What the in-line steps measured: milliseconds to prepare a step's batches, and that time's
  // share of the step. 0 until measured.
  double prepare_ms() const { return prepare_ms_; }
  double prepare_share() const { return prepare_share_; }

 private:
  struct Trial {
    LoaderChoice choice;
    double wait_s = 0;
    double step_s = 0;
  };

  LoaderChoice with_workers(int workers) const;
  std::optional<LoaderChoice> judge(const Trial& measured);
  // `last` is the newest of trials_.
  LoaderChoice settle(const Trial& last, bool under_target);

  LoaderTuningSettings settings_;
  LoaderChoice current_;
  bool settled_ = false;
  int seen_ = 0;  // steps observed since the last change
  std::vector<double> waits_;
  std::vector<double> steps_;
  std::vector<Trial> trials_;
  double prepare_ms_ = 0;
  double prepare_share_ = 0;
};

}  // namespace trainyard
