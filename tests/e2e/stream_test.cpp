// Whole runs over a streaming dataset (the test plugin test_stream): training and evaluation,
// exact resume mid-epoch from the readers' saved positions, refusals, and the dataset
// conformance suite's stream checks run on that plugin.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {


std::string stream_plugin() { return (test_plugin_folder() / "libstream_dataset.so").string(); }

// 640 samples, 2 readers of batches of 16: 20 batches each, 40 steps per epoch.
constexpr const char* kRecipe = R"(
[run]
seed = 3
epochs = 2
log_every = 5
[loader]
batch_size = 16
workers = 2
[dataset]
plugin = "test_stream"
[model]
plugin = "mlp"
hidden = [16]
[optimizer]
plugin = "adamw"
lr = 1e-2
[checkpoint]
plugin = "torch"
[sinks.jsonl]
)";

CommandResult run_stream(const TempDir& dir, const std::string& out,
                         std::vector<std::string> sets, bool resume = false) {
  auto recipe = dir / "recipe.toml";
  if (!std::filesystem::exists(recipe)) dir.write("recipe.toml", kRecipe);
  std::vector<std::string> args = {"run", recipe.string(), "--plugin-path", stream_plugin(),
                                   "--set", "run.output_dir=" + (dir / out).string()};
  for (const auto& set : sets) {
    args.push_back("--set");
    args.push_back(set);
  }
  if (resume) args.insert(args.end(), {"--resume", "auto"});
  return run_host(args);
}

TEST(StreamRunTest, TrainsAndEvaluatesOverStreams) {
  TempDir dir;
  auto result = run_stream(dir, "out", {});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto records = read_metrics(dir / "out" / "metrics.jsonl");
  auto summary = of_phase(records, "summary");
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_EQ(summary[0].at("steps"), 80) << "2 epochs of 40 steps";
  auto eval = of_phase(records, "eval");
  ASSERT_EQ(eval.size(), 2u);
  // The test stream has no size: evaluation reads it to its end, the last batch partial.
  for (const auto& record : eval) EXPECT_EQ(record.at("samples"), 200);
  EXPECT_GT(eval.back().at("accuracy"), 0.6);
  auto train = of_phase(records, "train");
  ASSERT_GE(train.size(), 10u);
  EXPECT_LT(train.back().at("loss"), 0.5 * train.front().at("loss"));
  for (const auto& record : train) EXPECT_TRUE(record.has("data_wait_share"));
}

TEST(StreamRunTest, ResumeMidEpochContinuesExactly) {
  TempDir dir;
  // 50 steps stop in the middle of the second epoch.
  auto whole = run_stream(dir, "whole", {"run.max_steps=70"});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = run_stream(dir, "split", {"run.max_steps=50"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto second = run_stream(dir, "split", {"run.max_steps=70"}, /*resume=*/true);
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.err.find("resumed from"), std::string::npos) << second.err;

  auto whole_train = of_phase(read_metrics(dir / "whole" / "metrics.jsonl"), "train");
  // The metrics file continues across the resume: the first run's records to step 50, then the
  // resumed run's.
  auto continued = of_phase(read_metrics(dir / "split" / "metrics.jsonl"), "train");
  ASSERT_EQ(continued.size(), whole_train.size());
  std::vector<MetricLine> split_train;
  for (const auto& record : continued) {
    if (record.at("step") > 50) split_train.push_back(record);
  }
  // The resumed run's records (steps 55 to 70) are the tail of the uninterrupted run's, bit for
  // bit: the same batches in the same order.
  ASSERT_EQ(split_train.size(), 4u);
  ASSERT_GE(whole_train.size(), split_train.size());
  const auto offset = whole_train.size() - split_train.size();
  for (std::size_t i = 0; i < split_train.size(); ++i) {
    EXPECT_EQ(split_train[i].at("step"), whole_train[offset + i].at("step"));
    EXPECT_EQ(split_train[i].raw.at("loss"), whole_train[offset + i].raw.at("loss"))
        << "step " << split_train[i].at("step");
  }
  // A different worker count would deal the stream differently: refused, not silently changed.
  auto other = run_stream(dir, "split", {"run.max_steps=90", "loader.workers=3"}, true);
  EXPECT_EQ(other.exit_code, 1) << describe(other);
  EXPECT_HAS(other.err, "loader.workers");
}

TEST(StreamRunTest, TrainingOnAStreamOfUnknownSizeIsRefused) {
  TempDir dir;
  auto result = run_stream(dir, "out", {"loader.train_split=test"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.err, "without knowing its size");
  EXPECT_HAS(result.err, "'test'");
}

// The dataset conformance suite, given the plugin, checks its readers: disjoint and complete
// for several layouts, deterministic, restorable.
TEST(StreamRunTest, ConformanceSuiteChecksStreamingPlugins) {
  auto result = run_command(
      {(binary_dir() / "bin" / "conformance_tests").string(),
       "--gtest_filter=*DatasetConformance.*/test_stream"},
      {}, 600, {"TRAINYARD_CONFORMANCE_PLUGIN_PATH=" + stream_plugin()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const char* test : {"StreamReadersAreDisjointAndComplete", "StreamOrderDependsOnlyOnShardSeedAndEpoch",
                           "StreamStateRestoresAnyPosition", "StreamIsDeterministicAndResumable"}) {
    EXPECT_HAS(result.out, std::string("[       OK ] DatasetConformance.") + test + "/test_stream");
  }
  EXPECT_EQ(result.out.find("SKIPPED"), std::string::npos) << result.out;
}

}  // namespace
}  // namespace trainyard::testing
