// The sim accelerator (ports/sim), built out of tree against the installed SDK alone and loaded
// with --plugin-path: it passes the device and comm conformance suites and trains as the CPU
// does, alone and under ddp and fsdp.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

fs::path port_dir() { return binary_dir() / "sim-port"; }
fs::path installed_host() { return port_dir() / "prefix" / "bin" / "trainyard"; }
fs::path sim_plugins() { return port_dir() / "build"; }

// `trainyard run|launch` of the installed host with the sim plugins loaded, one thread, its
// final model in out/final.pt.
CommandResult run_installed(const std::vector<std::string>& command, const fs::path& recipe,
                            const fs::path& out, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {installed_host().string()};
  argv.insert(argv.end(), command.begin(), command.end());
  for (const std::string& arg :
       {recipe.string(), std::string("--plugin-path"), sim_plugins().string(), std::string("--set"),
        std::string("run.threads=1"), std::string("--set"), "run.output_dir=" + out.string(),
        std::string("--set"), "run.final_model_file=" + (out / "final.pt").string()}) {
    argv.push_back(arg);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, source_dir(), 900);
}

// Builds the port once per test process (the install is refreshed, an unchanged build is a
// no-op), under a lock so that concurrent test processes take turns.
class SimPortBuild : public ::testing::Environment {
 public:
  void SetUp() override {
    fs::create_directories(port_dir());
    auto build = run_command({"flock", (port_dir() / ".lock").string(),
                              (source_dir() / "tests" / "e2e" / "build_sim_port.sh").string(),
                              binary_dir().string(), port_dir().string()},
                             source_dir(), 1800);
    ASSERT_EQ(build.exit_code, 0) << describe(build);
  }
};

[[maybe_unused]] ::testing::Environment* const kSimPortBuild =
    ::testing::AddGlobalTestEnvironment(new SimPortBuild);

const fs::path kCnn = "recipes/fashion_mnist_cnn.toml";
const std::vector<std::string> kFiftySteps = {
    "--set", "run.max_steps=50", "--set", "run.eval=false", "--set", "checkpoint.every_steps=0"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(SimPort, PassesTheDeviceAndCommConformanceSuites) {
  auto result = run_command(
      {(port_dir() / "prefix" / "bin" / "trainyard-conformance").string(), sim_plugins().string()},
      source_dir(), 900);
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  // Both suites ran on the port's components, and nothing failed.
  EXPECT_NE(result.out.find("[       OK ] DeviceConformance.EventsMeasureElapsedTime/sim"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("[       OK ] CommConformance.PeerThatDiesMidCollectiveEndsTheOthers"
                            "WithAnError/sim"),
            std::string::npos)
      << result.out;
  EXPECT_EQ(result.out.find("FAILED"), std::string::npos) << result.out;
}

TEST(SimPort, TrainsTheCnnToTheCpuRunsParametersBitwise) {
  TempDir dir;
  auto cpu = run_installed({"run"}, kCnn, dir.path() / "cpu",
                           with(kFiftySteps, {"--set", "run.device=cpu"}));
  ASSERT_EQ(cpu.exit_code, 0) << describe(cpu);
  auto sim = run_installed({"run"}, kCnn, dir.path() / "sim",
                           with(kFiftySteps, {"--set", "run.device=sim"}));
  ASSERT_EQ(sim.exit_code, 0) << describe(sim);
  // The run says which device it trained on.
  const fs::path run_info = dir.path() / "sim" / "run_info.toml";
  ASSERT_TRUE(fs::exists(run_info)) << describe(sim);
  EXPECT_NE(read_text(run_info).find("kind = \"sim:0\""), std::string::npos) << read_text(run_info);
  expect_same_model_within(dir.path() / "cpu" / "final.pt", dir.path() / "sim" / "final.pt", 0, 0);
}

// Two ranks on sim:0 and sim:1 with the sim comm plugin (the device's default), against the
// same strategy on two CPU processes over Gloo.
void expect_two_sim_ranks_match_the_cpu(const std::string& strategy) {
  TempDir dir;
  const std::vector<std::string> steps = {
      "--set", "run.max_steps=20",         "--set", "run.eval=false",
      "--set", "checkpoint.every_steps=0", "--set", "strategy.plugin=" + strategy};
  auto cpu = run_installed({"launch", "--nproc-per-node", "2"}, kCnn, dir.path() / "cpu",
                           with(steps, {"--set", "run.device=cpu"}));
  ASSERT_EQ(cpu.exit_code, 0) << describe(cpu);
  auto sim = run_installed({"launch", "--nproc-per-node", "2"}, kCnn, dir.path() / "sim",
                           with(steps, {"--set", "run.device=sim"}));
  ASSERT_EQ(sim.exit_code, 0) << describe(sim);
  expect_same_model_within(dir.path() / "cpu" / "final.pt", dir.path() / "sim" / "final.pt", 1.3e-6,
                           1e-5);
  expect_same_losses_within(dir.path() / "cpu", dir.path() / "sim", 1.3e-6, 1e-5);
}

TEST(SimPort, DdpOnTwoRanksMatchesTheCpu) { expect_two_sim_ranks_match_the_cpu("ddp"); }
TEST(SimPort, FsdpOnTwoRanksMatchesTheCpu) { expect_two_sim_ranks_match_the_cpu("fsdp"); }

// Recomputed blocks replay dropout with the sim generator's saved state, so checkpointing every
// block changes no gradient: the parameters after training are the same bit for bit.
TEST(SimPort, ActivationCheckpointingWithDropoutKeepsTheGradients) {
  TempDir dir;
  const fs::path mlp = "recipes/fashion_mnist_mlp.toml";
  const std::vector<std::string> steps = {
      "--set", "run.max_steps=10",  "--set", "run.eval=false", "--set", "checkpoint.every_steps=0",
      "--set", "model.dropout=0.3", "--set", "run.device=sim"};
  auto plain = run_installed({"run"}, mlp, dir.path() / "plain",
                             with(steps, {"--set", "run.activation_checkpointing=none"}));
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  auto recomputed = run_installed({"run"}, mlp, dir.path() / "recomputed",
                                  with(steps, {"--set", "run.activation_checkpointing=all"}));
  ASSERT_EQ(recomputed.exit_code, 0) << describe(recomputed);
  expect_same_model_within(dir.path() / "plain" / "final.pt",
                           dir.path() / "recomputed" / "final.pt", 0, 0);
}

}  // namespace
}  // namespace trainyard::testing
