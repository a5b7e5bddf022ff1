// Gradient norms per block (run.grad_norm_blocks = true) on every strategy against one process:
// the gpt (tied embedding and head, 4 layers) under ddp, ddp x tp, zero1, fsdp (full), fsdp x tp,
// hybrid sharding, a pipeline of replicated stages (the tied head's copy counted once) and one of
// sharded stages: each block's logged norm within fp32 tolerance of one process's, and their
// squares adding up to the total's, record by record.

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "mesh_recipes.hpp"
#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kBlockNorms = {"--set", "run.grad_norm_blocks=true"};

struct Layout {
  std::string name;
  int ranks;
  std::vector<std::string> sets;
};

std::vector<Layout> layouts() {
  const std::vector<std::string> fsdp = {"--set", "strategy.plugin=fsdp"};
  const std::vector<std::string> pipeline = {"--set", "strategy.plugin=pipeline",
                                             "--set", "strategy.micro_batches=4",
                                             "--set", "parallel.pp=2"};
  return {
      {"ddp2", 2, layout_sets(2, 1, 1)},
      {"ddp_tp2", 2, layout_sets(1, 1, 2)},
      {"zero1_dp2_tp2", 4, joined(layout_sets(2, 1, 2), {"--set", "strategy.zero1=true"})},
      {"fsdp2", 2, joined(fsdp, {"--set", "parallel.dp_shard=2", "--set", "loader.batch_size=8"})},
      {"fsdp2_tp2", 4,
       joined(fsdp, {"--set", "parallel.dp_shard=2", "--set", "parallel.tp=2", "--set",
                     "loader.batch_size=8"})},
      {"hsdp2x2", 4,
       joined(fsdp, {"--set", "parallel.dp_replicate=2", "--set", "parallel.dp_shard=2", "--set",
                     "loader.batch_size=4"})},
      {"pp2", 2, joined(pipeline, {"--set", "strategy.schedule=1f1b"})},
      {"pp2_dp_shard2", 4,
       joined(pipeline, {"--set", "parallel.dp_shard=2", "--set", "loader.batch_size=8", "--set",
                         "strategy.dp_sharding=full", "--set", "strategy.schedule=1f1b"})},
  };
}

TEST(BlockGradNorms, EveryStrategyLogsOneProcesssNormPerBlock) {
  TempDir dir;
  const fs::path recipe = dir.write("recipe.toml", gpt_recipe(4));
  auto single = run_one_process(recipe, dir / "single", kBlockNorms);
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  // One figure per block of the gpt, in every record.
  const auto records = of_phase(read_metrics(dir / "single" / "metrics.jsonl"), "train");
  ASSERT_EQ(records.size(), 4u);
  std::set<std::string> blocks;
  for (const auto& [key, value] : records.front().values) {
    if (key.starts_with("grad_norm/")) blocks.insert(key);
  }
  EXPECT_EQ(blocks.size(), 6u) << "embedding, 4 layers and the head";
  for (const Layout& layout : layouts()) {
    SCOPED_TRACE(layout.name);
    auto run =
        run_launched(layout.ranks, recipe, dir / layout.name, joined(layout.sets, kBlockNorms));
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    expect_same_grad_norms_within(dir / "single", dir / layout.name, kLossRtol, kLossAtol);
  }
}

}  // namespace
}  // namespace trainyard::testing
