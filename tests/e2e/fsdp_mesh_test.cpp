// fsdp on the meshes large models train on, in processes over loopback: 2-D (dp_shard x tp, each
// rank a shard of its tensor-parallel piece) and hybrid sharding (dp_replicate x dp_shard, each
// replicate group sharding the model over its ranks), against one process on the same global
// batch; checkpoints carried through every layout in turn; a rank killed mid-run and the run
// resumed in another layout; ddp's zero1 on dp x tp. The fast core runs everywhere;
// FullFsdpMeshParity (label full) every sharding mode on every mesh for the gpt and the llama.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "mesh_recipes.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// A small threshold, so that every step clips: the norm sums tensor-parallel pieces over the tp
// group and counts whole copies once, and a wrong sum changes every update. The norm per block is
// logged too (expect_matches compares it with one process's).
const std::vector<std::string> kClipping = {"--set", "run.max_grad_norm=0.05", "--set",
                                            "run.grad_norm_blocks=true"};

// fsdp on dp_replicate x dp_shard x tp ranks in `sharding` mode, each data-parallel rank's batch
// keeping the global batch at 16.
std::vector<std::string> fsdp_sets(int replicate, int shard, int tp, const std::string& sharding) {
  return {"--set", "strategy.plugin=fsdp",
          "--set", "strategy.sharding=" + sharding,
          "--set", "parallel.dp_replicate=" + std::to_string(replicate),
          "--set", "parallel.dp_shard=" + std::to_string(shard),
          "--set", "parallel.tp=" + std::to_string(tp),
          "--set", "loader.batch_size=" + std::to_string(16 / (replicate * shard))};
}

// A llama with grouped-query attention (2 key/value heads: tp 2 shards them), tied embeddings
// and llama3 rotary scaling.
std::string llama_text(int steps) {
  return llama_recipe(steps,
                      "{ hidden_size = 32, intermediate_size = 64, num_hidden_layers = 3, "
                      "num_attention_heads = 4, num_key_value_heads = 2, "
                      "tie_word_embeddings = true, rope_scaling = { rope_type = \"llama3\", "
                      "factor = 8.0, original_max_position_embeddings = 8 } }");
}

struct MeshCase {
  std::string name;
  int replicate, shard, tp;
  std::string sharding;
  bool sequence_parallel = false;
};

// Each case of `recipe` on 4 processes ends where one process ends (both clipping every step).
void expect_cases_match_one_process(const std::string& recipe_text,
                                    const std::vector<MeshCase>& cases) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", recipe_text);
  auto single = run_one_process(recipe, dir / "single", kClipping);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  for (const MeshCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> sets =
        joined(fsdp_sets(c.replicate, c.shard, c.tp, c.sharding), kClipping);
    if (c.sequence_parallel) sets = joined(sets, {"--set", "model.sequence_parallel=true"});
    auto run = run_launched(c.replicate * c.shard * c.tp, recipe, dir / c.name, sets);
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    EXPECT_HAS(run.err, "x dp_replicate " + std::to_string(c.replicate) + " x dp_shard " +
                            std::to_string(c.shard) + " x tp " + std::to_string(c.tp));
    expect_matches(dir / "single", dir / c.name);
  }
}

TEST(FsdpMeshParity, GptOnTwoDimensionsAndHybridShardingMatchesOneProcess) {
  expect_cases_match_one_process(
      gpt_recipe(6), {{"fsdp2_tp2_sp", 1, 2, 2, "full", true}, {"hsdp2x2_full", 2, 2, 1, "full"}});
}

TEST(FsdpMeshParity, LlamaOnTwoDimensionsAndHybridShardingMatchesOneProcess) {
  expect_cases_match_one_process(llama_text(6), {{"fsdp2_tp2_none", 1, 2, 2, "none"},
                                                 {"hsdp2x2_grad_op", 2, 2, 1, "grad_op"}});
}

// Pipeline stages sharded over their data-parallel ranks against one process: 2 stages x dp_shard
// 2 x tp 2 (the gpt's tied embedding split by vocabulary on both end stages, fully sharded, 1f1b)
// and 2 stages x dp_replicate 2 x dp_shard 2 (the llama, hybrid, grad_op, 1f1b) on 8 processes,
// and 2 stages x dp_shard 2 under zero_bubble (the gpt, fully sharded: the weight half of each
// split backward gathers the units again) on 4.
TEST(FsdpMeshParity, ShardedPipelineStagesOnTensorParallelAndHybridMeshesMatchOneProcess) {
  for (const auto& [model, recipe_text, sets] :
       {std::tuple{"gpt", gpt_recipe(6),
                   std::vector<std::string>{"--set", "parallel.dp_shard=2", "--set",
                                            "parallel.tp=2", "--set", "loader.batch_size=8",
                                            "--set", "strategy.dp_sharding=full", "--set",
                                            "strategy.schedule=1f1b"}},
        std::tuple{"llama", llama_text(6),
                   std::vector<std::string>{"--set", "parallel.dp_replicate=2", "--set",
                                            "parallel.dp_shard=2", "--set", "loader.batch_size=4",
                                            "--set", "strategy.dp_sharding=grad_op", "--set",
                                            "strategy.schedule=1f1b"}},
        std::tuple{"gpt zero_bubble", gpt_recipe(6),
                   std::vector<std::string>{
                       "--set", "parallel.dp_shard=2", "--set", "loader.batch_size=8", "--set",
                       "strategy.dp_sharding=full", "--set", "strategy.schedule=zero_bubble"}}}) {
    SCOPED_TRACE(model);
    TempDir dir;
    const fs::path recipe = dir.write("recipe.toml", recipe_text);
    auto single = run_one_process(recipe, dir / "single", kClipping);
    ASSERT_EQ(single.exit_code, 0) << describe(single);
    const std::vector<std::string> pipeline = {"--set", "strategy.plugin=pipeline",
                                               "--set", "strategy.micro_batches=4",
                                               "--set", "parallel.pp=2"};
    int ranks = 2;
    for (std::size_t i = 0; i + 1 < sets.size(); ++i) {
      for (const char* size : {"parallel.dp_shard=2", "parallel.dp_replicate=2", "parallel.tp=2"}) {
        if (sets[i + 1] == size) ranks *= 2;
      }
    }
    auto run = run_launched(ranks, recipe, dir / "run", joined(joined(pipeline, sets), kClipping));
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    expect_matches(dir / "single", dir / "run");
  }
}

// Every sharding mode on dp_shard 2 x tp 2 (with sequence parallelism), hybrid 2 x 2, and
// hybrid replicas of tensor-parallel pairs (dp_replicate 2 x tp 2).
std::vector<MeshCase> every_case() {
  std::vector<MeshCase> cases;
  for (const std::string sharding : {"full", "grad_op", "none"}) {
    cases.push_back({"fsdp2_tp2_" + sharding, 1, 2, 2, sharding, true});
    cases.push_back({"hsdp2x2_" + sharding, 2, 2, 1, sharding});
    cases.push_back({"hsdp2x1_tp2_" + sharding, 2, 1, 2, sharding});
  }
  return cases;
}

TEST(FullFsdpMeshParity, GptEveryShardingModeOnEveryMesh) {
  expect_cases_match_one_process(gpt_recipe(6), every_case());
}

TEST(FullFsdpMeshParity, LlamaEveryShardingModeOnEveryMesh) {
  expect_cases_match_one_process(llama_text(6), every_case());
}

// ddp with zero1 on dp 2 x tp 2: each data-parallel rank steps a slice of its tp rank's pieces
// (the norm over the tp group), and ends where one process ends; its checkpoint, slices of boxes,
// resumes on one process and ends there too.
TEST(Zero1MeshParity, DataParallelTwoByTensorParallelTwoMatchesOneProcessAndResumesOnOne) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml", gpt_recipe(6) + "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n");
  auto single = run_one_process(recipe, dir / "single", kClipping);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<std::string> sets =
      joined(joined(layout_sets(2, 1, 2), {"--set", "strategy.zero1=true"}), kClipping);
  auto run = run_launched(4, recipe, dir / "zero1", sets);
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  expect_matches(dir / "single", dir / "zero1");
  auto first = run_launched(4, recipe, dir / "half", joined(sets, {"--set", "run.max_steps=3"}));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  auto resumed = run_one_process(
      recipe, dir / "resumed",
      joined(kClipping, {"--set", "checkpoint.dir=" + (dir / "resumed_checkpoints").string(),
                         "--resume", (dir / "half" / "checkpoints" / "step-000000003").string()}));
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_HAS(resumed.err, "resharded");
  expect_same_model_within(dir / "single" / "final.pt", dir / "resumed" / "final.pt",
                           kParameterRtol, kParameterAtol);
}

// A layout of the round trip: its --set arguments and process count.
struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
};

// A checkpoint carried through fsdp 4 -> fsdp 2 x tp 2 -> hsdp 2 x 2 -> pp 2 x tp 2 -> one
// process, 2 steps in each: every run resumes where the last stopped (resharded), and the end
// equals one uninterrupted process's 10 steps within fp32 tolerance. On the same layout (the
// same data-parallel size), a resume is bitwise the uninterrupted run.
TEST(FsdpMeshCheckpoint, ReshardingRoundTripEndsWhereOneProcessEnds) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml", gpt_recipe(10) + "\n[checkpoint]\nplugin = \"torch\"\nkeep = 0\n");
  auto single = run_one_process(recipe, dir / "single", kClipping);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<Layout> layouts = {
      {"fsdp4", 4, fsdp_sets(1, 4, 1, "full")},
      {"fsdp2_tp2", 4,
       joined(fsdp_sets(1, 2, 2, "full"), {"--set", "model.sequence_parallel=true"})},
      {"hsdp2x2", 4, fsdp_sets(2, 2, 1, "grad_op")},
      {"pp2_tp2", 4, layout_sets(1, 2, 2)},
      {"single", 1, {"--set", "strategy.plugin=single"}},
  };
  fs::path previous;
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const Layout& layout = layouts[i];
    SCOPED_TRACE(layout.name);
    const fs::path out = dir / ("trip" + std::to_string(i) + "_" + layout.name);
    std::vector<std::string> sets =
        joined(joined(layout.sets, kClipping),
               {"--set", "run.max_steps=" + std::to_string(2 * (i + 1)), "--set",
                "checkpoint.dir=" + (out / "checkpoints").string()});
    if (!previous.empty()) sets = joined(sets, {"--resume", previous.string()});
    auto run = layout.ranks == 1 ? run_one_process(recipe, out, sets)
                                 : run_launched(layout.ranks, recipe, out, sets);
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    if (!previous.empty()) {
      EXPECT_HAS(run.err, "resharded");
    }
    char step[32];
    std::snprintf(step, sizeof step, "step-%09zu", 2 * (i + 1));
    previous = out / "checkpoints" / step;
  }
  expect_same_model_within(
      dir / "single" / "final.pt",
      dir / ("trip" + std::to_string(layouts.size() - 1) + "_single") / "final.pt", kParameterRtol,
      kParameterAtol);

  // hsdp 2 x 2 and fsdp 2 x tp 2: 4 steps straight, and 2 steps then a resume for 2 more.
  for (const Layout& layout : {layouts[1], layouts[2]}) {
    SCOPED_TRACE(layout.name + " resumed on its own layout");
    const std::vector<std::string> sets = joined(layout.sets, kClipping);
    const fs::path whole = dir / (layout.name + "_whole");
    auto straight = run_launched(4, recipe, whole, joined(sets, {"--set", "run.max_steps=4"}));
    ASSERT_EQ(straight.exit_code, 0) << describe(straight);
    const fs::path half = dir / (layout.name + "_half");
    auto first = run_launched(4, recipe, half, joined(sets, {"--set", "run.max_steps=2"}));
    ASSERT_EQ(first.exit_code, 0) << describe(first);
    auto second = run_launched(4, recipe, half,
                               joined(sets, {"--set", "run.max_steps=4", "--resume",
                                             (half / "checkpoints" / "step-000000002").string()}));
    ASSERT_EQ(second.exit_code, 0) << describe(second);
    expect_same_model_within(whole / "final.pt", half / "final.pt", 0, 0);
  }
}

// A rank killed (SIGKILL) at step 5 of an fsdp 2 x tp 2 run, and of a hybrid 2 x 2 one, that
// checkpoint every 2 steps: each resumes from its last checkpoint in the other layout and ends
// where one process ends.
TEST(FsdpMeshCheckpoint, KilledRankResumesInAnotherLayout) {
  TempDir dir;
  const fs::path recipe =
      dir.write("recipe.toml",
                gpt_recipe(8) + "\n[checkpoint]\nplugin = \"torch\"\nevery_steps = 2\nkeep = 0\n");
  auto single = run_one_process(recipe, dir / "single", kClipping);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<std::string> two_d = fsdp_sets(1, 2, 2, "full");
  const std::vector<std::string> hybrid = fsdp_sets(2, 2, 1, "full");
  for (const auto& [name, crashed_sets, resumed_sets] :
       {std::tuple{"2d_then_hybrid", two_d, hybrid}, std::tuple{"hybrid_then_2d", hybrid, two_d}}) {
    SCOPED_TRACE(name);
    const fs::path out = dir / name;
    auto crashed =
        run_launched(4, recipe, out, joined(crashed_sets, kClipping),
                     {"TRAINYARD_TEST_FAIL_PLAN=0:1:5", "TRAINYARD_TEST_FAIL_MODE=kill"});
    ASSERT_NE(crashed.exit_code, 0) << describe(crashed);
    EXPECT_HAS(crashed.err, "was killed by signal Killed");
    ASSERT_FALSE(fs::exists(out / "final.pt"));
    auto resumed =
        run_launched(4, recipe, out, joined(joined(resumed_sets, kClipping), {"--resume", "auto"}));
    ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
    EXPECT_HAS(resumed.err, "resumed from");
    expect_same_model_within(dir / "single" / "final.pt", out / "final.pt", kParameterRtol,
                             kParameterAtol);
  }
}

}  // namespace
}  // namespace trainyard::testing
