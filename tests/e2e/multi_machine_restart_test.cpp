// Restarts across machines: two launchers on loopback (`--nnodes 2`, 2 ranks each) agree through
// machine 0's store. A rank killed on machine 1 restarts all four ranks and the job ends with
// the parameters of an uninterrupted run, bit for bit; with --min-nproc 2, losing machine 1
// (its launcher and ranks killed) leaves machine 0 to finish with the same global batch.

#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// 16 steps per epoch on 4 ranks of 8 samples; a checkpoint every 4 steps.
std::string recipe_text() {
  return R"([run]
seed = 3
epochs = 2
max_steps = 24
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
plugin = "ddp"

[checkpoint]
plugin = "torch"
every_steps = 4

[sinks.jsonl]
)";
}

// A checkpoint has been committed in `folder` (a step folder, not one being written).
bool has_checkpoint(const fs::path& folder) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) return false;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    if (entry.path().filename().string().rfind("step", 0) == 0) return true;
  }
  return false;
}

struct TwoMachines {
  CommandResult machine0;
  CommandResult machine1;
};

std::vector<std::string> launch_argv(int machine, int port, const fs::path& recipe,
                                     const fs::path& out, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {host_binary().string(),
                                   "launch",
                                   "--nproc-per-node",
                                   "2",
                                   "--nnodes",
                                   "2",
                                   "--node-rank",
                                   std::to_string(machine),
                                   "--master-port",
                                   std::to_string(port),
                                   "--max-restarts",
                                   "2",
                                   "--restart-backoff",
                                   "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(),
              {recipe.string(), "--set", "run.threads=1", "--set", "run.output_dir=" + out.string(),
               "--set", "run.final_model_file=" + (out / "final.pt").string()});
  return argv;
}

// Both machines' launchers at once; machine 1's (with its ranks) killed when `kill_machine1`
// says so.
TwoMachines launch_two_machines(const fs::path& recipe, const fs::path& out,
                                const std::vector<std::string>& extra,
                                const std::vector<std::string>& env,
                                const std::function<bool()>& kill_machine1 = {}) {
  const int port = free_loopback_port();
  auto machine0 = std::async(std::launch::async, [&] {
    return run_command(launch_argv(0, port, recipe, out, extra), source_dir(), 400, env);
  });
  TwoMachines out_of;
  out_of.machine1 =
      run_command(launch_argv(1, port, recipe, out, extra), source_dir(), 400, env, kill_machine1);
  out_of.machine0 = machine0.get();
  return out_of;
}

TEST(MultiMachineRestart, RankKilledOnMachineOneRestartsEveryMachineBitForBit) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const auto uninterrupted = run_launched(4, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  const TwoMachines run =
      launch_two_machines(recipe, dir / "restarted", {},
                          {"TRAINYARD_TEST_FAIL_PLAN=0:3:6", "TRAINYARD_TEST_FAIL_MODE=kill"});
  ASSERT_EQ(run.machine0.exit_code, 0) << describe(run.machine0) << describe(run.machine1);
  ASSERT_EQ(run.machine1.exit_code, 0) << describe(run.machine1);
  EXPECT_HAS(run.machine0.err, "restart 1 of 2");
  EXPECT_HAS(run.machine1.err, "restart 1 of 2");
  EXPECT_HAS(run.machine1.err, "rank 3 was killed by signal");
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "restarted" / "final.pt", 0,
                           0);
}

TEST(MultiMachineRestart, LostMachineLeavesTheOtherToFinishWithTheSameGlobalBatch) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const auto uninterrupted = run_launched(4, recipe, dir / "uninterrupted", {});
  ASSERT_EQ(uninterrupted.exit_code, 0) << describe(uninterrupted);
  const fs::path checkpoints = dir / "shrunk" / "checkpoints";
  // Machine 1 goes, launcher and ranks, once the first checkpoint is there.
  const TwoMachines run = launch_two_machines(recipe, dir / "shrunk", {"--min-nproc", "2"}, {},
                                              [&] { return has_checkpoint(checkpoints); });
  EXPECT_TRUE(run.machine1.killed) << describe(run.machine1);
  ASSERT_EQ(run.machine0.exit_code, 0) << describe(run.machine0);
  EXPECT_HAS(run.machine0.err, "continuing on machine 0 x 2 ranks with grad_accumulation 2");
  // Another reduction order: fp32 tolerance, not bits.
  expect_same_model_within(dir / "uninterrupted" / "final.pt", dir / "shrunk" / "final.pt", 1.3e-6,
                           1e-5);
}

TEST(MultiMachineRestart, LostMachineWithoutMinNprocEndsTheJobSayingSo) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const fs::path checkpoints = dir / "out" / "checkpoints";
  const TwoMachines run =
      launch_two_machines(recipe, dir / "out", {}, {}, [&] { return has_checkpoint(checkpoints); });
  EXPECT_TRUE(run.machine1.killed) << describe(run.machine1);
  EXPECT_NE(run.machine0.exit_code, 0) << describe(run.machine0);
  EXPECT_HAS(run.machine0.err, "cannot restart: machine 1 lost (its launcher stopped)");
}

}  // namespace
}  // namespace trainyard::testing
