// Runs that survive failures: `trainyard launch --max-restarts` restarts a group whose ranks are
// killed, resuming from the newest valid checkpoint, and ends with the parameters of a run that
// was never interrupted; `--min-nproc` continues on the survivors with the same global batch.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// 16 steps per epoch on 4 ranks of 8 samples; a checkpoint every 4 steps.
std::string recipe_text(const std::string& strategy) {
  return R"([run]
seed = 3
epochs = 3
max_steps = 30
eval = false
log_every = 1

[loader]
workers = 0
batch_size = 8

[dataset]
plugin = "synthetic"
samples = 512
input_shape = [1, 8, 8]

[model]
plugin = "mlp"
hidden = [32, 16]

[optimizer]
plugin = "sgd"
lr = 0.05
momentum = 0.9

[strategy]
plugin = ")" +
         strategy + R"("

[checkpoint]
plugin = "torch"
every_steps = 4

[sinks.jsonl]
)";
}

// Kills a random rank (SIGKILL, as `kill -9` does) in each of the group's first three starts,
// at steps after a checkpoint and before the next, and checks the job ends where an
// uninterrupted run does, bit for bit.
void expect_restarts_end_bitwise(const std::string& strategy) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text(strategy));
  std::random_device entropy;
  const unsigned seed = entropy();
  std::mt19937 random(seed);
  std::uniform_int_distribution<int> any_rank(0, 3);
  const std::string plan = "0:" + std::to_string(any_rank(random)) +
                           ":6,1:" + std::to_string(any_rank(random)) +
                           ":15,2:" + std::to_string(any_rank(random)) + ":26";
  SCOPED_TRACE("failure plan (start:rank:step) " + plan);

  auto uninterrupted = run_launched(4, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  auto restarted = run_launcher(
      {"--nproc-per-node", "4", "--max-restarts", "3", "--restart-backoff", "0.2"}, recipe,
      dir / "restarted", {}, {"TRAINYARD_TEST_FAIL_PLAN=" + plan, "TRAINYARD_TEST_FAIL_MODE=kill"});
  ASSERT_EQ(restarted.exit_code, 0) << describe(restarted);
  for (int restart = 1; restart <= 3; ++restart) {
    EXPECT_HAS(restarted.err, "restart " + std::to_string(restart) + " of 3");
  }
  EXPECT_HAS(restarted.err, "was killed by signal Killed");
  EXPECT_HAS(restarted.out + restarted.err, "resumed from");
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "restarted" / "final.pt", 0,
                           0);
  // The metrics file continues across the restarts: each step's record once, in order, the
  // records lost after each resume point written again.
  std::vector<std::int64_t> steps;
  for (const auto& line :
       of_phase(read_metrics(dir / "restarted" / "metrics.rank0.jsonl"), "train")) {
    steps.push_back(static_cast<std::int64_t>(line.at("step")));
  }
  std::vector<std::int64_t> expected(30);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(steps, expected);
  expect_same_losses_within(dir / "uninterrupted", dir / "restarted", 0, 0);
}

TEST(Restart, DdpKilledThreeTimesEndsWithTheUninterruptedParameters) {
  expect_restarts_end_bitwise("ddp");
}

TEST(Restart, FsdpKilledThreeTimesEndsWithTheUninterruptedParameters) {
  expect_restarts_end_bitwise("fsdp");
}

TEST(Restart, GivesUpAfterMaxRestarts) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("ddp"));
  auto result =
      run_launcher({"--nproc-per-node", "2", "--max-restarts", "1", "--restart-backoff", "0"},
                   recipe, dir / "out", {}, {"TRAINYARD_TEST_FAIL_PLAN=0:1:3,1:1:7"});
  EXPECT_EQ(result.exit_code, 3) << describe(result);
  EXPECT_HAS(result.err, "restart 1 of 1");
  EXPECT_HAS(result.err, "giving up after 1 restart");
}

TEST(Restart, ShrinksToTheSurvivorsKeepingTheGlobalBatch) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("ddp"));
  auto uninterrupted = run_launched(4, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  // Two ranks die at once in the middle of the first epoch.
  auto shrunk =
      run_launcher({"--nproc-per-node", "4", "--max-restarts", "1", "--min-nproc", "2",
                    "--restart-backoff", "0"},
                   recipe, dir / "shrunk", {},
                   {"TRAINYARD_TEST_FAIL_PLAN=0:1:10,0:2:10", "TRAINYARD_TEST_FAIL_MODE=kill"});
  ASSERT_EQ(shrunk.exit_code, 0) << describe(shrunk);
  EXPECT_HAS(shrunk.err, "continuing on 2 of 4 ranks with grad_accumulation 2");
  EXPECT_HAS(shrunk.out + shrunk.err, "resharded");
  // Another reduction order: fp32 tolerance, not bits.
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "shrunk" / "final.pt", 1.3e-6,
                           1e-5);
  // No jump in the loss curve at the shrink: the losses logged after it match.
  expect_same_losses_within(dir / "uninterrupted", dir / "shrunk", 1.3e-6, 1e-5);
}

TEST(Restart, RefusesToShrinkWhenTheGlobalBatchCannotBeKept) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("ddp"));
  // 3 ranks x 1 micro-batch: 2 survivors cannot make 3 micro-batches a step.
  auto result = run_launcher({"--nproc-per-node", "3", "--max-restarts", "1", "--min-nproc", "2",
                              "--restart-backoff", "0"},
                             recipe, dir / "out", {}, {"TRAINYARD_TEST_FAIL_PLAN=0:2:5"});
  EXPECT_NE(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err, "cannot keep the global batch on 2 to 2 ranks");
}

TEST(Restart, MinNprocNeedsMaxRestarts) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("ddp"));
  auto result =
      run_launcher({"--nproc-per-node", "2", "--min-nproc", "1"}, recipe, dir / "out", {});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.err, "--min-nproc needs --max-restarts");
}

// The launcher's watchdog finds a frozen rank (SIGSTOP: its heartbeat stops) and a stuck one
// (it beats but begins no step) well before the collectives' time-out, and the group restarts.
void expect_watchdog_restarts(const std::string& mode, const std::string& reason) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("ddp"));
  auto uninterrupted = run_launched(2, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  const auto started = std::chrono::steady_clock::now();
  auto restarted = run_launcher({"--nproc-per-node", "2", "--max-restarts", "1", "--watchdog", "3",
                                 "--restart-backoff", "0"},
                                recipe, dir / "restarted", {},
                                {"TRAINYARD_TEST_FAIL_PLAN=0:1:6", "TRAINYARD_TEST_FAIL_MODE=" + mode},
                                240);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(restarted.exit_code, 0) << describe(restarted);
  EXPECT_HAS(restarted.err, "watchdog: " + reason);
  EXPECT_HAS(restarted.err, "restart 1 of 1");
  // Found within the period (and the run's own seconds), not after [comm] timeout_s (300 s).
  EXPECT_LT(seconds, 60) << restarted.err;
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "restarted" / "final.pt", 0,
                           0);
}

TEST(Watchdog, FrozenRankIsKilledAndTheGroupRestarts) {
  expect_watchdog_restarts("stop", "rank 1's heartbeat stopped");
}

TEST(Watchdog, RankStuckOutsideCollectivesIsKilledAndTheGroupRestarts) {
  expect_watchdog_restarts("hang", "no rank began a step for 3 s");
}

// Preemption: a scheduler's SIGTERM stops every rank at the same step boundary with a
// checkpoint, and --resume auto continues exactly.
std::string preemptible_recipe() {
  std::string text = recipe_text("ddp");
  // No periodic checkpoints: the one the signal asks for is the only one.
  text.replace(text.find("every_steps = 4"), 15, "every_steps = 0");
  return text;
}

std::size_t train_records(const fs::path& metrics) {
  if (!fs::exists(metrics)) return 0;
  return of_phase(read_metrics(metrics), "train").size();
}

TEST(Preemption, SigtermToOneRankStopsEveryRankWithACheckpointThatResumesBitwise) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", preemptible_recipe());
  auto uninterrupted = run_launched(2, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  // Rank 1 gets SIGTERM during step 10; the ranks agree on it after step 11.
  auto stopped = run_launched(2, recipe, dir / "preempted", {},
                              {"TRAINYARD_TEST_FAIL_PLAN=0:1:9", "TRAINYARD_TEST_FAIL_MODE=term"});
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << describe(stopped);
  EXPECT_HAS(stopped.err, "rank 0 stopped on SIGTERM after saving a checkpoint");
  EXPECT_HAS(stopped.err, "rank 1 stopped on SIGTERM after saving a checkpoint");
  EXPECT_HAS(stopped.out + stopped.err, "stopping at step 11 on SIGTERM");
  EXPECT_TRUE(fs::exists(dir / "preempted" / "checkpoints" / "step-000000011"));
  EXPECT_FALSE(fs::exists(dir / "preempted" / "final.pt"));
  auto resumed = run_launched(2, recipe, dir / "preempted", {"--resume", "auto"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "preempted" / "final.pt", 0,
                           0);
}

TEST(Preemption, SigtermToTheLauncherStopsEveryRankWithACheckpointThatResumesBitwise) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", preemptible_recipe());
  auto uninterrupted = run_launched(2, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  const fs::path out = dir / "preempted";
  std::vector<std::string> argv = {host_binary().string(), "launch", "--nproc-per-node", "2",
                                   recipe.string(), "--set", "run.threads=1",
                                   "--set", "run.output_dir=" + out.string(),
                                   "--set", "run.final_model_file=" + (out / "final.pt").string(),
                                   // Slow enough steps that the signal lands mid-run.
                                   "--set", "model.hidden=[512, 512]"};
  auto stopped = run_command(
      argv, source_dir(), 300, {},
      [&] { return train_records(out / "metrics.rank0.jsonl") >= 3; }, SIGTERM);
  EXPECT_TRUE(stopped.killed);
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << describe(stopped);
  EXPECT_HAS(stopped.err, "forwarding to the ranks");
  EXPECT_HAS(stopped.out + stopped.err, "saved; --resume auto continues");
  argv.insert(argv.end(), {"--resume", "auto"});
  auto resumed = run_command(argv, source_dir(), 300);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  // The same run without the signal.
  auto whole = run_launched(2, recipe, dir / "whole", {"--set", "model.hidden=[512, 512]"});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  expect_same_model_within(dir / "whole" / "final.pt", out / "final.pt", 0, 0);
}

TEST(Preemption, OneProcessStopsOnSigtermWithACheckpoint) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", preemptible_recipe());
  const fs::path out = dir / "single";
  auto stopped = run_command(
      {host_binary().string(), "run", recipe.string(), "--set", "strategy.plugin=single",
       "--set", "run.threads=1", "--set", "model.hidden=[512, 512]", "--set",
       "run.output_dir=" + out.string()},
      source_dir(), 300, {}, [&] { return train_records(out / "metrics.jsonl") >= 3; }, SIGTERM);
  EXPECT_EQ(stopped.exit_code, 128 + SIGTERM) << describe(stopped);
  EXPECT_HAS(stopped.out + stopped.err, "on SIGTERM: checkpoint");
  EXPECT_FALSE(fs::is_empty(out / "checkpoints"));
}

TEST(Preemption, UnknownStopSignalIsRefused) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", preemptible_recipe());
  auto result = run_host({"validate", recipe.string(), "--set", "run.stop_signals=[\"SIGKILL\"]"});
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_HAS(result.err, "uncatchable signal 'SIGKILL'");
}

}  // namespace
}  // namespace trainyard::testing
