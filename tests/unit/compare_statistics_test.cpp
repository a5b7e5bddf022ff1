// compare's verdicts (host/compare_statistics.cpp) on a fake timing source: step times drawn
// from a model of a shared machine, so that how often a verdict is right is counted over many
// seeded trials rather than hoped for in one run. The real runs are compare_test.cpp's.

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "compare_baseline.hpp"
#include "compare_statistics.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// K interleaved rounds of two variants: each round the machine runs at its own speed (drift,
// shared by both variants of the round: 4%), each run has an offset of its own (3%), and each
// logging interval's mean step time scatters around that (3%).
struct FakeMachine {
  explicit FakeMachine(std::uint64_t seed) : random(seed) {}

  std::pair<RunStepTimes, RunStepTimes> rounds(int runs, int intervals, double slowdown) {
    RunStepTimes a, b;
    for (int r = 0; r < runs; ++r) {
      const double drift = factor(0.04);
      a.push_back(run(20.0 * drift, intervals));
      b.push_back(run(20.0 * drift * slowdown, intervals));
    }
    return {a, b};
  }

  std::vector<double> run(double ms, int intervals) {
    const double offset = factor(0.03);
    std::vector<double> times;
    for (int i = 0; i < intervals; ++i) times.push_back(ms * offset * factor(0.03));
    return times;
  }

  double factor(double spread) {
    return std::exp(std::normal_distribution<double>(0, spread)(random));
  }

  std::mt19937_64 random;
};

TEST(CompareStatistics, IdenticalVariantsAreCalledTheSameIn19Of20Trials) {
  int same = 0;
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    FakeMachine machine(1000 + trial);
    const auto [a, b] = machine.rounds(5, 19, 1.0);
    const SpeedComparison c = compare_speed(a, b, {});
    if (c.verdict == SpeedComparison::Verdict::kSame) ++same;
  }
  EXPECT_GE(same, 19);
}

TEST(CompareStatistics, ATenPercentSlowerVariantIsCalledSlowerWithAnIntervalHoldingIt) {
  int slower = 0, held = 0;
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    FakeMachine machine(2000 + trial);
    const auto [a, b] = machine.rounds(5, 19, 1.10);
    const SpeedComparison c = compare_speed(a, b, {});
    if (c.verdict == SpeedComparison::Verdict::kSlower) ++slower;
    if (c.low <= 1.10 && 1.10 <= c.high) ++held;
    EXPECT_NE(c.verdict, SpeedComparison::Verdict::kFaster) << describe_verdict(c);
  }
  EXPECT_GE(slower, 18);
  EXPECT_GE(held, 18);
}

// `compare --against`: a baseline saved by one command, checked by a later one. The two commands
// share no round, so each side's runs are independent draws and the machine's drift between the
// commands is part of the noise (the baseline's runs at one speed, the later runs at another,
// each drawn per run). The same build passes and a seeded 10% regression fails, each in at
// least 19 of 20 seeded trials, at the default noise threshold, with `--repeat 8` on each side.
VariantResult later_run(const RunStepTimes& step_times) {
  VariantResult result;
  result.label = "variant";
  result.succeeded = true;
  result.step_times = step_times;
  result.train_loss = {{10, 2.5}, {20, 1.25}};
  return result;
}

int regressions_in_20_trials(int runs, double slowdown, std::uint64_t first_seed) {
  int regressed = 0;
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    FakeMachine machine(first_seed + trial);
    Baseline baseline;
    baseline.title = "recipe.toml";
    BaselineVariant saved;
    saved.label = "variant";
    saved.train_loss = {{10, 2.5}, {20, 1.25}};
    RunStepTimes later;
    for (int run = 0; run < runs; ++run) {
      saved.step_times.push_back(machine.run(20.0 * machine.factor(0.04), 19));
    }
    for (int run = 0; run < runs; ++run) {
      later.push_back(machine.run(20.0 * slowdown * machine.factor(0.04), 19));
    }
    baseline.variants = {saved};
    if (check_against_baseline(baseline, {later_run(later)}, {}).regressed) ++regressed;
  }
  return regressed;
}

TEST(CompareBaselineVerdicts, AnUnchangedBuildPassesAndATenPercentRegressionFails) {
  // Eight runs a side: with five, a 10% regression is caught in only 16 of these 20 trials (3
  // runs: 5), because the drift between two commands is not shared as it is within a round.
  EXPECT_LE(regressions_in_20_trials(8, 1.0, 3000), 1);
  EXPECT_GE(regressions_in_20_trials(8, 1.10, 4000), 19);
}

TEST(CompareBaselineVerdicts, ANumericallyDifferentRunFailsAtTheSameSpeed) {
  FakeMachine machine(11);
  const auto [a, b] = machine.rounds(3, 19, 1.0);
  Baseline baseline;
  baseline.variants = {{"variant", "float32", a, {{10, 2.5}, {20, 1.25}}}};
  VariantResult other = later_run(b);
  other.train_loss[1].loss = 1.26;
  const BaselineCheck check = check_against_baseline(baseline, {other}, {});
  EXPECT_TRUE(check.regressed);
  EXPECT_NE(check.text.find("losses differ"), std::string::npos) << check.text;
}

TEST(CompareStatistics, AFasterVariantReadsAsASpeedUp) {
  FakeMachine machine(7);
  const auto [a, b] = machine.rounds(5, 19, 1 / 1.25);
  const SpeedComparison c = compare_speed(a, b, {});
  ASSERT_EQ(c.verdict, SpeedComparison::Verdict::kFaster);
  const std::string text = describe_verdict(c);
  EXPECT_EQ(text.substr(0, 13), "1.25x faster ") << text;
}

TEST(CompareStatistics, ADifferenceUnderTheNoiseThresholdIsNotCalled) {
  // Perfectly quiet runs 1% apart: the interval excludes 1, the threshold keeps the verdict.
  const RunStepTimes a = {std::vector<double>(19, 20.0)};
  const RunStepTimes b = {std::vector<double>(19, 20.2)};
  const SpeedComparison c = compare_speed(a, b, {});
  EXPECT_GT(c.low, 1.0);
  EXPECT_EQ(c.verdict, SpeedComparison::Verdict::kSame);
  EXPECT_EQ(describe_verdict(c), "no significant difference (1.01x [1.01, 1.01])");
  BootstrapSettings strict;
  strict.noise_threshold = 0.005;
  EXPECT_EQ(compare_speed(a, b, strict).verdict, SpeedComparison::Verdict::kSlower);
}

TEST(CompareStatistics, TheSameDataGiveTheSameInterval) {
  FakeMachine machine(3);
  const auto [a, b] = machine.rounds(3, 10, 1.0);
  const SpeedComparison first = compare_speed(a, b, {});
  const SpeedComparison again = compare_speed(a, b, {});
  EXPECT_EQ(first.low, again.low);
  EXPECT_EQ(first.high, again.high);
}

TEST(CompareStatistics, EstimateHoldsTheMedian) {
  FakeMachine machine(5);
  const RunStepTimes runs = {machine.run(10, 19), machine.run(10, 19), {}};
  const StepTimeEstimate e = estimate_step_time(runs, {});
  EXPECT_LE(e.low_ms, e.median_ms);
  EXPECT_GE(e.high_ms, e.median_ms);
  EXPECT_NEAR(e.median_ms, 10, 0.5);
  EXPECT_THROW(estimate_step_time({{}, {}}, {}), Error);
  EXPECT_THROW(compare_speed({{1.0}}, {}, {}), Error);
}

TEST(CompareStatistics, MedianOfEvenAndOddCounts) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median({}), 0);
}

}  // namespace
}  // namespace trainyard
