// Multi-process runs over loopback: DDP against the single-process run on the global batch,
// SyncBatchNorm, accumulation with no_sync, the launcher, and failing or stuck ranks.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/runtime/cpu_binding.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A small, fast problem: synthetic images, SGD with momentum, no evaluation, no checkpoints.
std::string recipe_text(const std::string& model) {
  std::string text = R"(
[run]
seed = 3
max_steps = 6
eval = false
log_every = 2

[loader]
workers = 1

[dataset]
plugin = "synthetic"
samples = 512
eval_samples = 64
input_shape = [1, 8, 8]

[optimizer]
plugin = "sgd"
lr = 0.05
momentum = 0.9

[sinks.console]
)";
  if (model == "mlp") {
    text += "\n[model]\nplugin = \"mlp\"\nhidden = [32, 16]\n";
  } else {
    text += "\n[model]\nplugin = \"cnn\"\nchannels = [4, 8]\nhidden = 16\nbatch_norm = " +
            std::string(model == "cnn_bn" ? "true" : "false") + "\n";
  }
  return text;
}

std::vector<std::string> host_args(const fs::path& recipe, const fs::path& out,
                                   const std::vector<std::string>& extra) {
  std::vector<std::string> args = {recipe.string(),
                                   "--set",
                                   "run.threads=1",
                                   "--set",
                                   "run.output_dir=" + out.string(),
                                   "--set",
                                   "run.final_model_file=" + (out / "final.pt").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

CommandResult run_single(const fs::path& recipe, const fs::path& out,
                         const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {host_binary().string(), "run"};
  auto args = host_args(recipe, out, extra);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, source_dir(), 300);
}

CommandResult run_launch(int ranks, const fs::path& recipe, const fs::path& out,
                         const std::vector<std::string>& extra,
                         const std::vector<std::string>& env = {}, int timeout_s = 300) {
  std::vector<std::string> argv = {host_binary().string(), "launch", "--nproc-per-node",
                                   std::to_string(ranks)};
  auto args = host_args(recipe, out, extra);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, source_dir(), timeout_s, env);
}

// Starts `ranks` processes of `trainyard run` by hand with the torchrun variables (or, with
// `slurm`, the ones Slurm sets).
std::vector<CommandResult> run_by_hand(int ranks, const fs::path& recipe, const fs::path& out,
                                       const std::vector<std::string>& extra,
                                       const std::vector<std::string>& env = {},
                                       int timeout_s = 300, bool slurm = false) {
  const int port = free_loopback_port();
  std::vector<std::future<CommandResult>> pending;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> variables = env;
    std::vector<std::string> rendezvous =
        slurm ? std::vector<std::string>{"SLURM_PROCID=" + std::to_string(r),
                                         "SLURM_LOCALID=" + std::to_string(r),
                                         "SLURM_NTASKS=" + std::to_string(ranks),
                                         "SLURM_NTASKS_PER_NODE=" + std::to_string(ranks)}
              : std::vector<std::string>{"RANK=" + std::to_string(r),
                                         "LOCAL_RANK=" + std::to_string(r),
                                         "WORLD_SIZE=" + std::to_string(ranks),
                                         "LOCAL_WORLD_SIZE=" + std::to_string(ranks)};
    rendezvous.push_back("MASTER_ADDR=127.0.0.1");
    rendezvous.push_back("MASTER_PORT=" + std::to_string(port));
    for (const std::string& v : rendezvous) variables.push_back(v);
    std::vector<std::string> argv = {host_binary().string(), "run"};
    auto args = host_args(recipe, out, extra);
    argv.insert(argv.end(), args.begin(), args.end());
    pending.push_back(std::async(std::launch::async, [argv, variables, timeout_s] {
      return run_command(argv, source_dir(), timeout_s, variables);
    }));
  }
  std::vector<CommandResult> results;
  for (auto& future : pending) results.push_back(future.get());
  return results;
}

// Every tensor of `actual` matches `expected` within PyTorch's fp32 tolerances.
void expect_same_model(const fs::path& expected_file, const fs::path& actual_file) {
  TensorMap expected = read_tensor_file(expected_file);
  TensorMap actual = read_tensor_file(actual_file);
  ASSERT_EQ(expected.size(), actual.size());
  ASSERT_FALSE(expected.empty());
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << name;
    at::Tensor a = it->second.to(at::kDouble);
    at::Tensor e = tensor.to(at::kDouble);
    const double worst = ((a - e).abs() - (1e-5 + 1.3e-6 * e.abs())).max().item<double>();
    EXPECT_TRUE(at::allclose(a, e, 1.3e-6, 1e-5))
        << name << ": worst excess over the tolerance " << worst;
  }
}

// True when some tensor of `a` differs from `b`'s by more than the parity tolerance: parity of
// two runs says something only when training moved the parameters that far.
bool models_differ_beyond_tolerance(const fs::path& a_file, const fs::path& b_file) {
  TensorMap a = read_tensor_file(a_file);
  TensorMap b = read_tensor_file(b_file);
  for (const auto& [name, tensor] : a) {
    auto it = b.find(name);
    if (it == b.end() || !at::allclose(tensor.to(at::kDouble), it->second.to(at::kDouble), 1.3e-6,
                                       1e-5)) {
      return true;
    }
  }
  return a.size() != b.size();
}

// Parity: N ranks of per-rank batch B against one process on N*B, after several steps.
void expect_parity(const std::string& model, int ranks, std::int64_t batch,
                   const std::vector<std::string>& ddp_sets, std::int64_t accumulation = 1) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text(model));
  const std::int64_t global = batch * ranks * accumulation;
  auto single =
      run_single(recipe, dir / "single", {"--set", "loader.batch_size=" + std::to_string(global)});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  std::vector<std::string> sets = {
      "--set", "strategy.plugin=ddp",
      "--set", "loader.batch_size=" + std::to_string(batch),
      "--set", "run.grad_accumulation=" + std::to_string(accumulation)};
  sets.insert(sets.end(), ddp_sets.begin(), ddp_sets.end());
  auto ddp = run_launch(ranks, recipe, dir / "ddp", sets);
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
  expect_same_model(dir / "single" / "final.pt", dir / "ddp" / "final.pt");
  // The reference is not trivially equal to the start: its later steps moved the parameters
  // beyond the tolerance (a run that does not train would match any other such run).
  auto first_step = run_single(recipe, dir / "first_step",
                               {"--set", "loader.batch_size=" + std::to_string(global), "--set",
                                "run.max_steps=1"});
  ASSERT_EQ(first_step.exit_code, 0) << describe(first_step);
  EXPECT_TRUE(models_differ_beyond_tolerance(dir / "first_step" / "final.pt",
                                             dir / "single" / "final.pt"))
      << "the parameters after one step and after every step are the same";
}

TEST(DdpParity, MlpTwoRanksMatchesSingleOnGlobalBatch) { expect_parity("mlp", 2, 16, {}); }
TEST(DdpParity, MlpFourRanksMatchesSingleOnGlobalBatch) { expect_parity("mlp", 4, 8, {}); }
TEST(DdpParity, CnnTwoRanksMatchesSingleOnGlobalBatch) { expect_parity("cnn", 2, 16, {}); }
TEST(DdpParity, CnnFourRanksMatchesSingleOnGlobalBatch) { expect_parity("cnn", 4, 8, {}); }

TEST(DdpParity, SmallBucketsMatchSingle) {
  // Many buckets (a few KiB each) exercise the launch order.
  expect_parity("cnn", 2, 16, {"--set", "strategy.bucket_cap_mb=0.002"});
}

TEST(DdpParity, GradientsCopiedOutOfTheBucketsMatchSingle) {
  // Separate gradients (not views into the buckets), copied in before and out after the
  // all-reduce; with accumulation they also sum into the separate tensors.
  expect_parity("cnn", 2, 8, {"--set", "strategy.gradient_as_bucket_view=false"}, 2);
}

TEST(DdpParity, ActivationCheckpointingComposesWithDdp) {
  // Step mechanics every strategy honours: recomputed blocks (hooks still fire) on 2 ranks match
  // the single process on the global batch, which recomputes too.
  expect_parity("cnn", 2, 16, {"--set", "run.activation_checkpointing=all"});
}

TEST(DdpParity, WithoutOverlapMatchesSingle) {
  expect_parity("mlp", 2, 16, {"--set", "strategy.overlap=false"});
}

TEST(DdpParity, SyncBatchNormMatchesSingleOnGlobalBatch) {
  // Parameters and BatchNorm running statistics both come from the global batch.
  expect_parity("cnn_bn", 2, 16, {"--set", "strategy.sync_batchnorm=true"});
}

TEST(DdpParity, SyncBatchNormFourRanksMatchesSingle) {
  expect_parity("cnn_bn", 4, 8, {"--set", "strategy.sync_batchnorm=true"});
}

TEST(DdpParity, WithoutSyncBatchNormStatisticsDiffer) {
  // The check above can fail: plain BatchNorm normalises each rank's batch on its own.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("cnn_bn"));
  auto single = run_single(recipe, dir / "single", {"--set", "loader.batch_size=32"});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto ddp = run_launch(2, recipe, dir / "ddp",
                        {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"});
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
  // Which ddp says, once, naming the fix.
  const std::string warning = "ddp: the model's BatchNorm layers normalise each rank's own batch";
  EXPECT_HAS(ddp.err, warning);
  EXPECT_EQ(ddp.err.find(warning), ddp.err.rfind(warning)) << ddp.err;
  EXPECT_HAS(ddp.err, "set strategy.sync_batchnorm = true to normalise over all 2 data-parallel");
  TensorMap expected = read_tensor_file(dir / "single" / "final.pt");
  TensorMap actual = read_tensor_file(dir / "ddp" / "final.pt");
  bool differs = false;
  for (const auto& [name, tensor] : expected) {
    if (!at::allclose(actual.at(name).to(at::kDouble), tensor.to(at::kDouble), 1.3e-6, 1e-5)) {
      differs = true;
    }
  }
  EXPECT_TRUE(differs);
}

TEST(DdpParity, AccumulationWithNoSyncMatchesLargeBatch) {
  // 2 ranks x 3 micro-batches of 8 against one process on 48.
  expect_parity("cnn", 2, 8, {}, 3);
}

// Logged figures are those of the global batch whatever the mesh: the train loss is the mean
// over the ranks holding a loss, the eval figures count every sample once. Each rank's own loss
// is the mean of its half of the batch, which differs from the whole batch's.
TEST(DdpParity, LoggedLossIsTheGlobalBatchsLoss) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  const std::vector<std::string> logging = {
      "--set", "run.log_every=1", "--set", "run.eval=true", "--set", "sinks.jsonl.enabled=true"};
  std::vector<std::string> single_sets = logging;
  single_sets.insert(single_sets.end(), {"--set", "loader.batch_size=32"});
  auto single = run_single(recipe, dir / "single", single_sets);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  std::vector<std::string> ddp_sets = logging;
  ddp_sets.insert(ddp_sets.end(),
                  {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"});
  auto ddp = run_launch(2, recipe, dir / "ddp", ddp_sets);
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);

  auto close = [](double actual, double expected) {
    return std::abs(actual - expected) <= 1e-5 + 1.3e-6 * std::abs(expected);
  };
  auto expected = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "train");
  ASSERT_EQ(expected.size(), 6u);
  for (const char* file : {"metrics.rank0.jsonl", "metrics.rank1.jsonl"}) {
    auto train = of_phase(read_metrics(dir / "ddp" / file), "train");
    ASSERT_EQ(train.size(), expected.size()) << file;
    for (std::size_t i = 0; i < train.size(); ++i) {
      EXPECT_TRUE(close(train[i].at("loss"), expected[i].at("loss")))
          << file << " step " << i + 1 << ": " << train[i].at("loss") << " against "
          << expected[i].at("loss");
    }
    auto eval = of_phase(read_metrics(dir / "ddp" / file), "eval");
    auto expected_eval = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "eval");
    ASSERT_EQ(eval.size(), 1u);
    ASSERT_EQ(expected_eval.size(), 1u);
    EXPECT_EQ(eval[0].at("samples"), expected_eval[0].at("samples"));
    EXPECT_TRUE(close(eval[0].at("loss"), expected_eval[0].at("loss")));
    EXPECT_TRUE(close(eval[0].at("accuracy"), expected_eval[0].at("accuracy")));
  }
  // The losses moved: the comparison is not of one repeated number.
  EXPECT_NE(expected.front().at("loss"), expected.back().at("loss"));
}

TEST(DdpParity, ExplicitDataShardTrainsExactlyAsTheDefaultMesh) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("cnn"));
  const std::vector<std::string> sets = {"--set", "strategy.plugin=ddp", "--set",
                                         "loader.batch_size=16"};
  auto plain = run_launch(2, recipe, dir / "plain", sets);
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  std::vector<std::string> explicit_sets = sets;
  explicit_sets.insert(explicit_sets.end(), {"--set", "parallel.dp_shard=2"});
  auto explicit_mesh = run_launch(2, recipe, dir / "explicit", explicit_sets);
  ASSERT_EQ(explicit_mesh.exit_code, 0) << describe(explicit_mesh);
  EXPECT_HAS(explicit_mesh.err, ", mesh pp 1 x dp_replicate 1 x dp_shard 2 x tp 1");
  TensorMap expected = read_tensor_file(dir / "plain" / "final.pt");
  TensorMap actual = read_tensor_file(dir / "explicit" / "final.pt");
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, actual.at(name))) << name;
  }
}

TEST(DdpRun, ParallelLayoutThatDoesNotMatchTheWorldIsRefused) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result =
      run_launch(2, recipe, dir / "out",
                 {"--set", "strategy.plugin=ddp", "--set", "parallel.dp_shard=3"}, {}, 120);
  ASSERT_FALSE(result.timed_out) << describe(result);
  EXPECT_NE(result.exit_code, 0);
  const std::string reason =
      "trainyard: error: parallel: pp 1 x dp_replicate 1 x dp_shard 3 x tp 1 makes 3 ranks, but "
      "there are 2\n";
  // Every rank refuses it before connecting; the launcher may stop the second before it prints.
  EXPECT_HAS(result.err, "] " + reason);
  EXPECT_EQ(result.out.find("step"), std::string::npos) << result.out;
}

TEST(DdpRun, AccumulationSynchronisesOnlyTheLastMicroBatch) {
  // One bucket (the default sizes hold the whole small mlp): one all-reduce per optimizer
  // step, not one per micro-batch.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result = run_launch(2, recipe, dir / "out",
                           {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=8", "--set",
                            "run.grad_accumulation=4", "--set", "sinks.jsonl.enabled=true"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  auto train = of_phase(read_metrics(dir / "out" / "metrics.rank1.jsonl"), "train");
  ASSERT_FALSE(train.empty());
  for (const auto& record : train) {
    EXPECT_EQ(record.at("allreduces_per_step"), 1.0);
    EXPECT_GE(record.at("comm_wait_ms"), 0.0);
    // Counted by the mesh: dp and dp_shard are the one world group of the two ranks; its one
    // call a step hands c10d the fp32 bucket.
    EXPECT_EQ(record.at("comm_dp/dp_shard_calls"), 1.0);
    EXPECT_GT(record.at("comm_dp/dp_shard_bytes"), 0.0);
    EXPECT_EQ(std::fmod(record.at("comm_dp/dp_shard_bytes"), 4.0), 0.0);
  }
}

TEST(DdpRun, RanksStartedByHandTrainAndReportGlobalEval) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto results = run_by_hand(2, recipe, dir / "out",
                             {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16",
                              "--set", "run.eval=true", "--set", "sinks.jsonl.enabled=true"});
  for (const auto& result : results) ASSERT_EQ(result.exit_code, 0) << describe(result);
  // Every rank writes its own file, and both report the eval metric of the whole test split.
  auto eval0 = of_phase(read_metrics(dir / "out" / "metrics.rank0.jsonl"), "eval");
  auto eval1 = of_phase(read_metrics(dir / "out" / "metrics.rank1.jsonl"), "eval");
  ASSERT_EQ(eval0.size(), 1u);
  ASSERT_EQ(eval1.size(), 1u);
  EXPECT_EQ(eval0[0].at("samples"), 64);
  EXPECT_EQ(eval1[0].at("samples"), 64);
  EXPECT_DOUBLE_EQ(eval0[0].at("accuracy"), eval1[0].at("accuracy"));
  EXPECT_DOUBLE_EQ(eval0[0].at("loss"), eval1[0].at("loss"));
  // Console metrics come from rank 0 only.
  EXPECT_HAS(results[0].out, "step 6/6");
  EXPECT_EQ(results[1].out.find("step 6/6"), std::string::npos) << results[1].out;
}

TEST(DdpRun, RanksStartedBySlurmVariablesTrain) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto results = run_by_hand(2, recipe, dir / "out",
                             {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"}, {},
                             300, /*slurm=*/true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << describe(results[r]);
    EXPECT_HAS(results[r].err, "trainyard: rank " + std::to_string(r) + " of 2 (local " +
                                   std::to_string(r) + " of 2)");
  }
  EXPECT_TRUE(fs::exists(dir / "out" / "final.pt"));
}

TEST(DdpRun, SingleStrategyWithSeveralRanksIsRefused) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result = run_launch(2, recipe, dir / "out", {});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err, "strategy 'single' runs one process");
}

TEST(DdpCheckpoint, KillNineMidEpochThenResumeAutoIsBitwiseExactOnTwoRanks) {
  // 512 samples, batch 64 per rank on 2 ranks: 4 steps per epoch; checkpoints every 3 steps
  // land mid-epoch. The kill comes once step 6 is committed; both runs end at step 18.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("cnn_bn") +
                                             "\n[checkpoint]\nplugin = \"torch\"\nevery_steps = 3\n"
                                             "keep = 0\n");
  const std::vector<std::string> extra = {
      "--set", "strategy.plugin=ddp", "--set", "strategy.sync_batchnorm=true",
      "--set", "run.max_steps=18",    "--set", "run.epochs=10",
      "--set", "model.dropout=0.2"};
  auto whole = run_launch(2, recipe, dir / "whole", extra);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  EXPECT_EQ(whole.err.find("BatchNorm layers normalise each rank's own batch"), std::string::npos);

  std::vector<std::string> argv = {host_binary().string(), "launch", "--nproc-per-node", "2"};
  for (const auto& arg : host_args(recipe, dir / "crashed", extra)) argv.push_back(arg);
  const fs::path step6 = dir / "crashed" / "checkpoints" / "step-000000006" / "manifest.toml";
  auto crashed = run_command(argv, source_dir(), 300, {}, [&] { return fs::exists(step6); });
  ASSERT_TRUE(crashed.killed) << "the run ended before the kill: " << describe(crashed);
  ASSERT_FALSE(fs::exists(dir / "crashed" / "final.pt"));

  std::vector<std::string> resume = extra;
  resume.insert(resume.end(), {"--resume", "auto"});
  auto resumed = run_launch(2, recipe, dir / "crashed", resume);
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "[rank 0] resumed from");
  EXPECT_HAS(resumed.err, "[rank 1] resumed from");
  // Both ranks wrote their own file into each checkpoint, rank 0 the shared one.
  for (const char* file : {"shared.pt", "rank-00000.pt", "rank-00001.pt"}) {
    EXPECT_TRUE(fs::exists(dir / "crashed" / "checkpoints" / "step-000000018" / file)) << file;
  }
  TensorMap expected = read_tensor_file(dir / "whole" / "final.pt");
  TensorMap actual = read_tensor_file(dir / "crashed" / "final.pt");
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, actual.at(name))) << name << " differs after the resume";
  }
}

TEST(Launch, SetsVariablesPrefixesOutputAndSucceeds) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result = run_launch(2, recipe, dir / "out",
                           {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  // Each rank announces what it was given: rank, world, local rank, local world, store.
  for (int r = 0; r < 2; ++r) {
    std::regex line("\\[rank " + std::to_string(r) + "\\] trainyard: rank " + std::to_string(r) +
                    " of 2 \\(local " + std::to_string(r) +
                    " of 2\\), store 127\\.0\\.0\\.1:[0-9]+, comm gloo, 1 threads on cpu");
    EXPECT_TRUE(std::regex_search(result.err, line)) << result.err;
  }
  // Console lines of rank 0, prefixed.
  EXPECT_HAS(result.out, "[rank 0] step 6/6");
  EXPECT_EQ(result.out.find("[rank 1] step"), std::string::npos) << result.out;
}

TEST(Launch, BindsEachRankToItsOwnCpus) {
  const std::vector<int> allowed = allowed_cpus();
  if (allowed.size() < 2) TRAINYARD_SKIP_MISSING() << "needs 2 CPUs, " << allowed.size() << " allowed";
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto bound = run_launch(2, recipe, dir / "bound",
                          {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16", "--set",
                           "run.cpu_binding=cores"});
  ASSERT_EQ(bound.exit_code, 0) << describe(bound);
  // The CPUs each rank reports are read back from its own affinity mask.
  for (int r = 0; r < 2; ++r) {
    EXPECT_HAS(bound.err, "[rank " + std::to_string(r) + "] trainyard: rank " + std::to_string(r) +
                              " of 2 (local " + std::to_string(r) + " of 2), store");
    EXPECT_HAS(bound.err, "1 threads on cpu, bound to cpus " +
                              std::to_string(allowed[static_cast<std::size_t>(r)]) + ", mesh ");
  }
  auto unbound = run_launch(2, recipe, dir / "unbound",
                            {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16",
                             "--set", "run.cpu_binding=none"});
  ASSERT_EQ(unbound.exit_code, 0) << describe(unbound);
  EXPECT_EQ(unbound.err.find("bound to"), std::string::npos) << unbound.err;
  // More threads than CPUs cannot be bound: a one-line error before training.
  const std::string too_many = std::to_string(allowed.size() + 1);
  auto refused = run_single(recipe, dir / "refused",
                            {"--set", "run.cpu_binding=cores", "--set", "run.threads=" + too_many});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_HAS(refused.err, "run.cpu_binding = \"cores\" needs " + too_many +
                              " CPUs (1 local ranks x " + too_many + " threads)");
}

TEST(Launch, ExitStatusIsTheFirstFailingRanks) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result = run_launch(2, recipe, dir / "out",
                           {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"},
                           {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=2"});
  EXPECT_EQ(result.exit_code, 3) << describe(result);
  EXPECT_HAS(result.err, "trainyard launch: rank 1 exited with status 3");
}

TEST(Launch, ACrashingRankPrintsItsCallStackAndStopsTheJob) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  auto result = run_launch(
      2, recipe, dir / "out", {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16"},
      {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=2",
       "TRAINYARD_TEST_FAIL_MODE=crash"},
      120);
  ASSERT_FALSE(result.timed_out) << describe(result);
  EXPECT_EQ(result.exit_code, 128 + SIGSEGV) << describe(result);
  EXPECT_HAS(result.err,
             "trainyard: fatal: segmentation fault (SIGSEGV) in trainyard rank 1 (pid ");
  EXPECT_HAS(result.err, "at address 0x10; call stack:");
  // The frames name the function that crashed (the SDK exports its symbols).
  EXPECT_HAS(result.err, "test_failure_hook");
  EXPECT_HAS(result.err, "trainyard launch: rank 1 was killed by signal Segmentation fault");
}

TEST(Launch, RejectsBadArguments) {
  auto result = run_host({"launch", "recipes/fashion_mnist_mlp.toml"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err, "--nproc-per-node must be >= 1");
  result = run_host({"launch", "-n", "2", "--nnodes", "2", "recipes/fashion_mnist_mlp.toml"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err, "--master-port is required");
}

// Failures: every rank ends within the timeout, naming the rank that failed.
constexpr int kCommTimeout = 10;

std::vector<std::string> failure_sets() {
  return {
      "--set", "strategy.plugin=ddp", "--set", "loader.batch_size=16",
      "--set", "run.max_steps=40",    "--set", "comm.timeout_s=" + std::to_string(kCommTimeout)};
}

TEST(DdpFailure, RankThatExitsIsNamedByTheOthers) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  const auto start = Clock::now();
  auto results = run_by_hand(3, recipe, dir / "out", failure_sets(),
                             {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=3"}, 120);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(results[1].exit_code, 3) << describe(results[1]);
  for (int r : {0, 2}) {
    EXPECT_FALSE(results[r].timed_out);
    EXPECT_EQ(results[r].exit_code, 1) << describe(results[r]);
    EXPECT_HAS(results[r].err, "rank 1 failed");
  }
  EXPECT_LT(seconds, kCommTimeout + 30);
}

TEST(DdpFailure, RankThatExitsUnderTheLauncher) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  const auto start = Clock::now();
  auto result = run_launch(2, recipe, dir / "out", failure_sets(),
                           {"TRAINYARD_TEST_FAIL_RANK=0", "TRAINYARD_TEST_FAIL_AT_STEP=3"}, 120);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_FALSE(result.timed_out);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err, "trainyard launch: rank 0 exited with status 3");
  EXPECT_LT(seconds, kCommTimeout + 30);
}

TEST(DdpFailure, RankThatStopsCallingCollectivesIsNamed) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  const auto start = Clock::now();
  auto results = run_by_hand(2, recipe, dir / "out", failure_sets(),
                             {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=3",
                              "TRAINYARD_TEST_FAIL_MODE=hang"},
                             120);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const auto& result : results) {
    EXPECT_FALSE(result.timed_out) << describe(result);
    EXPECT_EQ(result.exit_code, 1) << describe(result);
  }
  EXPECT_HAS(results[0].err, "rank 1 stopped calling collectives");
  // The stuck rank itself is stopped once the failure is known.
  EXPECT_HAS(results[1].err, "rank 1 stopped calling collectives");
  EXPECT_LT(seconds, kCommTimeout + 30);
}

TEST(DdpFailure, StuckRankUnderTheLauncherIsReported) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", recipe_text("mlp"));
  const auto start = Clock::now();
  auto result = run_launch(2, recipe, dir / "out", failure_sets(),
                           {"TRAINYARD_TEST_FAIL_RANK=1", "TRAINYARD_TEST_FAIL_AT_STEP=3",
                            "TRAINYARD_TEST_FAIL_MODE=hang"},
                           120);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_FALSE(result.timed_out);
  EXPECT_NE(result.exit_code, 0);
  EXPECT_HAS(result.err, "trainyard launch: failure: rank 1 stopped calling collectives");
  EXPECT_LT(seconds, kCommTimeout + 30);
}

}  // namespace
}  // namespace trainyard::testing
