// Tensor parallelism in processes over loopback: the gpt split over 2 and 4 tensor-parallel ranks
// (with and without sequence parallelism) against one process, dp x pp x tp on 8 processes, and
// a checkpoint saved at (dp 2, pp 2, tp 2) mid-epoch resumed at other layouts.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mesh_recipes.hpp"
#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"
#include "trainyard/parallel/distributed.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

TEST(TensorParallelParity, GptOnTwoAndFourRanksMatchesOneProcessWithAndWithoutSequenceParallel) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(10));
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  for (int tp : {2, 4}) {
    for (const std::string sequence_parallel : {"false", "true"}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + ", sequence_parallel " + sequence_parallel);
      const fs::path out = dir / ("tp" + std::to_string(tp) + "_sp_" + sequence_parallel);
      auto run = run_launched(
          tp, recipe, out,
          joined(layout_sets(1, 1, tp), {"--set", "model.sequence_parallel=" + sequence_parallel}));
      ASSERT_EQ(run.exit_code, 0) << describe(run);
      expect_matches(dir / "single", out);
    }
  }
}

// fsdp on 2 processes, each with half the one-process batch.
const std::vector<std::string> kFsdpSets = {"--set", "strategy.plugin=fsdp", "--set",
                                            "loader.batch_size=8"};

// Each named layout of `recipe` on 2 processes (its --set arguments) ends where the one-process
// run in dir / "single" ends.
void expect_layouts_match_one_process(
    const fs::path& recipe, const TempDir& dir,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& layouts) {
  for (const auto& [name, sets] : layouts) {
    SCOPED_TRACE(name);
    auto run = run_launched(2, recipe, dir / name, sets);
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    expect_matches(dir / "single", dir / name);
  }
}

// The llama (grouped-query attention, tied embeddings, llama3 rotary scaling, built from
// [model.config] keys) trained by ddp, fsdp, tp 2 with sequence parallelism and a two-stage
// pipeline on 2 processes ends where one process ends.
TEST(TensorParallelParity, LlamaOnEveryStrategyMatchesOneProcess) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml",
                llama_recipe(6,
                             "{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 3, "
                             "num_attention_heads = 4, num_key_value_heads = 2, "
                             "tie_word_embeddings = true, rope_scaling = { rope_type = \"llama3\", "
                             "factor = 8.0, original_max_position_embeddings = 8 } }"));
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"ddp", layout_sets(2, 1, 1)},
      {"fsdp", kFsdpSets},
      {"tp_sp", joined(layout_sets(1, 1, 2), {"--set", "model.sequence_parallel=true"})},
      {"pipeline", layout_sets(1, 2, 1)},
  };
  expect_layouts_match_one_process(recipe, dir, layouts);
}

// dp 2 x pp 2 x tp 2 on 8 processes: the first step's loss is one process's, and 5 steps end
// where one process ends.
TEST(TensorParallelParity, ThreeDimensionsOnEightProcessesMatchOneProcess) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(5));
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto run = run_launched(8, recipe, dir / "3d", layout_sets(2, 2, 2));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "mesh pp 2 x dp_replicate 1 x dp_shard 2 x tp 2");
  expect_matches(dir / "single", dir / "3d");
  const std::vector<double> expected = logged_train_losses(dir / "single");
  const std::vector<double> actual = logged_train_losses(dir / "3d");
  ASSERT_FALSE(actual.empty());
  EXPECT_NEAR(actual[0], expected[0], 1e-6 * std::abs(expected[0])) << "step 1";
}

// Saved at (2, 2, 2) after 3 of 32 steps in the epoch, resumed at (1, 4, 2), (4, 1, 2), (8, 1, 1)
// and (1, 1, 1): each continues as the uninterrupted (2, 2, 2) run does, and the checkpoint's
// export equals the whole model, key by key.
TEST(TensorParallelCheckpoint, SavedAtTwoTwoTwoResumesAtEveryOtherLayout) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml", gpt_recipe(6) + "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n");
  auto single = run_one_process(recipe, dir / "single", {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto whole = run_launched(8, recipe, dir / "whole", layout_sets(2, 2, 2));
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  expect_matches(dir / "single", dir / "whole");
  auto saved = run_launched(
      8, recipe, dir / "saved",
      joined(layout_sets(2, 2, 2), {"--set", "run.max_steps=3", "--set",
                                    "run.final_model_file=" + (dir / "saved3.pt").string()}));
  ASSERT_EQ(saved.exit_code, 0) << describe(saved);
  const fs::path checkpoint = dir / "saved" / "checkpoints" / "step-000000003";

  struct Layout {
    int dp, pp, tp;
  };
  for (const Layout& layout :
       {Layout{1, 4, 2}, Layout{4, 1, 2}, Layout{8, 1, 1}, Layout{1, 1, 1}}) {
    const std::string name = std::to_string(layout.dp) + "_" + std::to_string(layout.pp) + "_" +
                             std::to_string(layout.tp);
    SCOPED_TRACE("(dp, pp, tp) = (" + name + ")");
    const std::vector<std::string> resume = {
        "--set", "checkpoint.dir=" + (dir / ("checkpoints_" + name)).string(), "--resume",
        checkpoint.string()};
    const int ranks = layout.dp * layout.pp * layout.tp;
    const fs::path out = dir / name;
    auto run = ranks == 1
                   ? run_one_process(recipe, out, joined({"--set", "loader.batch_size=16"}, resume))
                   : run_launched(ranks, recipe, out,
                                  joined(layout_sets(layout.dp, layout.pp, layout.tp), resume));
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    EXPECT_HAS(run.err, "resharded");
    const std::vector<double> expected = logged_train_losses(dir / "whole");
    const std::vector<double> actual = logged_train_losses(out);
    ASSERT_EQ(actual.size(), 3u);
    for (std::size_t i = 0; i < actual.size(); ++i) {
      EXPECT_LE(std::abs(actual[i] - expected[i + 3]),
                kLossAtol + kLossRtol * std::abs(expected[i + 3]))
          << "step " << i + 4;
    }
    expect_same_model_within(dir / "whole" / "final.pt", out / "final.pt", kParameterRtol,
                             kParameterAtol);
  }

  // The export assembles every rank's shards into the whole model the 3-step run ended with.
  const TensorMap weights = exported_checkpoint(checkpoint, dir / "model.safetensors");
  ASSERT_FALSE(weights.empty());
  const TensorMap at_step3 = read_tensor_file(dir / "saved3.pt");
  ASSERT_EQ(weights.size(), at_step3.size());
  for (const auto& [name, tensor] : at_step3) {
    ASSERT_TRUE(weights.count(name)) << name;
    EXPECT_TRUE(at::equal(tensor, weights.at(name))) << name;
  }
  // ... and one process's state dict after the same 3 steps, key by key.
  auto single3 = run_one_process(recipe, dir / "single3", {"--set", "run.max_steps=3"});
  ASSERT_EQ(single3.exit_code, 0) << describe(single3);
  const TensorMap one_process = read_tensor_file(dir / "single3" / "final.pt");
  ASSERT_EQ(weights.size(), one_process.size());
  for (const auto& [name, tensor] : one_process) {
    ASSERT_TRUE(weights.count(name)) << name;
    EXPECT_TRUE(at::allclose(weights.at(name), tensor, kParameterRtol, kParameterAtol)) << name;
  }
}

// LoRA adapters on every projection of a multi-query llama (so under tp 2 the adapters of k and
// v sit on key/value weights every rank holds whole, those of q, gate and up on column-parallel
// weights, those of o and down on row-parallel ones) trained by ddp, fsdp, tp 2 with sequence
// parallelism and a two-stage pipeline on 2 processes, and by fsdp 2 x tp 2 on 4, end where one
// process ends, the frozen base untouched (fsdp shards the adapters and keeps the base whole).
TEST(TensorParallelParity, LlamaLoraOnEveryStrategyMatchesOneProcess) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml",
                llama_recipe(6,
                             "{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, "
                             "num_attention_heads = 4, num_key_value_heads = 1, "
                             "tie_word_embeddings = false }",
                             "lora = { rank = 4, alpha = 16, targets = [\"q_proj\", \"k_proj\", "
                             "\"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", "
                             "\"down_proj\"] }\n"));
  auto single = run_one_process(
      recipe, dir / "single", {"--set", "run.initial_model_file=" + (dir / "initial.pt").string()});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const TensorMap initial = read_tensor_file(dir / "initial.pt");
  const TensorMap final_single = read_tensor_file(dir / "single" / "final.pt");
  std::size_t adapters = 0;
  for (const auto& [name, tensor] : initial) {
    const bool adapter = name.find(".lora_") != std::string::npos;
    adapters += adapter;
    // The adapters train; everything else stays as it was built.
    EXPECT_EQ(at::equal(tensor, final_single.at(name)), !adapter) << name;
  }
  EXPECT_EQ(adapters, 2u * 7u * 2u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"ddp", layout_sets(2, 1, 1)},
      {"fsdp", kFsdpSets},
      {"tp_sp", joined(layout_sets(1, 1, 2), {"--set", "model.sequence_parallel=true"})},
      {"pipeline", layout_sets(1, 2, 1)},
  };
  expect_layouts_match_one_process(recipe, dir, layouts);
  auto fsdp_tp = run_launched(4, recipe, dir / "fsdp_tp",
                              {"--set", "strategy.plugin=fsdp", "--set", "parallel.dp_shard=2",
                               "--set", "parallel.tp=2", "--set", "loader.batch_size=8"});
  ASSERT_EQ(fsdp_tp.exit_code, 0) << describe(fsdp_tp);
  expect_matches(dir / "single", dir / "fsdp_tp");
}

// A llama checkpoint of dp 2 x pp 2 x tp 2 exported as a Hugging Face directory (several
// safetensors files and their index): transformers' from_pretrained loads it without a warning
// or a missing, extra or misshapen tensor, every tensor equals the model the run ended with, and
// its logits equal those of the model the recipe configured holding that state
// (tests/e2e/hf_export/check_export.py, which builds its reference from the settings below, not
// from the exported config.json). Untied head, rope_theta and rms_norm_eps off their defaults, so
// a config that loses them fails.
TEST(TensorParallelCheckpoint, ThreeDimensionalLlamaExportsToTransformers) {
  TempDir dir;
  const std::string settings =
      R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": false,
          "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 64,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})";
  const fs::path recipe = dir.write(
      "recipe.toml",
      llama_recipe(3,
                   "{ vocab_size = 64, hidden_size = 32, intermediate_size = 64, "
                   "num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, "
                   "tie_word_embeddings = false, rms_norm_eps = 1e-5, rope_theta = 500000.0, "
                   "max_position_embeddings = 64, rope_scaling = { rope_type = \"llama3\", "
                   "factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, "
                   "original_max_position_embeddings = 8 } }") +
          "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n");
  auto run =
      run_launched(8, recipe, dir / "3d",
                   joined(layout_sets(2, 2, 2),
                          {"--set", "run.final_model_file=" + (dir / "final3.pt").string()}));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "mesh pp 2 x dp_replicate 1 x dp_shard 2 x tp 2");
  const fs::path checkpoint = dir / "3d" / "checkpoints" / "step-000000003";
  const fs::path exported = dir / "hf";
  auto export_run =
      run_command({host_binary().string(), "checkpoint", "export", checkpoint.string(), "--format",
                   "hf", "--out", exported.string(), "--max-shard-size", "40KB"},
                  source_dir(), 120);
  ASSERT_EQ(export_run.exit_code, 0) << describe(export_run);
  EXPECT_TRUE(fs::exists(exported / "config.json"));
  EXPECT_TRUE(fs::exists(exported / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(exported / "model-00002-of-00003.safetensors"));
  const fs::path python = source_dir() / ".venv" / "bin" / "python";
  auto check =
      run_command({python.string(), (source_dir() / "tests/e2e/hf_export/check_export.py").string(),
                   exported.string(), (dir / "final3.pt").string(), settings},
                  source_dir(), 300);
  EXPECT_EQ(check.exit_code, 0) << describe(check);
  EXPECT_HAS(check.out, "ok: ");

  // A directory that exists is not written over, and nothing is left beside it.
  auto again = run_command({host_binary().string(), "checkpoint", "export", checkpoint.string(),
                            "--format", "hf", "--out", exported.string()},
                           source_dir(), 120);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_HAS(again.err, exported.string() + " exists");
  EXPECT_FALSE(fs::exists(dir / "hf.partial"));
}

// The README's 3D recipe validates and trains on its 8 processes (a few steps of it).
TEST(TensorParallelRun, TheReadmeThreeDimensionalRecipeTrains) {
  TempDir dir;
  auto run = validate_and_launch_bundled_recipe("gpt_3d.toml", 8, 2, 1, dir / "run");
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_HAS(run.err, "mesh pp 2 x dp_replicate 1 x dp_shard 2 x tp 2");
  const std::vector<double> losses = logged_train_losses(dir / "run");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(losses.back()));
}

// gpt_text (the streaming text dataset) on a 2-stage pipeline, checkpointed at step 3 of 6: the
// pipeline's data-parallel size is 1, so one process and tp 2 (each also 1 data-parallel rank)
// resume from it and read exactly the tokens the uninterrupted run reads (its losses); ddp on 2
// ranks (2 data-parallel ranks, each reading its own stream) is refused in one line naming both
// sizes.
TEST(TensorParallelCheckpoint, StreamingPipelineCheckpointResumesOnOneProcessAndTensorParallel) {
  TempDir dir;
  const fs::path recipe = source_dir() / "recipes" / "gpt_text.toml";
  const std::vector<std::string> common = {
      "--set", "run.max_steps=6",         "--set", "run.log_every=1",
      "--set", "run.eval=false",          "--set", "model.dropout=0.0",
      "--set", "model.d_model=64",        "--set", "optimizer.plugin=sgd",
      "--set", "optimizer.lr=0.1",        "--set", "scheduler.plugin=constant",
      "--set", "checkpoint.plugin=torch", "--set", "checkpoint.every_steps=3",
      "--set", "checkpoint.keep=0",       "--set", "dataset.cache=" + (dir / "cache").string()};
  auto single = run_one_process(recipe, dir / "single", common);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  auto pipeline = run_launched(2, recipe, dir / "pipeline",
                               joined(common, {"--set", "strategy.plugin=pipeline", "--set",
                                               "parallel.pp=2", "--set",
                                               "strategy.micro_batches=4"}));
  ASSERT_EQ(pipeline.exit_code, 0) << describe(pipeline);
  const std::string step3 = (dir / "pipeline" / "checkpoints" / "step-000000003").string();
  const std::vector<double> expected = logged_train_losses(dir / "single");
  ASSERT_EQ(expected.size(), 6u);
  for (const bool tensor_parallel : {false, true}) {
    SCOPED_TRACE(tensor_parallel ? "tp 2" : "one process");
    const fs::path out = dir / (tensor_parallel ? "tp" : "one");
    const std::vector<std::string> resume = joined(common, {"--resume", step3});
    auto run = tensor_parallel
                   ? run_launched(2, recipe, out,
                                  joined(resume, {"--set", "strategy.plugin=ddp", "--set",
                                                  "parallel.tp=2"}))
                   : run_one_process(recipe, out, resume);
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    EXPECT_HAS(run.err, "resharded");
    const std::vector<double> actual = logged_train_losses(out);
    ASSERT_EQ(actual.size(), 3u);
    for (std::size_t i = 0; i < actual.size(); ++i) {
      EXPECT_LE(std::abs(actual[i] - expected[i + 3]),
                kLossAtol + kLossRtol * std::abs(expected[i + 3]))
          << "step " << i + 4;
    }
  }
  auto two_readers = run_launched(
      2, recipe, dir / "ddp",
      joined(common, {"--set", "strategy.plugin=ddp", "--set", "loader.batch_size=8", "--resume",
                      step3}),
      {}, 120);
  EXPECT_NE(two_readers.exit_code, 0);
  EXPECT_HAS(two_readers.err,
             "a streaming dataset's reader positions are per data-parallel rank, and it had 1 "
             "data-parallel ranks, this run has 2");
}

TEST(TensorParallelRun, SizesThatDoNotDivideAreOneLineErrors) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(2));
  auto heads = run_launched(
      2, recipe, dir / "heads",
      joined(layout_sets(1, 1, 2), {"--set", "model.n_heads=3", "--set", "model.d_model=24"}), {},
      120);
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_HAS(heads.err, "n_heads");
}

}  // namespace
}  // namespace trainyard::testing
