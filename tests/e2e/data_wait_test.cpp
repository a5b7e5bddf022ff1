// The data-wait metrics: every train record and the summary report how long steps waited for
// their batches, the numbers are consistent, and the default loader keeps the share small.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

struct RunMetrics {
  std::vector<MetricLine> train;
  MetricLine summary;
};

RunMetrics run_recipe(const TempDir& dir, const std::string& recipe,
                      std::vector<std::string> sets) {
  std::vector<std::string> args = {"run",   recipe,
                                   "--set", "run.eval=false",
                                   "--set", "run.output_dir=" + dir.path().string(),
                                   "--set", "checkpoint.at_end=false",
                                   "--set", "sinks.console.enabled=false"};
  for (const auto& set : sets) {
    args.push_back("--set");
    args.push_back(set);
  }
  auto result = run_host(args);
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  RunMetrics run;
  if (result.exit_code != 0) return run;
  auto records = read_metrics(dir / "metrics.jsonl");
  run.train = of_phase(records, "train");
  auto summary = of_phase(records, "summary");
  EXPECT_EQ(summary.size(), 1u);
  if (!summary.empty()) run.summary = summary.front();
  return run;
}

TEST(DataWaitTest, EveryTrainRecordAndTheSummaryReportIt) {
  TempDir dir;
  RunMetrics run = run_recipe(dir, "recipes/fashion_mnist_mlp.toml",
                              {"run.max_steps=60", "run.log_every=20", "loader.workers=0"});
  ASSERT_EQ(run.train.size(), 3u);
  for (const auto& record : run.train) {
    const double wait_ms = record.at("data_wait_ms");
    const double share = record.at("data_wait_share");
    EXPECT_GT(wait_ms, 0) << "without workers every step prepares its batch";
    EXPECT_GT(share, 0);
    EXPECT_LE(share, 1);
    // The share is the mean wait over the mean step time.
    EXPECT_NEAR(share, wait_ms / record.at("step_time_ms"), 1e-6 + 1e-3 * share);
  }
  const double total = run.summary.at("data_wait_share");
  EXPECT_GT(total, 0);
  EXPECT_LE(total, 1);
}

// Without workers each step prepares its batches itself; with workers they are ready ahead, so
// the step waits less. Big batches make preparation a visible part of the step, and a model that
// computes longer than a worker prepares gives the workers time to be ahead.
// Timing on a shared machine is noisy: the comparison gets three tries.
TEST(DataWaitTest, WorkersHideThePreparationOfBatches) {
  const std::vector<std::string> sets = {"run.max_steps=40", "run.log_every=40",
                                         "loader.batch_size=1024", "model.hidden=[512]",
                                         "run.threads=1"};
  std::string history;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TempDir inline_dir, workers_dir;
    auto with = [&](const std::string& workers) {
      auto all = sets;
      all.push_back("loader.workers=" + workers);
      return all;
    };
    RunMetrics in_line = run_recipe(inline_dir, "recipes/fashion_mnist_mlp.toml", with("0"));
    RunMetrics ahead = run_recipe(workers_dir, "recipes/fashion_mnist_mlp.toml", with("2"));
    ASSERT_FALSE(in_line.train.empty());
    ASSERT_FALSE(ahead.train.empty());
    const double waited_in_line = in_line.train.back().at("data_wait_ms");
    const double waited_ahead = ahead.train.back().at("data_wait_ms");
    history +=
        " [" + std::to_string(waited_in_line) + " ms vs " + std::to_string(waited_ahead) + " ms]";
    if (waited_ahead < 0.5 * waited_in_line) return;
  }
  ADD_FAILURE() << "workers did not halve the data wait (without vs with workers):" << history;
}

// With default settings the steps of the default recipe wait little for data: under 10% of the
// time on any machine, however busy (a loader that stalls the steps waits far more). The
// acceptance floor of 2% is FloorDataWait's, measured where the machine is quiet.
TEST(DataWaitTest, DefaultLoaderKeepsTheCnnRecipeBusy) {
  TempDir dir;
  RunMetrics run = run_recipe(dir, "recipes/fashion_mnist_cnn.toml", {"run.max_steps=300"});
  ASSERT_FALSE(run.train.empty());
  const double share = run.summary.at("data_wait_share");
  RecordProperty("data_wait_share", std::to_string(share));
  EXPECT_LE(share, 0.10) << 100 * share << "% of the training time waiting for data";
}

// The acceptance line: with default settings the steps of the default recipe wait for data less
// than 2% of the time. A timing floor (label "machine": CI, on a machine shared with whatever
// else runs, leaves it out); a run that the machine disturbs (another process waking on the
// cores the loader's workers use) can wait a little more: three tries, as above.
TEST(FloorDataWait, DefaultLoaderKeepsTheCnnRecipeBelowTwoPercent) {
  std::string history;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TempDir dir;
    RunMetrics run = run_recipe(dir, "recipes/fashion_mnist_cnn.toml", {"run.max_steps=300"});
    ASSERT_FALSE(run.train.empty());
    const double share = run.summary.at("data_wait_share");
    RecordProperty("data_wait_share", std::to_string(share));
    history += " " + std::to_string(100 * share) + "%";
    if (share <= 0.02) return;
  }
  ADD_FAILURE() << "data wait above 2% of the training time in every try:" << history;
}

}  // namespace
}  // namespace trainyard::testing
