// [run] on_nonfinite on whole runs: a nan planted in one parameter's gradient at one step (the
// TRAINYARD_TEST_NONFINITE hook) stops the run with one line naming the step, the parameter,
// the loss and the batch, on one process and on two; or, with skip, is counted and trained past,
// until too many come in a row; or, with rollback, gone back from.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/distributed.hpp"

namespace trainyard::testing {
namespace {

const char* const kRecipe = "recipes/fashion_mnist_mlp.toml";
const char* const kParameter = "hidden1.0.weight";

// `launcher` ("run", or "launch" with its options) on the mlp recipe for 6 steps, a nan planted
// as `plan` says, with more --set arguments.
CommandResult run_planted(const std::vector<std::string>& launcher, const std::string& plan,
                          const TempDir& dir, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> argv = {host_binary().string()};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.insert(argv.end(), {kRecipe, "--set", "run.max_steps=6", "--set", "run.log_every=1", "--set",
                           "run.eval=false", "--set", "run.output_dir=" + dir.path().string()});
  for (const auto& set : sets) argv.insert(argv.end(), {"--set", set});
  return run_command(argv, source_dir(), 300, {"TRAINYARD_TEST_NONFINITE=" + plan});
}

std::string nonfinite_line(const CommandResult& result) {
  const std::string all = result.out + result.err;
  const std::size_t at = all.rfind("non-finite gradients");
  if (at == std::string::npos) return "";
  const std::size_t begin = all.rfind('\n', at);
  const std::size_t end = all.find('\n', at);
  return all.substr(begin == std::string::npos ? 0 : begin + 1,
                    end == std::string::npos ? std::string::npos : end - begin - 1);
}

void expect_stops_at_step_4(const CommandResult& result) {
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(result.timed_out);
  const std::string line = nonfinite_line(result);
  EXPECT_HAS(line, "step 4: non-finite gradients (the first on this rank in hidden1.0.weight)");
  EXPECT_HAS(line, "the loss was finite");
  EXPECT_HAS(line, "the batch's samples on this rank: ");
  EXPECT_HAS(line, "(64 in all)");
  EXPECT_HAS(line, "on_nonfinite = \"skip\" trains on");
}

TEST(NonfiniteRun, StopNamesTheStepTheParameterAndTheBatch) {
  TempDir dir;
  const CommandResult result = run_planted({"run"}, std::string("3:") + kParameter, dir);
  expect_stops_at_step_4(result);
  // The records end with the last good step.
  const auto train = of_phase(read_metrics(dir / "metrics.jsonl"), "train");
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train.back().at("step"), 3);
}

TEST(NonfiniteRun, StopUnderBf16) {
  TempDir dir;
  expect_stops_at_step_4(
      run_planted({"run"}, std::string("3:") + kParameter, dir, {"precision.plugin=bf16"}));
}

TEST(NonfiniteRun, StopOnTwoDdpRanks) {
  TempDir dir;
  const CommandResult result =
      run_planted({"launch", "--nproc-per-node", "2"}, std::string("3:") + kParameter, dir,
                  {"strategy.plugin=ddp", "loader.batch_size=32"});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(result.timed_out);
  EXPECT_HAS(nonfinite_line(result),
             "step 4: non-finite gradients (the first on this rank in hidden1.0.weight)");
  EXPECT_HAS(nonfinite_line(result), "(32 in all)");
}

TEST(NonfiniteRun, SkipCountsTheStepAndTrainsOn) {
  TempDir dir;
  const CommandResult result =
      run_planted({"run"}, std::string("3:") + kParameter, dir, {"run.on_nonfinite=skip"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err + result.out, "skipped (on_nonfinite = skip, 1 so far)");
  const auto train = of_phase(read_metrics(dir / "metrics.jsonl"), "train");
  ASSERT_EQ(train.size(), 6u);
  for (const auto& record : train) {
    const bool poisoned = record.at("step") == 4;
    EXPECT_EQ(record.has("skipped_steps") ? record.at("skipped_steps") : 0.0, poisoned ? 1 : 0)
        << "step " << record.at("step");
    // The norm is logged every step; the poisoned one's is nan, which JSON writes as null.
    const bool finite_norm = record.has("grad_norm") && std::isfinite(record.at("grad_norm"));
    EXPECT_EQ(finite_norm, !poisoned) << "step " << record.at("step");
  }
}

TEST(NonfiniteRun, SkipStopsAfterTooManyInARow) {
  TempDir dir;
  const std::string plan = std::string("2:") + kParameter + ",3:" + kParameter;
  const CommandResult result =
      run_planted({"run"}, plan, dir, {"run.on_nonfinite=skip", "run.max_nonfinite_in_a_row=2"});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_HAS(nonfinite_line(result), "step 4: non-finite gradients");
  EXPECT_HAS(nonfinite_line(result),
             "2 steps in a row were non-finite (run.max_nonfinite_in_a_row)");
}

// on_nonfinite = "rollback": a batch of nans (TRAINYARD_TEST_CORRUPT_BATCH) sends the run back to
// its last checkpoint, never to train on that batch again: it ends bit for bit where a run ends
// that skipped the batch from the start.
TEST(NonfiniteRun, RollbackEndsAsARunThatNeverSawTheBatch) {
  const auto run = [](const TempDir& dir, const std::vector<std::string>& sets,
                      const std::vector<std::string>& env) {
    std::vector<std::string> argv = {host_binary().string(), "run", kRecipe};
    for (const auto& set : sets) argv.insert(argv.end(), {"--set", set});
    argv.insert(argv.end(),
                {"--set", "run.max_steps=24", "--set", "run.eval=false", "--set", "run.threads=1",
                 "--set", "loader.workers=0", "--set", "checkpoint.every_steps=10", "--set",
                 "run.output_dir=" + dir.path().string(), "--set",
                 "run.final_model_file=" + (dir / "final.pt").string()});
    return run_command(argv, source_dir(), 300, env);
  };
  TempDir rolled;
  const CommandResult rollback =
      run(rolled, {"run.on_nonfinite=\"rollback\""}, {"TRAINYARD_TEST_CORRUPT_BATCH=0:13:nan"});
  ASSERT_EQ(rollback.exit_code, 0) << describe(rollback);
  EXPECT_HAS(rollback.err + rollback.out, "step 14: non-finite gradients");
  EXPECT_HAS(rollback.err + rollback.out,
             "(loader batches 0:13): rolled back to the checkpoint of step 10");
  const auto events = of_phase(read_metrics(rolled / "metrics.jsonl"), "nonfinite");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events.front().at("step"), 14);
  EXPECT_EQ(events.front().at("batch_index"), 13);

  TempDir skipping;
  const CommandResult reference = run(skipping, {"run.skip_batches=[\"0:13\"]"}, {});
  ASSERT_EQ(reference.exit_code, 0) << describe(reference);
  const TensorMap expected = read_tensor_file(skipping / "final.pt");
  const TensorMap actual = read_tensor_file(rolled / "final.pt");
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected)
    EXPECT_TRUE(at::equal(tensor, actual.at(name))) << name;
}

}  // namespace
}  // namespace trainyard::testing
