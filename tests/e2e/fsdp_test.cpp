// Multi-process runs of the fsdp strategy over loopback: every sharding mode against ddp on the
// same global batch (losses and parameters), on the cnn and a small gpt, on 2 and 4 ranks; sharded
// checkpoints that resume on the same and on fewer ranks; consolidation by checkpoint export.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// The cnn on synthetic images with AdamW (optimizer state to shard), no evaluation.
std::string cnn_recipe() {
  return R"(
[run]
seed = 3
max_steps = 6
eval = false
log_every = 1

[loader]
workers = 1

[dataset]
plugin = "synthetic"
samples = 512
eval_samples = 64
input_shape = [1, 8, 8]

[model]
plugin = "cnn"
channels = [4, 8]
hidden = 16
batch_norm = false

[optimizer]
plugin = "adamw"
lr = 0.01
weight_decay = 0.01

[sinks.console]
[sinks.jsonl]
)";
}

// A 2-layer gpt (tied embedding and head: a root unit) on a small byte-level text.
std::string gpt_recipe(const TempDir& dir) {
  std::string corpus;
  for (int i = 0; i < 400; ++i) {
    corpus += "sample " + std::to_string(i * 7919 % 1000) + " of the small corpus, line " +
              std::to_string(i) + ".\n";
  }
  dir.write("corpus.txt", corpus);
  return R"(
[run]
seed = 5
max_steps = 5
eval = false
log_every = 1

[loader]
workers = 1

[dataset]
plugin = "text"
path = ")" +
         (dir / "corpus.txt").string() +
         R"("
tokenizer = "byte"
seq_len = 16
cache = ")" +
         (dir / "cache").string() +
         R"("

[model]
plugin = "gpt"
n_layers = 2
n_heads = 2
d_model = 16

[optimizer]
plugin = "adamw"
lr = 0.01
weight_decay = 0.01

[sinks.console]
[sinks.jsonl]
)";
}

CommandResult launch(int ranks, const fs::path& recipe, const fs::path& out,
                     const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {host_binary().string(),
                                   "launch",
                                   "--nproc-per-node",
                                   std::to_string(ranks),
                                   recipe.string(),
                                   "--set",
                                   "run.threads=1",
                                   "--set",
                                   "run.output_dir=" + out.string(),
                                   "--set",
                                   "run.final_model_file=" + (out / "final.pt").string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, source_dir(), 600);
}

bool close(double actual, double expected, double rtol, double atol) {
  return std::abs(actual - expected) <= atol + rtol * std::abs(expected);
}

// `actual` matches `expected` within `rtol`, `atol`, element by element.
void expect_close(const std::string& where, const at::Tensor& actual, const at::Tensor& expected,
                  double rtol, double atol) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << where;
  const at::Tensor a = actual.to(at::kDouble);
  const at::Tensor e = expected.to(at::kDouble);
  const double worst = ((a - e).abs() - (atol + rtol * e.abs())).max().item<double>();
  EXPECT_TRUE(at::allclose(a, e, rtol, atol))
      << where << ": worst excess over the tolerance " << worst;
}

// Every tensor of `actual` matches `expected` within `rtol`, `atol`, except the key third of a
// gpt's fused q/k/v bias where `key_bias_atol` is given. That third has no effect on the loss (a
// constant added to a row of attention scores leaves its softmax unchanged), so its gradient is
// zero but for rounding, and AdamW turns that noise, whatever its size, into steps of about lr:
// runs whose reductions round differently end with different key biases, which are held to
// `key_bias_atol` (lr × steps) of each other.
void expect_same_model(const fs::path& expected_file, const fs::path& actual_file,
                       double rtol = 1.3e-6, double atol = 1e-5, double key_bias_atol = 0.0) {
  TensorMap expected = read_tensor_file(expected_file);
  TensorMap actual = read_tensor_file(actual_file);
  ASSERT_EQ(expected.size(), actual.size());
  ASSERT_FALSE(expected.empty());
  for (const auto& [name, tensor] : expected) {
    auto it = actual.find(name);
    ASSERT_NE(it, actual.end()) << name;
    const std::string where = actual_file.string() + " " + name;
    const bool fused_bias = name.size() > 9 && name.ends_with(".qkv.bias");
    if (key_bias_atol > 0 && fused_bias) {
      const std::int64_t d = tensor.size(0) / 3;
      expect_close(where + " (query)", it->second.narrow(0, 0, d), tensor.narrow(0, 0, d), rtol,
                   atol);
      expect_close(where + " (key)", it->second.narrow(0, d, d), tensor.narrow(0, d, d), 0.0,
                   key_bias_atol);
      expect_close(where + " (value)", it->second.narrow(0, 2 * d, d), tensor.narrow(0, 2 * d, d),
                   rtol, atol);
    } else {
      expect_close(where, it->second, tensor, rtol, atol);
    }
  }
}

std::vector<double> train_losses(const fs::path& out) {
  std::vector<double> losses;
  for (const auto& line : of_phase(read_metrics(out / "metrics.rank0.jsonl"), "train")) {
    losses.push_back(line.at("loss"));
  }
  return losses;
}

void expect_same_losses(const fs::path& expected, const fs::path& actual, double rtol,
                        double atol) {
  auto e = train_losses(expected);
  auto a = train_losses(actual);
  ASSERT_EQ(e.size(), a.size());
  ASSERT_FALSE(e.empty());
  for (std::size_t i = 0; i < e.size(); ++i) {
    EXPECT_TRUE(close(a[i], e[i], rtol, atol))
        << actual << " step " << i + 1 << ": loss " << a[i] << " against " << e[i];
  }
}

// ddp and every given fsdp sharding on `ranks` ranks of `batch` samples each: same losses and
// parameters within fp32 tolerances.
void expect_matches_ddp(const std::string& model, int ranks, std::int64_t batch,
                        const std::vector<std::string>& shardings,
                        const std::vector<std::string>& common = {}) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", model == "gpt" ? gpt_recipe(dir) : cnn_recipe());
  std::vector<std::string> sets = {"--set", "loader.batch_size=" + std::to_string(batch)};
  sets.insert(sets.end(), common.begin(), common.end());
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), sets.begin(), sets.end());
    return extra;
  };
  auto ddp = launch(ranks, recipe, dir / "ddp", with({"--set", "strategy.plugin=ddp"}));
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
  for (const auto& sharding : shardings) {
    const fs::path out = dir / ("fsdp_" + sharding);
    auto fsdp =
        launch(ranks, recipe, out,
               with({"--set", "strategy.plugin=fsdp", "--set", "strategy.sharding=" + sharding}));
    ASSERT_EQ(fsdp.exit_code, 0) << describe(fsdp);
    expect_same_losses(dir / "ddp", out, 1.3e-6, 1e-5);
    // The gpt recipe: lr 0.01 over 5 steps bounds the key bias (see expect_same_model).
    expect_same_model(dir / "ddp" / "final.pt", out / "final.pt", 1.3e-6, 1e-5,
                      model == "gpt" ? 0.01 * 5 : 0.0);
  }
}

TEST(FsdpParity, CnnTwoRanksEveryShardingMatchesDdp) {
  expect_matches_ddp("cnn", 2, 16, {"full", "grad_op", "none"});
}

TEST(FsdpParity, CnnFourRanksMatchesDdp) { expect_matches_ddp("cnn", 4, 8, {"full", "grad_op"}); }

TEST(FsdpParity, GptTwoRanksMatchesDdp) { expect_matches_ddp("gpt", 2, 4, {"full", "grad_op"}); }

TEST(FsdpParity, GptFourRanksMatchesDdp) { expect_matches_ddp("gpt", 4, 2, {"full", "grad_op"}); }

TEST(FsdpParity, AccumulationAndGlobalNormClippingMatchDdp) {
  // Clipping at 0.05 is active at every step (the cnn's gradient norm starts near 1): the norm
  // must be the global one over every shard. Accumulation reduces only on the last micro-batch.
  expect_matches_ddp("cnn", 2, 8, {"full"},
                     {"--set", "run.grad_accumulation=2", "--set", "run.max_grad_norm=0.05"});
}

TEST(FsdpParity, ActivationCheckpointingComposes) {
  // Recomputed blocks run their forward again inside backward: their parameters are gathered
  // again there, and their gradients still reach the reduce-scatter hooks.
  expect_matches_ddp("gpt", 2, 4, {"full", "grad_op"},
                     {"--set", "run.activation_checkpointing=all"});
}

TEST(FsdpRun, EvaluationOfAnUnevenSplitReportsTheWholeSplit) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe());
  for (const std::string strategy : {"ddp", "fsdp"}) {
    auto result = launch(2, recipe, dir / strategy,
                         {"--set", "strategy.plugin=" + strategy, "--set", "loader.batch_size=16",
                          "--set", "run.eval=true", "--set", "loader.eval_batch_size=16", "--set",
                          "dataset.eval_samples=65"});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
  }
  auto ddp = of_phase(read_metrics(dir / "ddp" / "metrics.rank1.jsonl"), "eval");
  auto fsdp = of_phase(read_metrics(dir / "fsdp" / "metrics.rank1.jsonl"), "eval");
  ASSERT_EQ(ddp.size(), 1u);
  ASSERT_EQ(fsdp.size(), 1u);
  // 65 samples: rank 0 reads 33 (3 batches), rank 1 reads 32 (2 batches) and repeats one.
  EXPECT_EQ(fsdp[0].at("samples"), 65);
  EXPECT_TRUE(close(fsdp[0].at("loss"), ddp[0].at("loss"), 1e-5, 1e-6));
  EXPECT_EQ(fsdp[0].at("accuracy"), ddp[0].at("accuracy"));
}

TEST(FsdpRun, BadOptionsAreRefusedWithTheirName) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe());
  for (const std::string bad : {"strategy.sharding=everything", "strategy.param_dtype=int8",
                                "strategy.state_dict=partial"}) {
    auto result = run_host({"run", recipe.string(), "--set", "strategy.plugin=fsdp", "--set", bad,
                            "--set", "run.output_dir=" + (dir / "out").string()});
    EXPECT_EQ(result.exit_code, 1) << describe(result);
    EXPECT_HAS(result.err, "trainyard: error:");
    EXPECT_HAS(result.err, bad.substr(9, bad.find('=') - 9));
  }
}

TEST(FsdpParity, Bf16LossCurveFollowsDdp) {
  // Both autocast to bf16, so both run their matrix products on the same bf16-rounded weights
  // and produce the same bf16 weight gradients (ddp casts them to fp32 exactly; fsdp reduces them
  // in fp32): on the cnn the curves agree exactly. Where autocast computes in fp32 from the
  // weights themselves (the gpt's LayerNorms) fsdp's gathered weights are bf16-rounded (2^-9
  // relative) where ddp's are fp32; AdamW passes that on at most at the order of lr * 2^-8 per
  // step, so over a few steps the losses (near ln 256 = 5.5 for the gpt) stay within 1% of each
  // other, while one lost or doubled micro-batch moves them by several percent.
  for (const std::string model : {"cnn", "gpt"}) {
    TempDir dir;
    auto recipe = dir.write("recipe.toml", (model == "gpt" ? gpt_recipe(dir) : cnn_recipe()) +
                                               "\n[precision]\nplugin = \"bf16\"\n");
    const std::vector<std::string> sets = {
        "--set", model == "gpt" ? "loader.batch_size=4" : "loader.batch_size=16"};
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.begin(), sets.begin(), sets.end());
      return extra;
    };
    auto ddp = launch(2, recipe, dir / "ddp", with({"--set", "strategy.plugin=ddp"}));
    ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
    auto fsdp = launch(2, recipe, dir / "fsdp", with({"--set", "strategy.plugin=fsdp"}));
    ASSERT_EQ(fsdp.exit_code, 0) << describe(fsdp);
    auto e = train_losses(dir / "ddp");
    auto a = train_losses(dir / "fsdp");
    ASSERT_EQ(e.size(), a.size());
    ASSERT_FALSE(e.empty());
    double worst = 0;
    for (std::size_t i = 0; i < e.size(); ++i)
      worst = std::max(worst, std::abs(a[i] - e[i]) / e[i]);
    std::cout << "bf16 " << model << ": largest relative loss difference fsdp vs ddp over "
              << e.size() << " steps: " << worst << std::endl;
    EXPECT_LE(worst, 0.01) << model;
    // Parameters: AdamW moves each element by at most about lr per step whatever its gradient,
    // so where bf16 rounding turns a near-zero gradient around, the two runs part by up to
    // 2 lr per step; beyond that bound (5 or 6 steps of lr 0.01) something else went wrong.
    expect_same_model(dir / "ddp" / "final.pt", dir / "fsdp" / "final.pt", 0.0,
                      2 * 0.01 * static_cast<double>(e.size()));
  }
}

// BatchNorm's running statistics stay float32, and LibTorch's batch_norm takes bfloat16 weights
// only with running statistics of that dtype. Under param_dtype "auto" fsdp therefore gathers a
// model with BatchNorm layers in float32 (as PyTorch's FSDP keeps BatchNorm in full precision),
// which is ddp's arithmetic under the same autocast: the losses agree within fp32 tolerances. An
// explicit bfloat16 is refused with a one-line error naming the option.
TEST(FsdpParity, Bf16WithBatchNormGathersFloat32AndFollowsDdp) {
  TempDir dir;
  std::string text = cnn_recipe();
  const std::string off = "batch_norm = false";
  ASSERT_NE(text.find(off), std::string::npos);
  text.replace(text.find(off), off.size(), "batch_norm = true");
  auto recipe = dir.write("recipe.toml", text + "\n[precision]\nplugin = \"bf16\"\n");
  auto ddp = launch(2, recipe, dir / "ddp",
                    {"--set", "loader.batch_size=16", "--set", "strategy.plugin=ddp"});
  ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
  auto fsdp = launch(2, recipe, dir / "fsdp",
                     {"--set", "loader.batch_size=16", "--set", "strategy.plugin=fsdp"});
  ASSERT_EQ(fsdp.exit_code, 0) << describe(fsdp);
  EXPECT_HAS(fsdp.err, "fsdp: parameters gathered in float32 (param_dtype auto)");
  expect_same_losses(dir / "ddp", dir / "fsdp", 1.3e-6, 1e-5);
  auto refused =
      launch(2, recipe, dir / "refused",
             {"--set", "strategy.plugin=fsdp", "--set", "strategy.param_dtype=bfloat16"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_HAS(refused.err,
             "fsdp: param_dtype = \"bfloat16\" cannot serve the model's BatchNorm layers");
}

TEST(Zero1Parity, DdpWithShardedOptimizerStateMatchesDdp) {
  for (int ranks : {2, 4}) {
    TempDir dir;
    auto recipe = dir.write("recipe.toml", cnn_recipe());
    const std::vector<std::string> sets = {"--set", "strategy.plugin=ddp", "--set",
                                           "loader.batch_size=" + std::to_string(32 / ranks)};
    auto ddp = launch(ranks, recipe, dir / "ddp", sets);
    ASSERT_EQ(ddp.exit_code, 0) << describe(ddp);
    std::vector<std::string> zero1 = sets;
    zero1.insert(zero1.end(), {"--set", "strategy.zero1=true"});
    auto sharded = launch(ranks, recipe, dir / "zero1", zero1);
    ASSERT_EQ(sharded.exit_code, 0) << describe(sharded);
    expect_same_losses(dir / "ddp", dir / "zero1", 1.3e-6, 1e-5);
    expect_same_model(dir / "ddp" / "final.pt", dir / "zero1" / "final.pt");
  }
}

CommandResult run_one(const fs::path& recipe, const fs::path& out,
                      const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {host_binary().string(),
                                   "run",
                                   recipe.string(),
                                   "--set",
                                   "run.threads=1",
                                   "--set",
                                   "run.output_dir=" + out.string(),
                                   "--set",
                                   "run.final_model_file=" + (out / "final.pt").string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, source_dir(), 600);
}

void expect_bitwise_same_model(const fs::path& expected_file, const fs::path& actual_file) {
  TensorMap expected = read_tensor_file(expected_file);
  TensorMap actual = read_tensor_file(actual_file);
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, actual.at(name))) << name << " differs";
  }
}

const std::string kCheckpointSection = "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n";

TEST(FsdpCheckpoint, ShardedSaveResumesBitForBitOnTheSameRanks) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe() + kCheckpointSection);
  const std::vector<std::string> sets = {"--set", "strategy.plugin=fsdp", "--set",
                                         "loader.batch_size=16"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), sets.begin(), sets.end());
    return extra;
  };
  auto whole = launch(2, recipe, dir / "whole", with({}));
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = launch(2, recipe, dir / "parts", with({"--set", "run.max_steps=3"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  // Each rank wrote its own shards; the shared file holds no parameter.
  const fs::path checkpoint = dir / "parts" / "checkpoints" / "step-000000003";
  for (const char* file : {"shared.pt", "rank-00000.pt", "rank-00001.pt"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << file;
  }
  auto second = launch(2, recipe, dir / "parts", with({"--resume", "auto"}));
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_HAS(second.err, "resumed from");
  expect_bitwise_same_model(dir / "whole" / "final.pt", dir / "parts" / "final.pt");
}

TEST(FsdpCheckpoint, SavedOnFourRanksResumesOnTwoAndOneAndExports) {
  // The same global batch of 32 throughout: 4 x 8, 2 x 16, 1 x 32.
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe() + kCheckpointSection);
  auto four = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--set", "strategy.plugin=fsdp", "--set", "loader.batch_size=8"});
    return extra;
  };
  auto whole = launch(4, recipe, dir / "whole", four({}));
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = launch(4, recipe, dir / "saved", four({"--set", "run.max_steps=3"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const fs::path checkpoint = dir / "saved" / "checkpoints" / "step-000000003";

  // Export gathers every rank's shards: exactly the parameters the run ended with.
  const fs::path exported = dir / "model.safetensors";
  auto export_result = run_host({"checkpoint", "export", checkpoint.string(), "--format",
                                 "safetensors", "--out", exported.string()});
  ASSERT_EQ(export_result.exit_code, 0) << describe(export_result);
  Registry registry;
  load_bundled_plugins(registry);
  auto safetensors =
      registry.create<CheckpointBackend>("safetensors", Config({}, "checkpoint"), BuildContext{});
  StateDict weights = safetensors->read(exported);
  TensorMap at_step3 = read_tensor_file(dir / "saved" / "final.pt");
  ASSERT_EQ(weights.tensors.size(), at_step3.size());
  for (const auto& [name, tensor] : at_step3) {
    ASSERT_TRUE(weights.tensors.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, weights.tensors.at(name))) << name;
  }

  for (int ranks : {2, 1}) {
    const fs::path out = dir / ("resumed" + std::to_string(ranks));
    const std::vector<std::string> sets = {
        "--set",    "strategy.plugin=fsdp",
        "--set",    "loader.batch_size=" + std::to_string(32 / ranks),
        "--set",    "checkpoint.dir=" + (dir / "saved" / "checkpoints").string(),
        "--resume", checkpoint.string()};
    auto resumed = ranks == 1 ? run_one(recipe, out, sets) : launch(ranks, recipe, out, sets);
    ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
    EXPECT_HAS(resumed.err, "resharded");
    // Parameters and AdamW moments were cut again: the next 3 steps match the 4-rank run.
    expect_same_model(dir / "whole" / "final.pt", out / "final.pt");
  }

  // Another global batch would visit other samples: refused, with the reason.
  auto refused = launch(2, recipe, dir / "refused",
                        {"--set", "strategy.plugin=fsdp", "--set", "loader.batch_size=8", "--set",
                         "checkpoint.dir=" + (dir / "refused_checkpoints").string(), "--resume",
                         checkpoint.string()});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_HAS(refused.err, "global batch");
}

TEST(FsdpCheckpoint, ConsolidatedSaveHoldsWholeTensorsAndResumesOnOtherRanks) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe() + kCheckpointSection);
  auto whole = launch(4, recipe, dir / "whole",
                      {"--set", "strategy.plugin=fsdp", "--set", "loader.batch_size=8"});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  auto first = launch(4, recipe, dir / "saved",
                      {"--set", "strategy.plugin=fsdp", "--set", "strategy.state_dict=full",
                       "--set", "loader.batch_size=8", "--set", "run.max_steps=3"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const fs::path checkpoint = dir / "saved" / "checkpoints" / "step-000000003";
  // The shared file holds every parameter whole, as the run ended with it.
  Registry registry;
  load_bundled_plugins(registry);
  auto torch_backend =
      registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  StateDict shared = torch_backend->read(checkpoint / "shared.pt");
  TensorMap at_step3 = read_tensor_file(dir / "saved" / "final.pt");
  for (const auto& [name, tensor] : at_step3) {
    ASSERT_TRUE(shared.tensors.count("model." + name)) << name;
    EXPECT_TRUE(at::equal(tensor, shared.tensors.at("model." + name))) << name;
  }
  StateDict rank0 = torch_backend->read(checkpoint / "rank-00000.pt");
  for (const auto& [name, tensor] : rank0.tensors)
    EXPECT_EQ(name.rfind("fsdp.", 0), std::string::npos) << name;
  // Resumed on 2 ranks (sharded there): the same parameters as the 4-rank run after 6 steps.
  auto resumed = launch(2, recipe, dir / "resumed",
                        {"--set", "strategy.plugin=fsdp", "--set", "loader.batch_size=16", "--set",
                         "checkpoint.dir=" + (dir / "resumed_checkpoints").string(), "--resume",
                         checkpoint.string()});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  expect_same_model(dir / "whole" / "final.pt", dir / "resumed" / "final.pt");
}

}  // namespace
}  // namespace trainyard::testing

namespace trainyard::testing {
namespace {

// A run of `strategy` on `ranks` ranks (global batch 32), with extra settings.
CommandResult run_strategy(const std::string& strategy, int ranks, const fs::path& recipe,
                           const fs::path& out, std::vector<std::string> extra) {
  const std::string plugin = strategy == "zero1" ? "ddp" : strategy;
  extra.insert(extra.begin(), {"--set", "strategy.plugin=" + plugin, "--set",
                               "loader.batch_size=" + std::to_string(32 / ranks)});
  if (strategy == "zero1") extra.insert(extra.end(), {"--set", "strategy.zero1=true"});
  return ranks == 1 ? run_one(recipe, out, extra) : launch(ranks, recipe, out, extra);
}

// Checkpoints hold placed pieces of the whole model's tensors, so one written by any strategy
// on any number of ranks resumes under any other: parameters, AdamW moments and step counters
// carry over, and the next steps match the uninterrupted run.
TEST(CrossStrategyCheckpoint, ResumesUnderAnyStrategyRanksAndAccumulation) {
  TempDir dir;
  auto recipe = dir.write("recipe.toml", cnn_recipe() + kCheckpointSection);
  auto whole = run_strategy("fsdp", 4, recipe, dir / "whole", {});
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  struct Move {
    std::string from;
    int from_ranks;
    std::string to;
    int to_ranks;
    std::int64_t accumulation = 1;  // of the resumed run, micro-batches of 32 / ranks / it
  };
  // The same number of ranks under another strategy reads every rank's pieces; another
  // accumulation continues at the same step of the epoch.
  for (const Move& move :
       {Move{"fsdp", 4, "ddp", 2}, Move{"fsdp", 4, "single", 1}, Move{"ddp", 2, "fsdp", 4},
        Move{"single", 1, "fsdp", 4}, Move{"zero1", 2, "fsdp", 4}, Move{"fsdp", 4, "zero1", 2},
        Move{"fsdp", 2, "ddp", 2}, Move{"fsdp", 2, "ddp", 2, 2}}) {
    const std::string name = move.from + std::to_string(move.from_ranks) + "-" + move.to +
                             std::to_string(move.to_ranks) + "x" +
                             std::to_string(move.accumulation);
    SCOPED_TRACE(name);
    auto saved = run_strategy(move.from, move.from_ranks, recipe, dir / (name + "-saved"),
                              {"--set", "run.max_steps=3"});
    ASSERT_EQ(saved.exit_code, 0) << describe(saved);
    const fs::path checkpoint = dir / (name + "-saved") / "checkpoints" / "step-000000003";
    auto resumed = run_strategy(
        move.to, move.to_ranks, recipe, dir / name,
        {"--set", "checkpoint.dir=" + (dir / (name + "-checkpoints")).string(), "--set",
         "run.grad_accumulation=" + std::to_string(move.accumulation), "--set",
         "loader.batch_size=" + std::to_string(32 / move.to_ranks / move.accumulation), "--resume",
         checkpoint.string()});
    ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
    EXPECT_HAS(resumed.err, "at step 3");
    EXPECT_HAS(resumed.err, "resharded");
    expect_same_model(dir / "whole" / "final.pt", dir / name / "final.pt");
  }
}

}  // namespace
}  // namespace trainyard::testing
