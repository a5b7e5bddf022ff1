#include "compare_statistics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <utility>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

RunStepTimes without_empty_runs(const RunStepTimes& runs) {
  RunStepTimes kept;
  for (const auto& run : runs) {
    if (!run.empty()) kept.push_back(run);
  }
  return kept;
}

// One bootstrap draw of a side: `picks` runs (indices given), each replaced by as many of its
// intervals drawn with replacement, pooled.
std::vector<double> draw(const RunStepTimes& runs, const std::vector<std::size_t>& picks,
                         std::mt19937_64& random) {
  std::vector<double> pooled;
  for (std::size_t pick : picks) {
    const auto& run = runs[pick];
    std::uniform_int_distribution<std::size_t> interval(0, run.size() - 1);
    for (std::size_t i = 0; i < run.size(); ++i) pooled.push_back(run[interval(random)]);
  }
  return pooled;
}

std::vector<std::size_t> pick_runs(std::size_t count, std::mt19937_64& random) {
  std::uniform_int_distribution<std::size_t> run(0, count - 1);
  std::vector<std::size_t> picks(count);
  for (auto& pick : picks) pick = run(random);
  return picks;
}

std::vector<double> pooled(const RunStepTimes& runs) {
  std::vector<double> all;
  for (const auto& run : runs) all.insert(all.end(), run.begin(), run.end());
  return all;
}

// The 2.5th and 97.5th percentiles.
std::pair<double, double> central_95(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    const double position = q * static_cast<double>(values.size() - 1);
    const auto below = static_cast<std::size_t>(position);
    const std::size_t above = std::min(below + 1, values.size() - 1);
    const double weight = position - static_cast<double>(below);
    return values[below] * (1 - weight) + values[above] * weight;
  };
  return {at(0.025), at(0.975)};
}

// Student's t at 97.5% for `degrees` of freedom (rounded down, so the interval errs wide):
// the table to 30, then t ~ 1.96 + 2.5 / df, within 0.003 of the exact value beyond.
double t_975(double degrees) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                      2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                      2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                      2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  const auto df = static_cast<int>(std::floor(std::max(1.0, degrees)));
  if (df <= 30) return kTable[df - 1];
  return 1.96 + 2.5 / df;
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double variance(const std::vector<double>& values) {
  const double centre = mean(values);
  double sum = 0;
  for (double v : values) sum += (v - centre) * (v - centre);
  return sum / static_cast<double>(values.size() - 1);
}

// The logarithm of each run's median step time.
std::vector<double> log_run_medians(const RunStepTimes& runs) {
  std::vector<double> logs;
  for (const auto& run : runs) logs.push_back(std::log(median(run)));
  return logs;
}

// The time ratio and its 95% interval from runs: the runs are the independent draws (the
// intervals of one run share its state, so they are not). Paired rounds: a t interval on the
// rounds' log ratios; otherwise Welch's interval on the difference of the mean log medians.
void ratio_from_runs(const RunStepTimes& base, const RunStepTimes& other, bool paired,
                     SpeedComparison& result) {
  const std::vector<double> base_logs = log_run_medians(base);
  const std::vector<double> other_logs = log_run_medians(other);
  double centre = 0, half = 0;
  if (paired) {
    std::vector<double> differences;
    for (std::size_t r = 0; r < base_logs.size(); ++r) {
      differences.push_back(other_logs[r] - base_logs[r]);
    }
    const double n = static_cast<double>(differences.size());
    centre = mean(differences);
    half = t_975(n - 1) * std::sqrt(variance(differences) / n);
  } else {
    const double n1 = static_cast<double>(base_logs.size());
    const double n2 = static_cast<double>(other_logs.size());
    const double v1 = variance(base_logs) / n1, v2 = variance(other_logs) / n2;
    centre = mean(other_logs) - mean(base_logs);
    const double se = std::sqrt(v1 + v2);
    const double degrees =
        se > 0 ? (v1 + v2) * (v1 + v2) / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1)) : n1 + n2 - 2;
    half = t_975(degrees) * se;
  }
  result.time_ratio = std::exp(centre);
  result.low = std::exp(centre - half);
  result.high = std::exp(centre + half);
}

// One run a side: the intervals within the runs are all there is to draw from, a two-level
// bootstrap of the ratio of pooled medians (an interval that knows nothing of how much a
// whole run may vary).
void ratio_from_intervals(const RunStepTimes& base, const RunStepTimes& other,
                          const BootstrapSettings& settings, SpeedComparison& result) {
  result.time_ratio = median(pooled(other)) / median(pooled(base));
  const bool paired = base.size() == other.size();
  std::mt19937_64 random(settings.seed);
  std::vector<double> ratios;
  ratios.reserve(static_cast<std::size_t>(settings.resamples));
  for (int b = 0; b < settings.resamples; ++b) {
    const std::vector<std::size_t> base_picks = pick_runs(base.size(), random);
    const std::vector<std::size_t> other_picks =
        paired ? base_picks : pick_runs(other.size(), random);
    const double base_median = median(draw(base, base_picks, random));
    ratios.push_back(median(draw(other, other_picks, random)) / base_median);
  }
  std::tie(result.low, result.high) = central_95(std::move(ratios));
}

std::string ratio_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

}  // namespace

StepTimeEstimate estimate_step_time(const RunStepTimes& runs, const BootstrapSettings& settings) {
  const RunStepTimes kept = without_empty_runs(runs);
  if (kept.empty()) throw Error("compare: no step time to estimate");
  StepTimeEstimate estimate;
  estimate.median_ms = median(pooled(kept));
  std::mt19937_64 random(settings.seed);
  std::vector<double> medians;
  medians.reserve(static_cast<std::size_t>(settings.resamples));
  for (int b = 0; b < settings.resamples; ++b) {
    medians.push_back(median(draw(kept, pick_runs(kept.size(), random), random)));
  }
  std::tie(estimate.low_ms, estimate.high_ms) = central_95(std::move(medians));
  return estimate;
}

SpeedComparison compare_speed(const RunStepTimes& reference, const RunStepTimes& variant,
                              const BootstrapSettings& settings) {
  const RunStepTimes base = without_empty_runs(reference);
  const RunStepTimes other = without_empty_runs(variant);
  if (base.empty() || other.empty()) throw Error("compare: no step time to compare");
  SpeedComparison result;
  result.runs = static_cast<int>(std::min(base.size(), other.size()));
  if (base.size() >= 2 && other.size() >= 2) {
    ratio_from_runs(base, other, base.size() == other.size(), result);
  } else {
    ratio_from_intervals(base, other, settings, result);
  }
  const double noise = settings.noise_threshold;
  if (result.high < 1 && result.time_ratio < 1 / (1 + noise)) {
    result.verdict = SpeedComparison::Verdict::kFaster;
  } else if (result.low > 1 && result.time_ratio > 1 + noise) {
    result.verdict = SpeedComparison::Verdict::kSlower;
  }
  return result;
}

std::string describe_verdict(const SpeedComparison& c) {
  switch (c.verdict) {
    case SpeedComparison::Verdict::kFaster:
      // As a speed-up: the reference's time over the variant's, and its interval.
      return ratio_text(1 / c.time_ratio) + "x faster [" + ratio_text(1 / c.high) + ", " +
             ratio_text(1 / c.low) + "]";
    case SpeedComparison::Verdict::kSlower:
      return ratio_text(c.time_ratio) + "x slower [" + ratio_text(c.low) + ", " +
             ratio_text(c.high) + "]";
    case SpeedComparison::Verdict::kSame:
      break;
  }
  return "no significant difference (" + ratio_text(c.time_ratio) + "x [" + ratio_text(c.low) +
         ", " + ratio_text(c.high) + "])";
}

}  // namespace trainyard
