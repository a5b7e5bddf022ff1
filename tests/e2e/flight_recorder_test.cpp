// The flight recorder in real runs: four ddp ranks under `trainyard launch --watchdog`. A rank
// frozen with SIGSTOP, and a rank that skips one collective (a test hook), leave flight records
// from which `trainyard diagnose` names the rank, the collective, its group and its number.
// comm.debug = "detail" trains to the same bits as a run without it.

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// 12 steps of 4 ranks x 8 samples; collectives time out after 30 s rather than 300.
std::string recipe_text() {
  return R"([run]
seed = 3
epochs = 1
max_steps = 12
eval = false

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

[strategy]
plugin = "ddp"

[comm]
timeout_s = 30
)";
}

CommandResult diagnose(const fs::path& out) { return run_host({"diagnose", out.string()}); }

TEST(FlightRecorderRuns, DiagnoseNamesAFrozenRankAndTheCollectiveItsGroupWaitsIn) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const auto run =
      run_launcher({"--nproc-per-node", "4", "--watchdog", "3"}, recipe, dir / "out", {},
                   {"TRAINYARD_TEST_FAIL_PLAN=0:3:5", "TRAINYARD_TEST_FAIL_MODE=stop"}, 240);
  ASSERT_NE(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "asking every rank for its flight record (SIGUSR2)");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(fs::exists(dir / "out" / "flight" / ("rank" + std::to_string(rank) + ".json")))
        << describe(run);
  }
  EXPECT_FALSE(fs::exists(dir / "out" / "flight" / "rank3.json"));
  const auto found = diagnose(dir / "out");
  ASSERT_EQ(found.exit_code, 0) << describe(found);
  EXPECT_TRUE(std::regex_search(
      found.out,
      std::regex("rank 3 wrote no flight record .* never finished allreduce #[0-9]+ on group "
                 "dp/dp_shard \\[0,1,2,3\\] \\(step 5\\); ranks 0-2 (wait|failed) in it")))
      << found.out;
}

TEST(FlightRecorderRuns, DiagnoseNamesARankThatSkippedACollective) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const auto run = run_launcher({"--nproc-per-node", "4", "--watchdog", "3"}, recipe, dir / "out",
                                {}, {"TRAINYARD_TEST_SKIP_COLLECTIVE=2:5"}, 240);
  ASSERT_NE(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "test hook: skipping a collective");
  // The sizes do not match: one rank fails on them, and every other rank's collective fails in
  // turn. Each writes its record before it ends, the launcher's SIGTERM notwithstanding.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(fs::exists(dir / "out" / "flight" / ("rank" + std::to_string(rank) + ".json")))
        << describe(run);
  }
  const auto found = diagnose(dir / "out");
  ASSERT_EQ(found.exit_code, 0) << describe(found);
  // Rank 2 never issued step 5's gradient all-reduce, so the others' met its next collective:
  // its numbers run a step ahead.
  EXPECT_TRUE(std::regex_search(
      found.out, std::regex("diagnosis: rank 2 never entered allreduce #[0-9]+ on group "
                            "dp/dp_shard \\[0,1,2,3\\]")))
      << found.out << describe(run);
  EXPECT_FALSE(std::regex_search(found.out, std::regex("diagnosis: every rank"))) << found.out;
}

TEST(FlightRecorderRuns, DetailChecksTrainTheSameBits) {
  TempDir dir;
  const auto recipe = dir.write("recipe.toml", recipe_text());
  const auto plain = run_launched(2, recipe, dir / "plain", {"--set", "comm.flight_recorder=0"});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  const auto checked = run_launched(2, recipe, dir / "checked", {"--set", "comm.debug=detail"});
  ASSERT_EQ(checked.exit_code, 0) << describe(checked);
  expect_same_model_within(dir / "plain" / "final.pt", dir / "checked" / "final.pt", 0, 0);
  // Nothing went wrong: no rank wrote a record.
  EXPECT_FALSE(fs::exists(dir / "checked" / "flight"));
}

TEST(FlightRecorderRuns, DiagnoseRefusesAFolderWithoutRecords) {
  TempDir dir;
  const auto found = diagnose(dir.path());
  EXPECT_EQ(found.exit_code, 1) << describe(found);
  EXPECT_HAS(found.err, "no flight records");
}

}  // namespace
}  // namespace trainyard::testing
