// Step parity with Python PyTorch: trainyard trains, recording its initial state, the samples
// and loss of every step and its final state; tools/parity/replay.py rebuilds the model with
// torch.nn, reads the samples from the dataset files itself and trains with torch.optim,
// torch.nn.utils.clip_grad_norm_ and torch.autocast, comparing step by step. In fp32 and under
// bf16 autocast the two must agree bit for bit (the same kernels in the same order). Negative
// controls prove the comparison notices a run that does something else.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <ostream>
#include <string>
#include <vector>

#include "python_fork_server.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

struct Replay {
  CommandResult run;     // trainyard
  CommandResult replay;  // replay.py
};

// One thread and in-line batch preparation on both sides: matrix products may sum in another
// order with another thread count, and the automatic loader would change the count mid-run.
const std::vector<std::string> kDeterministic = {"run.threads=1", "loader.workers=0",
                                                 "run.log_every=1"};

// replay.py, its imports (torch) made once per test process: each replay runs in a fresh fork.
PythonForkServer& replayer() {
  static PythonForkServer server(source_dir() / ".venv" / "bin" / "python",
                                 source_dir() / "tools" / "parity" / "replay.py");
  return server;
}

// Trains `recipe` with `settings` (plus `trainyard_only`, which the replay does not see) and
// replays it with replay.py and `replay_args`.
Replay train_and_replay(const TempDir& dir, const std::string& recipe,
                        std::vector<std::string> settings,
                        const std::vector<std::string>& trainyard_only = {},
                        const std::vector<std::string>& replay_args = {}) {
  settings.insert(settings.end(), kDeterministic.begin(), kDeterministic.end());
  settings.push_back("run.output_dir=" + dir.path().string());
  std::vector<std::string> config = {"run", recipe, "--print-config"};
  for (const auto& setting : settings) config.insert(config.end(), {"--set", setting});
  Replay result;
  CommandResult printed = run_host(config);
  EXPECT_EQ(printed.exit_code, 0) << describe(printed);
  const fs::path resolved = dir.write("resolved.toml", printed.out);

  std::vector<std::string> run = {"run", recipe};
  for (const auto& setting : settings) run.insert(run.end(), {"--set", setting});
  for (const auto& setting : trainyard_only) run.insert(run.end(), {"--set", setting});
  for (const std::string& setting : {"run.initial_model_file=" + (dir / "initial.pt").string(),
                                     "run.step_record_file=" + (dir / "steps.jsonl").string(),
                                     "run.final_model_file=" + (dir / "final.pt").string(),
                                     std::string("sinks.jsonl.enabled=true")}) {
    run.insert(run.end(), {"--set", setting});
  }
  result.run = run_host(run);
  if (result.run.exit_code != 0) return result;

  std::vector<std::string> replay = {"--recipe",  resolved.string(),
                                     "--initial", (dir / "initial.pt").string(),
                                     "--record",  (dir / "steps.jsonl").string(),
                                     "--final",   (dir / "final.pt").string()};
  replay.insert(replay.end(), replay_args.begin(), replay_args.end());
  result.replay = replayer().run(replay, 300);
  return result;
}

void expect_agreement(const Replay& result, const std::string& expected_steps) {
  ASSERT_EQ(result.run.exit_code, 0) << describe(result.run);
  EXPECT_EQ(result.replay.exit_code, 0) << describe(result.replay);
  EXPECT_TRUE(contains(result.replay.out, "replay: " + expected_steps + " steps"));
  EXPECT_TRUE(contains(result.replay.out, ": agree"));
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// A small GPT on one of the repository's documents (a corpus every checkout has), byte tokens.
std::vector<std::string> small_gpt(const TempDir& dir) {
  return {"dataset.path=" + (source_dir() / "docs" / "multi-process.md").string(),
          "dataset.cache=" + (dir / "cache").string(),
          "dataset.seq_len=32",
          "model.n_layers=2",
          "model.n_heads=2",
          "model.d_model=32",
          "loader.batch_size=4",
          "run.eval=false"};
}

const std::vector<std::string> kSmallMlp = {"loader.batch_size=16", "run.eval=false",
                                            "model.hidden=[64, 32]"};

// 100 steps of each model, bit for bit, each with a different optimizer setting, update path,
// schedule and step shape. Between them and EveryUpdatePathMatchesTorchOptim, each optimizer runs
// on each path.
TEST(PythonParity, MlpSgdNesterovWeightDecayAccumulationAndClippingFor100Steps) {
  TempDir dir;
  auto result = train_and_replay(
      dir, "recipes/fashion_mnist_mlp.toml",
      with(kSmallMlp, {"run.max_steps=100", "run.grad_accumulation=2", "run.max_grad_norm=0.5",
                       "optimizer.plugin=sgd", "optimizer.implementation=foreach",
                       "optimizer.lr=0.05", "optimizer.momentum=0.9", "optimizer.nesterov=true",
                       "optimizer.weight_decay=0.001", "scheduler.plugin=warmup_linear",
                       "scheduler.warmup_steps=10", "scheduler.min_lr_ratio=0.1"}),
      {}, {"--exact"});
  expect_agreement(result, "100");
  EXPECT_TRUE(contains(result.run.err, "optimizer sgd: implementation foreach"));
}

// The cnn trains with BatchNorm in train mode, then the evaluation after the last step runs it in
// eval mode (running statistics): its loss and accuracy are compared too.
TEST(PythonParity, CnnAdamWWithBatchNormTrainsAndEvaluatesFor100Steps) {
  TempDir dir;
  auto result = train_and_replay(
      dir, "recipes/fashion_mnist_cnn.toml",
      {"run.max_steps=100", "loader.batch_size=8", "model.channels=[4, 8]", "model.hidden=16",
       "run.eval=true", "run.eval_max_batches=2", "loader.eval_batch_size=50",
       "optimizer.plugin=adamw", "optimizer.implementation=fused", "optimizer.weight_decay=0.05",
       "scheduler.plugin=warmup_cosine", "scheduler.warmup_steps=10", "scheduler.min_lr_ratio=0.1"},
      {}, {"--exact", "--eval", (dir / "metrics.jsonl").string()});
  expect_agreement(result, "100");
  EXPECT_TRUE(contains(result.replay.out, "evaluation loss"));
}

// The default path: on the cpu, Python's default is the for-loop.
TEST(PythonParity, GptAdamWWithClippingFor100Steps) {
  TempDir dir;
  auto result = train_and_replay(
      dir, "recipes/gpt_text.toml",
      with(small_gpt(dir), {"run.max_steps=100", "scheduler.warmup_steps=10"}), {}, {"--exact"});
  expect_agreement(result, "100");
  EXPECT_TRUE(contains(result.run.err, "optimizer adamw: implementation single (auto"));
  // The bits above came from the two-pass update (adamw_update.hpp), not the operations.
  EXPECT_TRUE(contains(result.run.err, "float32 parameters in two passes each"));
}

// A small Llama saved in the Hugging Face layout (sharded, grouped-query attention, tied
// embeddings, llama3 rotary scaling) by transformers into `folder`.
void make_tiny_llama(const fs::path& folder) {
  const std::string make = R"(
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     tie_word_embeddings=True, rope_parameters={"rope_type": "llama3",
                     "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
LlamaForCausalLM(config).save_pretrained(sys.argv[1], max_shard_size="40KB")
)";
  const CommandResult made = run_command(
      {(source_dir() / ".venv/bin/python").string(), "-c", make, folder.string()}, {}, 300);
  ASSERT_EQ(made.exit_code, 0) << describe(made);
  ASSERT_TRUE(fs::exists(folder / "model.safetensors.index.json"));
}

// A recipe fine-tuning the llama in `weights` on bytes of text with AdamW.
std::string llama_finetune_recipe(const fs::path& weights, int steps) {
  return R"(
[run]
seed = 0
max_steps = )" +
         std::to_string(steps) + R"(
max_grad_norm = 1.0
eval = false
[loader]
batch_size = 4
[dataset]
plugin = "text"
tokenizer = "byte"
seq_len = 32
[model]
plugin = "llama"
weights = ")" +
         weights.string() + R"("
[optimizer]
plugin = "adamw"
lr = 1e-3
weight_decay = 0.01
[scheduler]
plugin = "warmup_cosine"
warmup_steps = 5
)";
}

std::vector<std::string> small_text(const TempDir& dir) {
  return {"dataset.path=" + (source_dir() / "docs" / "multi-process.md").string(),
          "dataset.cache=" + (dir / "cache").string()};
}

// The llama fine-tuned from those weights for 50 steps: the replay trains transformers' own
// LlamaForCausalLM with torch.optim.AdamW on the same batches and checks that the run started
// from exactly the published weights.
TEST(PythonParity, LlamaFromHuggingFaceWeightsAdamWFor50Steps) {
  TempDir dir;
  const fs::path weights = dir / "tiny-llama";
  make_tiny_llama(weights);
  const fs::path recipe = dir.write("llama.toml", llama_finetune_recipe(weights, 50));
  auto result = train_and_replay(dir, recipe.string(), small_text(dir));
  expect_agreement(result, "50");
}

// LoRA of rank 4 on q, v, o and down (column- and row-parallel projections) over those weights
// for 20 steps: the replay injects PEFT's own LoRA layers into transformers' model
// (peft.inject_adapter_in_model) and trains them with torch.optim.AdamW; adapters and the frozen
// base agree at every step and at the end. The checkpoint holds the adapters alone with their
// optimizer state, and exported with --format peft they load into PeftModel.from_pretrained
// without a warning, equal to the run's, with the trainable-parameter count peft gives; merged
// into the published weights (--format hf --base) they equal peft's merge_and_unload
// (tests/e2e/hf_export/check_peft_export.py).
TEST(PythonParity, LlamaLoraMatchesPeftFor20Steps) {
  TempDir dir;
  const fs::path weights = dir / "tiny-llama";
  make_tiny_llama(weights);
  const fs::path recipe =
      dir.write("llama.toml", llama_finetune_recipe(weights, 20) +
                                  "[checkpoint]\nplugin = \"torch\"\nkeep = 0\ndir = \"" +
                                  (dir / "checkpoints").string() + "\"\n");
  auto result = train_and_replay(
      dir, recipe.string(),
      with(small_text(dir), {"model.lora={ rank = 4, alpha = 8, targets = [\"q_proj\", "
                             "\"v_proj\", \"o_proj\", \"down_proj\"] }"}));
  expect_agreement(result, "20");

  const fs::path checkpoint = dir / "checkpoints" / "step-000000020";
  Registry registry;
  load_bundled_plugins(registry);
  auto torch_backend =
      registry.create<CheckpointBackend>("torch", Config({}, "checkpoint"), BuildContext{});
  const StateDict saved = torch_backend->read(checkpoint / "shared.pt");
  std::int64_t adapter_elements = 0, bytes = 0;
  for (const auto& [name, tensor] : saved.tensors) {
    const bool is_model = name.rfind("model.", 0) == 0;
    if (!is_model && name.rfind("optimizer.", 0) != 0) continue;  // positions, streams
    bytes += static_cast<std::int64_t>(tensor.nbytes());
    if (is_model) adapter_elements += tensor.numel();
    EXPECT_TRUE(name.find(".lora_") != std::string::npos) << name << " is not an adapter's";
  }
  // 2 layers x (q 4x32+32x4, v 4x32+16x4, o 4x32+32x4, down 4x64+32x4): 2 x 1088.
  EXPECT_EQ(adapter_elements, 2176);
  std::cout << "LoRA checkpoint: " << saved.tensors.size() << " tensors, " << bytes
            << " bytes of adapters and their AdamW moments\n";

  const fs::path adapters = dir / "adapters";
  auto exported = run_host({"checkpoint", "export", checkpoint.string(), "--format", "peft",
                            "--out", adapters.string()});
  ASSERT_EQ(exported.exit_code, 0) << describe(exported);
  const fs::path merged = dir / "merged";
  auto merging = run_host({"checkpoint", "export", checkpoint.string(), "--format", "hf", "--base",
                           weights.string(), "--out", merged.string()});
  ASSERT_EQ(merging.exit_code, 0) << describe(merging);
  auto unmerged = run_host({"checkpoint", "export", checkpoint.string(), "--format", "hf", "--out",
                            (dir / "unmerged").string()});
  EXPECT_EQ(unmerged.exit_code, 1);
  EXPECT_TRUE(contains(unmerged.err, "holds LoRA adapters alone: --base HF_DIR merges them"));
  auto check = run_command(
      {(source_dir() / ".venv/bin/python").string(),
       (source_dir() / "tests/e2e/hf_export/check_peft_export.py").string(), adapters.string(),
       (dir / "final.pt").string(), weights.string(), merged.string()},
      {}, 300);
  EXPECT_EQ(check.exit_code, 0) << describe(check);
  EXPECT_TRUE(contains(check.out, "ok: 16 adapters equal"));
  EXPECT_TRUE(contains(check.out, "trainable 2176 of"));
}

// The paths the 100-step tests leave out, with the options that change the arithmetic
// (amsgrad, dampening, weight decay without Nesterov).
TEST(PythonParity, EveryUpdatePathMatchesTorchOptim) {
  const std::vector<std::vector<std::string>> runs = {
      {"optimizer.plugin=adamw", "optimizer.implementation=single", "optimizer.weight_decay=0.1",
       "optimizer.amsgrad=true"},
      {"optimizer.plugin=adamw", "optimizer.implementation=foreach", "optimizer.weight_decay=0.1",
       "optimizer.amsgrad=true"},
      {"optimizer.plugin=sgd", "optimizer.implementation=single", "optimizer.lr=0.05",
       "optimizer.momentum=0.9", "optimizer.dampening=0.1", "optimizer.weight_decay=0.01"},
      {"optimizer.plugin=sgd", "optimizer.implementation=fused", "optimizer.lr=0.05",
       "optimizer.momentum=0.9", "optimizer.dampening=0.1", "optimizer.weight_decay=0.01"}};
  for (const auto& settings : runs) {
    SCOPED_TRACE(settings[0] + ", " + settings[1]);
    TempDir dir;
    auto result =
        train_and_replay(dir, "recipes/fashion_mnist_mlp.toml",
                         with(with(kSmallMlp, settings), {"run.max_steps=8"}), {}, {"--exact"});
    expect_agreement(result, "8");
  }
}

// bf16 autocast: the forward runs in bf16 on both sides, with the same casts, kernels and
// roundings, so the two agree bit for bit. AdamW is the sharpest check: its normalised update
// turns the least difference in a near-zero gradient (the key part of qkv's bias has a gradient
// that is zero but for rounding) into a step of up to lr.
TEST(PythonParity, Bf16AutocastAdamWFor100Steps) {
  TempDir dir;
  auto result =
      train_and_replay(dir, "recipes/gpt_text.toml",
                       with(small_gpt(dir), {"run.max_steps=100", "precision.plugin=bf16",
                                             "run.max_grad_norm=1", "scheduler.warmup_steps=10"}),
                       {}, {"--exact"});
  expect_agreement(result, "100");
}

// Every combination of model, optimizer, schedule, step shape and precision: 8 steps each, bit
// for bit, on the default update path (the others are covered above).
struct Combination {
  std::string model;      // mlp, cnn, gpt
  std::string optimizer;  // sgd, adamw
  std::string schedule;   // constant, warmup_cosine, warmup_linear
  bool accumulate_and_clip;
  std::string precision;  // fp32, bf16
};

std::string combination_label(const Combination& c) {
  return c.model + "_" + c.optimizer + "_" + c.schedule + "_" +
         (c.accumulate_and_clip ? "accumulate_clip" : "plain") + "_" + c.precision;
}

std::string combination_name(const ::testing::TestParamInfo<Combination>& info) {
  return combination_label(info.param);
}

// What gtest prints for a parameter (and ctest lists): the label, not the struct's bytes.
void PrintTo(const Combination& c, std::ostream* out) { *out << combination_label(c); }

class PythonParityCombination : public ::testing::TestWithParam<Combination> {};

TEST_P(PythonParityCombination, AgreesBitwiseFor8Steps) {
  const Combination& c = GetParam();
  TempDir dir;
  std::string recipe;
  std::vector<std::string> settings;
  if (c.model == "mlp") {
    recipe = "recipes/fashion_mnist_mlp.toml";
    settings = kSmallMlp;
  } else if (c.model == "cnn") {
    recipe = "recipes/fashion_mnist_cnn.toml";
    settings = {"loader.batch_size=8", "model.channels=[4, 8]", "model.hidden=16",
                "run.eval=false"};
  } else {
    recipe = "recipes/gpt_text.toml";
    settings = small_gpt(dir);
  }
  settings.push_back("run.max_steps=8");
  settings.push_back("optimizer.plugin=" + c.optimizer);
  if (c.optimizer == "sgd") {
    settings.insert(settings.end(), {"optimizer.lr=0.05", "optimizer.momentum=0.9",
                                     "optimizer.nesterov=true", "optimizer.weight_decay=0.001"});
  } else {
    settings.insert(settings.end(), {"optimizer.lr=0.003", "optimizer.weight_decay=0.05"});
  }
  settings.push_back("scheduler.plugin=" + c.schedule);
  if (c.schedule != "constant") {
    settings.insert(settings.end(), {"scheduler.warmup_steps=3", "scheduler.min_lr_ratio=0.1"});
  }
  if (c.accumulate_and_clip) {
    settings.insert(settings.end(), {"run.grad_accumulation=2", "run.max_grad_norm=0.5"});
  } else {
    settings.push_back("run.max_grad_norm=0");
  }
  settings.push_back("precision.plugin=" + c.precision);
  auto result = train_and_replay(dir, recipe, settings, {}, {"--exact"});
  expect_agreement(result, "8");
}

std::vector<Combination> every_combination() {
  std::vector<Combination> all;
  for (const char* model : {"mlp", "cnn", "gpt"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (const char* schedule : {"constant", "warmup_cosine", "warmup_linear"}) {
        for (const bool accumulate_and_clip : {false, true}) {
          for (const char* precision : {"fp32", "bf16"}) {
            all.push_back({model, optimizer, schedule, accumulate_and_clip, precision});
          }
        }
      }
    }
  }
  return all;
}

// Every pair of values of any two dimensions at least once (a covering array of strength 2: 9
// rows): the fast core every test run has. The whole grid, 72 runs, runs by label (ctest -L full,
// cmake/TestSuites.cmake).
std::vector<Combination> core_combinations() {
  // model, optimizer, schedule, accumulate and clip, precision: indices into the lists above.
  const int rows[][5] = {{0, 0, 0, 0, 0}, {0, 1, 1, 1, 1}, {1, 0, 2, 0, 1},
                         {2, 1, 2, 1, 0}, {1, 0, 1, 1, 0}, {2, 1, 0, 0, 1},
                         {1, 1, 0, 1, 0}, {2, 0, 1, 0, 0}, {0, 0, 2, 0, 0}};
  const char* models[] = {"mlp", "cnn", "gpt"};
  const char* optimizers[] = {"sgd", "adamw"};
  const char* schedules[] = {"constant", "warmup_cosine", "warmup_linear"};
  const char* precisions[] = {"fp32", "bf16"};
  std::vector<Combination> core;
  for (const auto& row : rows) {
    core.push_back(
        {models[row[0]], optimizers[row[1]], schedules[row[2]], row[3] == 1, precisions[row[4]]});
  }
  return core;
}

INSTANTIATE_TEST_SUITE_P(Core, PythonParityCombination, ::testing::ValuesIn(core_combinations()),
                         combination_name);
INSTANTIATE_TEST_SUITE_P(Full, PythonParityCombination, ::testing::ValuesIn(every_combination()),
                         combination_name);

// Negative controls: a run that differs from the replay by one rounding must be reported.
TEST(PythonParity, ALearningRateOneUlpOffIsReported) {
  TempDir dir;
  // 0.002 is the recipe's rate; the run gets the next double up, the replay the recipe's.
  auto result =
      train_and_replay(dir, "recipes/fashion_mnist_mlp.toml", with(kSmallMlp, {"run.max_steps=5"}),
                       {"optimizer.lr=0.0020000000000000005"}, {"--exact"});
  ASSERT_EQ(result.run.exit_code, 0) << describe(result.run);
  EXPECT_EQ(result.replay.exit_code, 1) << describe(result.replay);
  EXPECT_TRUE(contains(result.replay.out, "DISAGREE"));
  EXPECT_TRUE(contains(result.replay.out, "step 0: learning rate"));
}

TEST(PythonParity, AnotherUpdatePathIsReported) {
  TempDir dir;
  // The fused kernel computes AdamW's rule with other roundings than the for-loop Python takes
  // on cpu by default; the parameters drift apart from the first step.
  auto result =
      train_and_replay(dir, "recipes/fashion_mnist_mlp.toml", with(kSmallMlp, {"run.max_steps=5"}),
                       {"optimizer.implementation=fused"}, {"--exact"});
  ASSERT_EQ(result.run.exit_code, 0) << describe(result.run);
  EXPECT_EQ(result.replay.exit_code, 1) << describe(result.replay);
  EXPECT_TRUE(contains(result.replay.out, "DISAGREE"));
  EXPECT_TRUE(contains(result.replay.out, "final "));
}

TEST(PythonParity, AnUnknownImplementationIsRefusedInOneLine) {
  auto result = run_host(
      {"run", "recipes/fashion_mnist_mlp.toml", "--set", "optimizer.implementation=vectorised"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_TRUE(contains(result.err, "optimizer.implementation"));
  EXPECT_TRUE(contains(result.err, "vectorised"));
}

}  // namespace
}  // namespace trainyard::testing
