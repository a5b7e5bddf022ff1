// Unit tests of trainyard/loader_tuning.hpp: the automatic loader's choice from measured step
// and preparation times (fed here, so the decisions are tested without timing).

#include <gtest/gtest.h>

#include <optional>

#include "trainyard/runtime/loader_tuning.hpp"

namespace trainyard {
namespace {

LoaderTuningSettings on_cores(int cores, bool tune_threads = true) {
  LoaderTuningSettings settings;
  settings.cores = cores;
  settings.threads = cores;
  settings.tune_threads = tune_threads;
  return settings;
}

// Feeds steps of (wait, step) seconds until the tuner answers; fails if it never does.
std::optional<LoaderChoice> feed(LoaderTuner& tuner, double wait_s, double step_s) {
  for (int step = 0; step < 100; ++step) {
    if (auto choice = tuner.observe(wait_s, step_s)) return choice;
  }
  ADD_FAILURE() << "the tuner did not decide within 100 steps";
  return std::nullopt;
}

TEST(LoaderTuningTest, CheapPreparationStaysInLineWithEveryCore) {
  LoaderTuner tuner(on_cores(2));
  EXPECT_EQ(tuner.current().workers, 0);
  auto choice = feed(tuner, 0.0003, 0.020);
  ASSERT_TRUE(choice);
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(choice->workers, 0);
  EXPECT_EQ(choice->threads, 2);
  EXPECT_NE(choice->reason.find("prepared in line"), std::string::npos) << choice->reason;
  EXPECT_NEAR(tuner.prepare_ms(), 0.3, 1e-9);
  EXPECT_NEAR(tuner.prepare_share(), 0.015, 1e-9);
  // Settled: later steps change nothing.
  EXPECT_FALSE(tuner.observe(0.5, 0.6).has_value());
}

TEST(LoaderTuningTest, DecidesAfterTheSettlingAndMeasuredSteps) {
  LoaderTuningSettings settings = on_cores(4);
  settings.settle_steps = 3;
  settings.measured_steps = 5;
  LoaderTuner tuner(settings);
  for (int step = 0; step < 7; ++step) EXPECT_FALSE(tuner.observe(0, 0.01).has_value()) << step;
  EXPECT_TRUE(tuner.observe(0, 0.01).has_value());
}

TEST(LoaderTuningTest, ExpensivePreparationGetsWorkersFromTheComputeCores) {
  LoaderTuner tuner(on_cores(8));
  // 30 ms to prepare against 10 ms of compute: three workers keep up.
  auto trial = feed(tuner, 0.030, 0.040);
  ASSERT_TRUE(trial);
  EXPECT_FALSE(tuner.settled());
  EXPECT_EQ(trial->workers, 3);
  EXPECT_EQ(trial->threads, 5);
  EXPECT_NEAR(tuner.prepare_share(), 0.75, 1e-9);
  auto choice = feed(tuner, 0.0001, 0.012);
  ASSERT_TRUE(choice);
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(choice->workers, 3);
  EXPECT_EQ(choice->threads, 5);
  EXPECT_NE(choice->reason.find("3 loader workers"), std::string::npos) << choice->reason;
}

TEST(LoaderTuningTest, AddsWorkersWhileTheWaitStaysAboveTheTarget) {
  LoaderTuner tuner(on_cores(4));
  auto first = feed(tuner, 0.010, 0.030);  // one worker estimated
  ASSERT_TRUE(first);
  EXPECT_EQ(first->workers, 1);
  auto second = feed(tuner, 0.004, 0.025);  // still 16% waiting: one more
  ASSERT_TRUE(second);
  EXPECT_FALSE(tuner.settled());
  EXPECT_EQ(second->workers, 2);
  EXPECT_EQ(second->threads, 2);
  auto settled = feed(tuner, 0.0001, 0.021);
  ASSERT_TRUE(settled);
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(settled->workers, 2);
}

TEST(LoaderTuningTest, KeepsPreparingInLineWhenWorkersDoNotHelp) {
  LoaderTuner tuner(on_cores(2));
  auto trial = feed(tuner, 0.001, 0.020);  // 5%: worth a try
  ASSERT_TRUE(trial);
  EXPECT_EQ(trial->workers, 1);
  EXPECT_EQ(trial->threads, 1);
  // The worker hides the wait, but one compute thread makes the step slower.
  auto choice = feed(tuner, 0.0, 0.034);
  ASSERT_TRUE(choice);
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(choice->workers, 0);
  EXPECT_EQ(choice->threads, 2);
  EXPECT_NE(choice->reason.find("did not make the step faster"), std::string::npos)
      << choice->reason;
}

TEST(LoaderTuningTest, SettlesWhenTheCoresAreSpent) {
  LoaderTuner tuner(on_cores(2));
  auto trial = feed(tuner, 0.050, 0.060);
  ASSERT_TRUE(trial);
  EXPECT_EQ(trial->workers, 1);  // at most cores - 1
  auto choice = feed(tuner, 0.040, 0.050);
  ASSERT_TRUE(choice);
  EXPECT_TRUE(tuner.settled());
  EXPECT_EQ(choice->workers, 1);
  EXPECT_NE(choice->reason.find("as far as the cores allow"), std::string::npos) << choice->reason;
}

TEST(LoaderTuningTest, ExplicitThreadsAreKept) {
  LoaderTuningSettings settings = on_cores(8, /*tune_threads=*/false);
  settings.threads = 6;
  LoaderTuner tuner(settings);
  auto trial = feed(tuner, 0.020, 0.040);
  ASSERT_TRUE(trial);
  EXPECT_EQ(trial->workers, 1);
  EXPECT_EQ(trial->threads, 6);
}

TEST(LoaderTuningTest, OneCoreStillAllowsOneWorkerForSlowPreparation) {
  // A worker that sleeps (waits on a file, a decoder's I/O) overlaps the step even on one core.
  LoaderTuner tuner(on_cores(1));
  auto trial = feed(tuner, 0.020, 0.030);
  ASSERT_TRUE(trial);
  EXPECT_EQ(trial->workers, 1);
  EXPECT_EQ(trial->threads, 1);
}

}  // namespace
}  // namespace trainyard
