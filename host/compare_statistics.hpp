#pragma once
// Whether a variant is faster than another, from the step times of repeated runs. The runs are
// the independent draws: with two or more a side, a 95% t interval of the ratio of their median
// step times (on the logarithms; per round when the runs were interleaved in rounds); with one,
// a bootstrap over the run's logging intervals. A difference is called only when the interval
// excludes 1 and the estimate is beyond a noise threshold (docs/running.md, "Comparing").

#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/runtime/median.hpp"

namespace trainyard {

// The step times of one variant: per run (repeat), the mean step time of each logging interval
// after the first (warm-up), in milliseconds.
using RunStepTimes = std::vector<std::vector<double>>;

struct StepTimeEstimate {
  double median_ms = 0;  // of every interval of every run
  double low_ms = 0;     // 95% interval of that median
  double high_ms = 0;
};

struct SpeedComparison {
  enum class Verdict { kSame, kFaster, kSlower };
  // The variant's median step time over the reference's: below 1, the variant is faster.
  double time_ratio = 1;
  double low = 1;  // 95% interval of time_ratio
  double high = 1;
  Verdict verdict = Verdict::kSame;
  int runs = 0;  // the fewer runs of the two
};

struct BootstrapSettings {
  int resamples = 2000;           // bootstrap draws, where there is one run a side
  std::uint64_t seed = 1;         // the same data give the same interval
  double noise_threshold = 0.02;  // a difference under 2% is never called one
};

// The median step time and its interval; runs without intervals are ignored. Throws Error when
// there is no interval at all.
StepTimeEstimate estimate_step_time(const RunStepTimes& runs, const BootstrapSettings& settings);

// `variant` against `reference`. Runs are paired by index when both have as many (the k-th runs
// of an interleaved compare ran in the same round, under the same drift of the machine);
// otherwise the two sides are independent samples. Throws Error when a side has no interval.
SpeedComparison compare_speed(const RunStepTimes& reference, const RunStepTimes& variant,
                              const BootstrapSettings& settings);

// "1.08x faster [1.05, 1.11]", "1.10x slower [1.07, 1.13]" (time ratios), or "no significant
// difference (1.01x [0.98, 1.04])".
std::string describe_verdict(const SpeedComparison& comparison);

}  // namespace trainyard
