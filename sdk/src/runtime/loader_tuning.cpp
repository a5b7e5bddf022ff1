#include "trainyard/runtime/loader_tuning.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace trainyard {

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), pattern, value);
  return text;
}

std::string milliseconds(double seconds) { return format("%.3g ms", 1e3 * seconds); }
std::string percent(double share) { return format("%.2g%%", 100 * share); }

std::string plural(int count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// Another configuration must be this much faster to be preferred to one with fewer workers:
// timing noise must not buy a worker.
constexpr double kFasterBy = 0.01;

}  // namespace

LoaderTuner::LoaderTuner(LoaderTuningSettings settings) : settings_(settings) {
  settings_.cores = std::max(1, settings_.cores);
  settings_.threads = std::max(1, settings_.threads);
  settings_.measured_steps = std::max(1, settings_.measured_steps);
  current_ = with_workers(0);
}

LoaderChoice LoaderTuner::with_workers(int workers) const {
  LoaderChoice choice;
  choice.workers = workers;
  choice.threads =
      settings_.tune_threads ? std::max(1, settings_.cores - workers) : settings_.threads;
  if (workers == 0) choice.threads = settings_.threads;
  return choice;
}

std::optional<LoaderChoice> LoaderTuner::observe(double wait_s, double step_s) {
  if (settled_) return std::nullopt;
  if (++seen_ <= settings_.settle_steps) return std::nullopt;
  waits_.push_back(wait_s);
  steps_.push_back(step_s);
  if (static_cast<int>(steps_.size()) < settings_.measured_steps) return std::nullopt;
  Trial trial{current_, median(waits_), median(steps_)};
  waits_.clear();
  steps_.clear();
  seen_ = 0;
  return judge(trial);
}

std::optional<LoaderChoice> LoaderTuner::judge(const Trial& measured) {
  trials_.push_back(measured);
  const Trial& trial = trials_.back();
  const double share = trial.step_s > 0 ? trial.wait_s / trial.step_s : 0;
  const int workers = trial.choice.workers;
  if (workers == 0) {
    prepare_ms_ = 1e3 * trial.wait_s;
    prepare_share_ = share;
  }
  const int most_workers = std::max(1, settings_.cores - 1);
  if (share < settings_.wait_target) return settle(trial, true);
  if (workers >= most_workers) return settle(trial, false);
  int next = workers + 1;
  if (workers == 0) {
    // Each worker prepares one batch per its own preparation time: as many workers as
    // preparations fit in the rest of a step keep up with it.
    const double compute_s = std::max(trial.step_s - trial.wait_s, 1e-9);
    next = static_cast<int>(std::ceil(trial.wait_s / compute_s));
    next = std::clamp(next, 1, most_workers);
  }
  current_ = with_workers(next);
  current_.reason = "measuring " + plural(next, "loader worker");
  return current_;
}

LoaderChoice LoaderTuner::settle(const Trial& last, bool under_target) {
  const Trial* best = &trials_.front();
  for (const Trial& trial : trials_) {
    if (trial.step_s < best->step_s * (1 - kFasterBy)) best = &trial;
  }
  const Trial& in_line = trials_.front();
  std::string reason = "preparing a step's batches takes " + milliseconds(in_line.wait_s) + ", " +
                       percent(prepare_share_) + " of a " + milliseconds(in_line.step_s) +
                       " step in line (target under " + percent(settings_.wait_target) + "): ";
  if (best->choice.workers == 0) {
    if (trials_.size() == 1) {
      reason += "batches are prepared in line";
    } else {
      reason += "workers did not make the step faster (" + plural(last.choice.workers, "worker") +
                ": " + milliseconds(last.step_s) + "), so batches are prepared in line";
    }
  } else {
    const double share = best->wait_s / best->step_s;
    reason += plural(best->choice.workers, "loader worker") +
              (best->choice.workers == 1 ? " brings" : " bring") + " the data wait to " +
              percent(share) + " (a " + milliseconds(best->step_s) + " step)";
    if (!under_target && best == &last) reason += ", as far as the cores allow";
  }
  reason += ", " + plural(best->choice.threads, "compute thread");
  settled_ = true;
  current_ = best->choice;
  current_.reason = reason;
  return current_;
}

}  // namespace trainyard
