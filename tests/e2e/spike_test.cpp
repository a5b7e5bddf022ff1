// [run] spike on whole runs: a corrupted loader batch (the TRAINYARD_TEST_CORRUPT_BATCH hook
// scales its input by 1000) makes its step's loss spike. With action "rollback" the run reloads
// its last checkpoint, never trains on that batch again, and ends bit for bit where a run ends
// that was told to skip the batch from the start (run.skip_batches), on one process and on two;
// a run killed after the rollback resumes skipping it as well. With "stop" it ends naming the
// step and the batch.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/distributed.hpp"

namespace trainyard::testing {
namespace {

const char* const kRecipe = "recipes/fashion_mnist_mlp.toml";
// Step 18 reads loader batch 17 of epoch 0.
const char* const kCorrupted = "TRAINYARD_TEST_CORRUPT_BATCH=0:17";

std::vector<std::string> spike_sets(const TempDir& dir, int steps) {
  return {"--set", "run.max_steps=" + std::to_string(steps), "--set", "run.log_every=5", "--set",
          "run.eval=false", "--set", "run.output_dir=" + dir.path().string(), "--set",
          "run.final_model_file=" + (dir / "final.pt").string(), "--set",
          "checkpoint.every_steps=10", "--set", "run.spike={factor = 3.0, window = 5}",
          // Bit-for-bit comparisons: no thread count chosen by timing.
          "--set", "run.threads=1", "--set", "loader.workers=0"};
}

// `launcher` ("run", or "launch" and its options) on the mlp recipe with the spike guard, more
// `sets` and environment `env`; `run_options` follow the recipe.
CommandResult run_guarded(const std::vector<std::string>& launcher, const TempDir& dir, int steps,
                          const std::vector<std::string>& sets, const std::vector<std::string>& env,
                          const std::vector<std::string>& run_options = {}) {
  std::vector<std::string> argv = {host_binary().string()};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.push_back(kRecipe);
  argv.insert(argv.end(), run_options.begin(), run_options.end());
  for (const auto& set : spike_sets(dir, steps)) argv.push_back(set);
  for (const auto& set : sets) argv.insert(argv.end(), {"--set", set});
  return run_command(argv, source_dir(), 300, env);
}

void expect_same_bits(const TempDir& expected, const TempDir& actual) {
  const TensorMap e = read_tensor_file(expected / "final.pt");
  const TensorMap a = read_tensor_file(actual / "final.pt");
  ASSERT_EQ(e.size(), a.size());
  ASSERT_FALSE(e.empty());
  for (const auto& [name, tensor] : e) {
    EXPECT_TRUE(at::equal(tensor, a.at(name))) << name;
  }
}

// `rolled` ended bit for bit where a run ends that skipped the corrupted batch from the start.
void expect_same_bits_as_skipping(const std::vector<std::string>& launcher,
                                  const std::vector<std::string>& sets, const TempDir& rolled) {
  TempDir skipping;
  std::vector<std::string> skip_sets = sets;
  skip_sets.push_back("run.skip_batches=[\"0:17\"]");
  const CommandResult reference = run_guarded(launcher, skipping, 30, skip_sets, {});
  ASSERT_EQ(reference.exit_code, 0) << describe(reference);
  expect_same_bits(skipping, rolled);
}

void expect_rollback_equals_skipping(const std::vector<std::string>& launcher,
                                     const std::vector<std::string>& sets) {
  TempDir rolled;
  const CommandResult rollback = run_guarded(launcher, rolled, 30, sets, {kCorrupted});
  ASSERT_EQ(rollback.exit_code, 0) << describe(rollback);
  EXPECT_HAS(rollback.err + rollback.out, "step 18: loss ");
  EXPECT_HAS(rollback.err + rollback.out,
             "(loader batches 0:17): rolled back to the checkpoint of step 10");
  const auto metrics = std::filesystem::exists(rolled / "metrics.jsonl")
                           ? rolled / "metrics.jsonl"
                           : rolled / "metrics.rank0.jsonl";
  const auto events = of_phase(read_metrics(metrics), "spike");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events.front().at("batch_index"), 17);

  expect_same_bits_as_skipping(launcher, sets, rolled);
}

TEST(SpikeRun, RollbackEndsAsARunThatNeverSawTheBatch) {
  expect_rollback_equals_skipping({"run"}, {});
}

TEST(SpikeRun, RollbackOnTwoDdpRanks) {
  expect_rollback_equals_skipping({"launch", "--nproc-per-node", "2"},
                                  {"strategy.plugin=ddp", "loader.batch_size=32"});
}

// Killed after the rollback, before the next save: the run resumes from the checkpoint the
// rollback rewrote, which skips the batch, even with the corruption gone. (The failure hooks
// act under the launcher.)
TEST(SpikeRun, AResumeAfterTheRollbackSkipsTheBatch) {
  const std::vector<std::string> launcher = {"launch", "--nproc-per-node", "2"};
  const std::vector<std::string> ddp = {"strategy.plugin=ddp", "loader.batch_size=32"};
  TempDir rolled;
  const CommandResult killed =
      run_guarded(launcher, rolled, 30, ddp,
                  {kCorrupted, "TRAINYARD_TEST_FAIL_RANK=0", "TRAINYARD_TEST_FAIL_AT_STEP=18"});
  ASSERT_NE(killed.exit_code, 0) << describe(killed);
  EXPECT_HAS(killed.err + killed.out, "rolled back to the checkpoint of step 10");
  const CommandResult resumed = run_guarded(launcher, rolled, 30, ddp, {}, {"--resume", "auto"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err + resumed.out, "at step 10");

  expect_same_bits_as_skipping(launcher, ddp, rolled);
}

// A run resumed from a checkpoint of another run's folder saves one in its own before its first
// step, so that a spike before its first save has somewhere to go back to.
TEST(SpikeRun, ARunResumedFromElsewhereRollsBackToItsStart) {
  TempDir first;
  const CommandResult earlier = run_guarded({"run"}, first, 10, {"run.spike={}"}, {});
  ASSERT_EQ(earlier.exit_code, 0) << describe(earlier);
  std::filesystem::path saved;
  for (const auto& entry : std::filesystem::directory_iterator(first / "checkpoints")) {
    if (entry.path().filename().string().rfind("step-", 0) == 0) saved = entry.path();
  }
  ASSERT_FALSE(saved.empty());
  TempDir second;
  const CommandResult resumed =
      run_guarded({"run"}, second, 20, {}, {kCorrupted}, {"--resume", saved.string()});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err + resumed.out,
             "(loader batches 0:17): rolled back to the checkpoint of step 10");
}

// Spikes on every batch after a checkpoint are not the batches' fault: after run.max_rollbacks
// rollbacks to the same checkpoint the run stops instead of skipping on.
TEST(SpikeRun, TooManyRollbacksToOneCheckpointStop) {
  TempDir dir;
  const CommandResult result = run_guarded({"run"}, dir, 30, {"run.max_rollbacks=2"},
                                           {"TRAINYARD_TEST_CORRUPT_BATCH=0:12,0:13,0:14,0:15"});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err,
             "(loader batches 0:14); that is 3 rollbacks to the checkpoint of step 10 "
             "(run.max_rollbacks)");
}

TEST(SpikeRun, StopNamesTheStepAndTheBatches) {
  TempDir dir;
  const CommandResult result =
      run_guarded({"run"}, dir, 30, {"run.spike.action=\"stop\""}, {kCorrupted});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err, "step 18: loss ");
  EXPECT_HAS(result.err, "x the median ");
  EXPECT_HAS(result.err, "(loader batches 0:17); run.spike.action = \"rollback\"");
}

TEST(SpikeRun, RollbackWithoutCheckpointsIsRefused) {
  TempDir dir;
  const auto recipe = dir.write("no_checkpoints.toml", R"(
[run]
max_steps = 2
eval = false
spike = {factor = 3.0}

[dataset]
plugin = "synthetic"
samples = 64
eval_samples = 0
input_shape = [8]
vocab_size = 16

[model]
plugin = "gpt"
n_layers = 1
n_heads = 2
d_model = 8

[optimizer]
plugin = "sgd"
)");
  const CommandResult result =
      run_host({"run", recipe.string(), "--set", "run.output_dir=" + dir.path().string()});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err, "run.spike.action = \"rollback\" rolls back to the last checkpoint");
}

TEST(SpikeRun, MalformedSettingsAreRefused) {
  for (const auto& [set, expected] : std::vector<std::pair<std::string, std::string>>{
           {"run.skip_batches=[\"17\"]", "'17' is not EPOCH:BATCH"},
           {"run.spike={factor = -1.0}", "run.spike.factor must be >= 0"},
           {"run.spike={action = \"retry\"}", "run.spike.action must be rollback or stop"},
           {"run.spike={windows = 5}", "windows"}}) {
    const CommandResult result = run_host({"validate", kRecipe, "--set", set});
    EXPECT_NE(result.exit_code, 0) << set << "\n" << describe(result);
    EXPECT_HAS(result.err, expected);
  }
}

}  // namespace
}  // namespace trainyard::testing
