// Gradient compression in real runs over loopback: the bytes ddp's collectives carry with
// PowerSGD and top-k against the uncompressed buckets (the collective counter's bytes of the
// data-parallel group beside gradient_bytes, every step and in the run summary), an exact resume
// after kill -9 with PowerSGD's state in the checkpoint, and settings refused in one line.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

struct StepTraffic {
  double sent;          // what this step's data-parallel collectives carried
  double uncompressed;  // gradient_bytes: what plain all-reduces of the buckets would carry
};

// Rank 0's metrics; the data-parallel group of two ranks is also the dp_shard group.
fs::path metrics_of(const fs::path& out) { return out / "metrics.rank0.jsonl"; }

// Each step's bytes of the data-parallel group (named `group_bytes`: with two ranks in all it is
// also the dp_shard group) and of the uncompressed buckets.
std::vector<StepTraffic> traffic(const fs::path& out,
                                 const std::string& group_bytes = "comm_dp/dp_shard_bytes") {
  std::vector<StepTraffic> steps;
  for (const auto& line : of_phase(read_metrics(metrics_of(out)), "train")) {
    steps.push_back({line.at(group_bytes), line.at("gradient_bytes")});
  }
  return steps;
}

// gpt_text on `ranks` ranks under ddp with `settings`, five steps logged every step.
void train_gpt(const TempDir& dir, const std::vector<std::string>& settings, int ranks = 2) {
  std::vector<std::string> extra = {"--set", "strategy.plugin=ddp", "--set",
                                    "sinks.jsonl.enabled=true"};
  for (const auto& setting : settings) extra.insert(extra.end(), {"--set", setting});
  const auto run =
      validate_and_launch_bundled_recipe("gpt_text.toml", ranks, 5, 1, dir.path(), extra);
  EXPECT_EQ(run.exit_code, 0) << describe(run);
}

// The run summary's share: every step's bytes sent over every step's uncompressed bytes.
double summary_share(const fs::path& out) {
  const auto summary = of_phase(read_metrics(metrics_of(out)), "summary");
  if (summary.empty()) throw std::runtime_error("no summary record in " + out.string());
  return summary.back().at("gradient_traffic_share");
}

// The same tensors, bit for bit, in `files` of checkpoints `a` and `b`; a's files as read.
std::map<std::string, StateDict> expect_same_checkpoint_files(
    const fs::path& a, const fs::path& b, const std::vector<std::string>& files) {
  Registry registry;
  load_bundled_plugins(registry);
  const auto backend =
      registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  std::map<std::string, StateDict> read;
  for (const auto& file : files) {
    const StateDict expected = backend->read(a / file);
    const StateDict actual = backend->read(b / file);
    EXPECT_EQ(expected.tensors.size(), actual.tensors.size()) << file;
    for (const auto& [name, tensor] : expected.tensors) {
      EXPECT_TRUE(actual.tensors.count(name) && at::equal(actual.tensors.at(name), tensor))
          << file << ": " << name;
    }
    read[file] = expected;
  }
  return read;
}

void expect_share(const fs::path& out, double at_most) {
  const std::vector<StepTraffic> steps = traffic(out);
  ASSERT_EQ(steps.size(), 5u);
  double sent = 0;
  double uncompressed = 0;
  for (const auto& step : steps) {
    sent += step.sent;
    uncompressed += step.uncompressed;
  }
  EXPECT_NEAR(summary_share(out), sent / uncompressed, 1e-9);
  // The first two steps run plain all-reduces: the counter sees the whole buckets.
  for (std::size_t step = 0; step < 2; ++step) {
    EXPECT_GE(steps[step].sent, steps[step].uncompressed) << "step " << step + 1;
  }
  for (std::size_t step = 2; step < steps.size(); ++step) {
    const double share = steps[step].sent / steps[step].uncompressed;
    std::cout << "step " << step + 1 << ": " << steps[step].sent << " of "
              << steps[step].uncompressed << " bytes (" << share << ")" << std::endl;
    EXPECT_LE(share, at_most) << "step " << step + 1;
  }
}

TEST(CompressionTraffic, PowerSgdRankFourSendsAtMostATenthOfTheGptsGradientBytes) {
  TempDir dir;
  train_gpt(dir, {"compression.plugin=powersgd", "compression.rank=4", "compression.start_step=2"});
  expect_share(dir.path(), 0.1);
}

TEST(CompressionTraffic, TopkAtOnePercentSendsAtMostAFortiethOfTheGptsGradientBytes) {
  TempDir dir;
  train_gpt(dir, {"compression.plugin=topk", "compression.ratio=0.01", "compression.start_step=2"});
  expect_share(dir.path(), 1.0 / 25);
}

constexpr const char* kResumeRecipe = R"(
[run]
seed = 3
epochs = 10
eval = false
log_every = 3
threads = 1

[loader]
workers = 1
batch_size = 64

[dataset]
plugin = "synthetic"
samples = 512
input_shape = [1, 8, 8]

[model]
plugin = "cnn"
channels = [4, 8]
hidden = 16
dropout = 0.2

[optimizer]
plugin = "sgd"
lr = 0.05
momentum = 0.9

[strategy]
plugin = "ddp"

[compression]
plugin = "powersgd"
rank = 2
start_step = 2

[checkpoint]
plugin = "torch"
every_steps = 3
keep = 0
)";

TEST(CompressionResume, KillNineThenResumeWithPowerSgdIsBitwiseExactOnTwoRanks) {
  // 4 steps per epoch on 2 ranks; checkpoints every 3 steps land mid-epoch, with PowerSGD's
  // errors and Q already warm. The kill comes once step 6 is committed; both runs end at 15.
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", kResumeRecipe);
  auto argv = [&](const std::string& out) {
    return std::vector<std::string>{host_binary().string(),
                                    "launch",
                                    "--nproc-per-node",
                                    "2",
                                    recipe.string(),
                                    "--set",
                                    "run.max_steps=15",
                                    "--set",
                                    "run.output_dir=" + (dir / out).string(),
                                    "--set",
                                    "run.final_model_file=" + (dir / out / "final.pt").string()};
  };
  const auto whole = run_command(argv("whole"), source_dir(), 300);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);

  const fs::path step6 = dir / "crashed" / "checkpoints" / "step-000000006" / "manifest.toml";
  const auto crashed =
      run_command(argv("crashed"), source_dir(), 300, {}, [&] { return fs::exists(step6); });
  ASSERT_TRUE(crashed.killed) << "the run ended before the kill: " << describe(crashed);

  std::vector<std::string> resume = argv("crashed");
  resume.insert(resume.end(), {"--resume", "auto"});
  const auto resumed = run_command(resume, source_dir(), 300);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "[rank 0] resumed from");
  // The final checkpoints hold the same state, bit for bit: parameters, optimizer, and each
  // rank's own PowerSGD state (its error feedback, Q, the seed stream) in its own file.
  const std::map<std::string, StateDict> expected =
      expect_same_checkpoint_files(dir / "whole" / "checkpoints" / "step-000000015",
                                   dir / "crashed" / "checkpoints" / "step-000000015",
                                   {"shared.pt", "rank-00000.pt", "rank-00001.pt"});
  for (const char* file : {"rank-00000.pt", "rank-00001.pt"}) {
    EXPECT_TRUE(expected.at(file).tensors.count("compression.bucket0.error")) << file;
    EXPECT_TRUE(expected.at(file).tensors.count("compression.bucket0.q")) << file;
  }
}

// An mlp of 4 blocks on synthetic images: two pipeline stages over two data-parallel ranks.
constexpr const char* kPipelineRecipe = R"(
[run]
seed = 3
max_steps = 12
epochs = 10
eval = false
log_every = 1
threads = 1

[loader]
workers = 0
batch_size = 32

[dataset]
plugin = "synthetic"
samples = 512
input_shape = [1, 8, 8]

[model]
plugin = "mlp"
hidden = [64, 32, 16]

[optimizer]
plugin = "adamw"

[strategy]
plugin = "pipeline"
micro_batches = 2

[parallel]
pp = 2

[compression]
plugin = "topk"
ratio = 0.05
start_step = 2

[checkpoint]
plugin = "torch"
every_steps = 6
keep = 0

[sinks.jsonl]
)";

TEST(CompressionLayouts, PipelineStagesCompressOverTheirDataParallelRanksAndResumeExactly) {
  // pp 2 x dp 2 on four processes: each stage's gradients cross its dp group as top-k pairs.
  // A run stopped at step 6 and resumed ends where an uninterrupted one does, bit for bit.
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", kPipelineRecipe);
  const auto whole = run_launched(4, recipe, dir / "whole", {});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  const auto steps = traffic(dir / "whole");
  ASSERT_EQ(steps.size(), 12u);
  for (std::size_t step = 2; step < steps.size(); ++step) {
    EXPECT_LE(steps[step].sent, 0.15 * steps[step].uncompressed) << "step " << step + 1;
  }
  const auto first = run_launched(4, recipe, dir / "resumed", {"--set", "run.max_steps=6"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const auto rest = run_launched(4, recipe, dir / "resumed", {"--resume", "auto"});
  ASSERT_EQ(rest.exit_code, 0) << describe(rest);
  EXPECT_HAS(rest.err, "resumed from");
  const std::map<std::string, StateDict> expected = expect_same_checkpoint_files(
      dir / "whole" / "checkpoints" / "step-000000012",
      dir / "resumed" / "checkpoints" / "step-000000012", {"rank-00000.pt", "rank-00003.pt"});
  // Each stage's compression state in its own entries: stage 0 on rank 0, stage 1 on rank 3.
  EXPECT_TRUE(expected.at("rank-00000.pt").tensors.count("compression.stage0.bucket0.error"));
  EXPECT_TRUE(expected.at("rank-00003.pt").tensors.count("compression.stage1.bucket0.error"));
}

TEST(CompressionLayouts, DdpWithTensorParallelismCompressesItsDataParallelGradients) {
  // dp 2 x tp 2: each tp rank's pieces are bucketed and compressed over its dp group.
  TempDir dir;
  train_gpt(dir,
            {"parallel.tp=2", "compression.plugin=powersgd", "compression.rank=4",
             "compression.start_step=2"},
            4);
  const auto steps = traffic(dir.path());
  ASSERT_EQ(steps.size(), 5u);
  for (std::size_t step = 2; step < steps.size(); ++step) {
    EXPECT_LE(steps[step].sent, 0.1 * steps[step].uncompressed) << "step " << step + 1;
  }
}

TEST(CompressionBadInput, FsdpWithCompressionIsRefusedInOneLine) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", kResumeRecipe);
  const auto result = run_launched(2, recipe, dir / "out",
                                   {"--set", "strategy.plugin=fsdp", "--set", "run.max_steps=2"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err,
             "fsdp: [compression] replaces all-reduces of gradients, and fsdp "
             "reduce-scatters them");
}

TEST(CompressionBadInput, SettingsThatCannotWorkAreRefusedBeforeTraining) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", kResumeRecipe);
  const auto ratio = run_host({"validate", recipe.string(), "--set", "compression.plugin=topk",
                               "--set", "compression.ratio=1.5"});
  EXPECT_NE(ratio.exit_code, 0);
  EXPECT_HAS(ratio.err, "ratio");
  const auto rank = run_launched(2, recipe, dir / "out",
                                 {"--set", "compression.rank=100", "--set", "run.max_steps=2"});
  EXPECT_NE(rank.exit_code, 0);
  EXPECT_HAS(rank.err,
             "powersgd: rank 100 is above the smaller dimension of every gradient "
             "matrix");
}

}  // namespace
}  // namespace trainyard::testing
