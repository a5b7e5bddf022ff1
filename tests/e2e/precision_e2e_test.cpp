// Whole runs with the step mechanics switched on: fp16's scaler state survives a resume,
// activation checkpointing leaves a run unchanged to the last digit, the metrics are reported,
// and bad settings are refused with their location.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;


// A small synthetic classification run; `extra` is appended (more sections or keys).
fs::path write_recipe(const TempDir& dir, const std::string& model, const std::string& extra = "") {
  return dir.write("recipe.toml", R"(
[run]
seed = 3
epochs = 4
log_every = 5
[loader]
batch_size = 16
workers = 2
[dataset]
plugin = "synthetic"
samples = 320
eval_samples = 64
input_shape = [1, 8, 8]
[optimizer]
plugin = "adamw"
lr = 3e-3
[checkpoint]
plugin = "torch"
[sinks.jsonl]
)" + model + "\n" + extra);
}

CommandResult run_recipe(const fs::path& recipe, const fs::path& out,
                         const std::vector<std::string>& sets, bool resume = false) {
  std::vector<std::string> args = {"run", recipe.string(), "--set",
                                   "run.output_dir=" + out.string()};
  for (const auto& set : sets) args.insert(args.end(), {"--set", set});
  if (resume) args.insert(args.end(), {"--resume", "auto"});
  return run_host(args);
}

const char* kDropoutMlp = R"(
[model]
plugin = "mlp"
hidden = [32, 32, 16]
dropout = 0.3
)";

// The scale grows every 3 finite steps from 256, so it moves all through the run; a resume that
// forgot the scaler (or its growth tracker) would continue from another scale.
TEST(PrecisionRun, Fp16ResumeRestoresTheLossScaler) {
  TempDir dir;
  auto recipe = write_recipe(dir, kDropoutMlp, R"(
[precision]
plugin = "fp16"
init_scale = 256.0
growth_interval = 3
)");
  auto whole = run_recipe(recipe, dir / "whole", {"run.max_steps=40"});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = run_recipe(recipe, dir / "split", {"run.max_steps=22"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto second = run_recipe(recipe, dir / "split", {"run.max_steps=40"}, true);
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.err.find("resumed from"), std::string::npos) << second.err;

  auto whole_train = of_phase(read_metrics(dir / "whole" / "metrics.jsonl"), "train");
  auto split_train = of_phase(read_metrics(dir / "split" / "metrics.jsonl"), "train");
  ASSERT_GE(whole_train.size(), 8u);
  EXPECT_NE(whole_train.front().at("loss_scale"), whole_train.back().at("loss_scale"))
      << "the scale never moved; the test would not see a lost scaler";
  // The resumed run's last records are the uninterrupted run's.
  const auto& whole_last = whole_train.back();
  const auto& split_last = split_train.back();
  EXPECT_EQ(split_last.at("step"), whole_last.at("step"));
  EXPECT_EQ(split_last.raw.at("loss_scale"), whole_last.raw.at("loss_scale"));
  EXPECT_EQ(split_last.raw.at("skipped_steps_total"), whole_last.raw.at("skipped_steps_total"));
  EXPECT_EQ(split_last.raw.at("loss"), whole_last.raw.at("loss"));
}

TEST(PrecisionRun, ActivationCheckpointingLeavesTheRunUnchanged) {
  TempDir dir;
  auto recipe = write_recipe(dir, kDropoutMlp);
  std::vector<std::vector<MetricLine>> runs;
  for (const std::string selection : {"none", "all", "every:2"}) {
    auto result = run_recipe(recipe, dir / selection,
                             {"run.max_steps=30", "run.activation_checkpointing=" + selection});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    runs.push_back(read_metrics(dir / selection / "metrics.jsonl"));
  }
  auto reference_train = of_phase(runs[0], "train");
  auto reference_eval = of_phase(runs[0], "eval");
  ASSERT_EQ(reference_train.size(), 6u);
  ASSERT_FALSE(reference_eval.empty());
  for (std::size_t run = 1; run < runs.size(); ++run) {
    auto train = of_phase(runs[run], "train");
    ASSERT_EQ(train.size(), reference_train.size());
    for (std::size_t i = 0; i < train.size(); ++i) {
      EXPECT_EQ(train[i].raw.at("loss"), reference_train[i].raw.at("loss"))
          << "run " << run << " record " << i;
    }
    EXPECT_EQ(of_phase(runs[run], "eval").back().raw.at("loss"), reference_eval.back().raw.at("loss"));
  }
}

TEST(PrecisionRun, ReportsGradNormAndLossScale) {
  TempDir dir;
  auto recipe = write_recipe(dir, kDropoutMlp, "[precision]\nplugin = \"fp16\"\n");
  auto result = run_recipe(recipe, dir / "out",
                           {"run.max_steps=10", "run.max_grad_norm=0.5", "run.grad_accumulation=2"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto train = of_phase(read_metrics(dir / "out" / "metrics.jsonl"), "train");
  ASSERT_EQ(train.size(), 2u);
  for (const auto& record : train) {
    EXPECT_GT(record.at("grad_norm"), 0);
    EXPECT_EQ(record.at("loss_scale"), 65536.0);
    EXPECT_EQ(record.at("skipped_steps_total"), 0);
  }
}

TEST(PrecisionRun, BadSettingsAreRefusedWithTheirLocation) {
  TempDir dir;
  auto recipe = write_recipe(dir, kDropoutMlp);
  auto bad_form = run_host({"validate", recipe.string(), "--set", "run.activation_checkpointing=every:0"});
  EXPECT_EQ(bad_form.exit_code, 1) << describe(bad_form);
  EXPECT_TRUE(contains(bad_form.err, "run.activation_checkpointing"));
  EXPECT_TRUE(contains(bad_form.err, "'every:0'"));

  auto unknown_block = run_recipe(recipe, dir / "out", {"run.activation_checkpointing=blocks:stage0"});
  EXPECT_EQ(unknown_block.exit_code, 1) << describe(unknown_block);
  EXPECT_TRUE(contains(unknown_block.err, "'stage0'"));
  EXPECT_TRUE(contains(unknown_block.err, "hidden0, hidden1, hidden2, head"));

  auto bad_scaler = run_recipe(recipe, dir / "out", {"precision.plugin=fp16", "precision.backoff_factor=2.0"});
  EXPECT_EQ(bad_scaler.exit_code, 1) << describe(bad_scaler);
  EXPECT_TRUE(contains(bad_scaler.err, "backoff_factor"));
}

}  // namespace
}  // namespace trainyard::testing
