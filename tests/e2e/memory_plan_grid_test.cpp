// `trainyard plan` against the allocator (memory_plan_support.hpp) on single, ddp and fsdp in each
// sharding mode, for three bundled recipes with and without activation checkpointing, the gpt
// pipeline under every schedule, and tensor-parallel, hybrid and 3D layouts of the gpt and the
// llama: the whole grid, by label.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <string>
#include <vector>

#include "memory_plan_support.hpp"
#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

const std::vector<std::string> kFsdp = {"strategy.plugin=fsdp", "parallel.dp_shard=2"};

TEST(MemoryPlanGrid, EveryDataParallelLayoutWithinTenPercentOfTheAllocator) {
  std::vector<PlanCase> cases;
  for (const std::string recipe :
       {"gpt_text.toml", "fashion_mnist_cnn.toml", "fashion_mnist_mlp.toml"}) {
    for (const std::string checkpointing : {"none", "all"}) {
      const std::string name = recipe + " " + checkpointing;
      const std::vector<std::string> base = {"run.activation_checkpointing=\"" + checkpointing +
                                             "\""};
      cases.push_back({name + " single", recipe, 1, base});
      cases.push_back(
          {name + " ddp 2", recipe, 2, with(base, {"strategy.plugin=ddp", "parallel.dp_shard=2"})});
      cases.push_back(
          {name + " zero1 2", recipe, 2,
           with(base, {"strategy.plugin=ddp", "parallel.dp_shard=2", "strategy.zero1=true"})});
      for (const std::string sharding : {"full", "grad_op", "none"}) {
        cases.push_back({name + " fsdp " + sharding + " 2", recipe, 2,
                         with(base, with(kFsdp, {"strategy.sharding=" + sharding}))});
      }
    }
  }
  for (const std::string schedule :
       {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zero_bubble_v"}) {
    const bool two_per_rank = schedule == "interleaved_1f1b" || schedule == "zero_bubble_v";
    for (const std::string checkpointing : {"none", "all"}) {
      cases.push_back({"gpt pipeline " + schedule + " 2, recompute " + checkpointing,
                       "gpt_pipeline.toml",
                       2,
                       {"strategy.schedule=\"" + schedule + "\"",
                        std::string("strategy.virtual_stages=") + (two_per_rank ? "2" : "1"),
                        "run.activation_checkpointing=\"" + checkpointing + "\""}});
    }
  }
  cases.push_back(
      {"gpt pipeline 1f1b 4 micro-batches", "gpt_pipeline.toml", 2, {"strategy.micro_batches=4"}});
  for (const PlanCase& c : cases) expect_plan_matches_run(c);
}

// Tensor-parallel pieces held as each strategy holds a model (a replica, zero1's sharded state,
// fsdp's units in each sharding mode, pipeline stages), hybrid sharding, pipeline stages sharded
// over their data-parallel ranks, and the three dimensions at once, for the gpt and the llama
// (with LoRA adapters on a frozen model too).
TEST(MemoryPlanGrid, TensorParallelHybridAndThreeDimensionalLayoutsWithinTenPercent) {
  std::vector<PlanCase> cases;
  const std::vector<std::string> tp2 = {"parallel.tp=2"};
  for (const std::string recipe : {"gpt_text.toml", "llama_text.toml"}) {
    for (const std::string checkpointing : {"none", "all"}) {
      const std::string name = recipe + " " + checkpointing;
      const std::vector<std::string> base = {"run.activation_checkpointing=\"" + checkpointing +
                                             "\""};
      cases.push_back({name + " single", recipe, 1, base});
      cases.push_back(
          {name + " tp 2", recipe, 2,
           with(base, {"strategy.plugin=ddp", "parallel.tp=2", "parallel.dp_shard=1"})});
      cases.push_back(
          {name + " ddp 2 x tp 2", recipe, 4,
           with(base, {"strategy.plugin=ddp", "parallel.tp=2", "parallel.dp_shard=2"})});
      cases.push_back({name + " zero1 2 x tp 2", recipe, 4,
                       with(base, {"strategy.plugin=ddp", "parallel.tp=2", "parallel.dp_shard=2",
                                   "strategy.zero1=true"})});
      for (const std::string sharding : {"full", "grad_op", "none"}) {
        cases.push_back(
            {name + " fsdp " + sharding + " 2 x tp 2", recipe, 4,
             with(base, with(kFsdp, {"parallel.tp=2", "strategy.sharding=" + sharding}))});
        cases.push_back({name + " hsdp " + sharding + " 2 x 2", recipe, 4,
                         with(base, with(kFsdp, {"parallel.dp_replicate=2",
                                                 "strategy.sharding=" + sharding}))});
      }
      cases.push_back({name + " pipeline 2 x tp 2", recipe, 4,
                       with(base, {"strategy.plugin=pipeline", "parallel.pp=2", "parallel.tp=2",
                                   "parallel.dp_shard=1", "strategy.micro_batches=4"})});
    }
  }
  cases.push_back({"gpt 3d: pipeline 2 x dp 2 x tp 2", "gpt_3d.toml", 8, {}});
  cases.push_back({"gpt 3d, stages sharded: pipeline 2 x fsdp 2 x tp 2",
                   "gpt_3d.toml",
                   8,
                   {"strategy.dp_sharding=\"full\""}});
  // Stages sharded over their data-parallel ranks under each schedule kind, in both sharding
  // modes, with and without recomputing their blocks.
  for (const std::string sharding : {"full", "grad_op"}) {
    for (const std::string schedule : {"1f1b", "zero_bubble", "interleaved_1f1b"}) {
      for (const std::string checkpointing : {"none", "all"}) {
        cases.push_back({"gpt pipeline 2 x fsdp " + sharding + " 2, " + schedule + ", recompute " +
                             checkpointing,
                         "gpt_pipeline.toml",
                         4,
                         {"parallel.dp_shard=2", "strategy.dp_sharding=\"" + sharding + "\"",
                          "strategy.schedule=\"" + schedule + "\"",
                          "run.activation_checkpointing=\"" + checkpointing + "\"",
                          std::string("strategy.virtual_stages=") +
                              (schedule == "interleaved_1f1b" ? "2" : "1")}});
      }
    }
  }
  cases.push_back({"llama pipeline 2 x fsdp 2",
                   "llama_text.toml",
                   4,
                   {"strategy.plugin=pipeline", "parallel.pp=2", "parallel.dp_shard=2",
                    "strategy.dp_sharding=\"full\"", "strategy.micro_batches=4"}});
  cases.push_back({"llama 3d: pipeline 2 x dp 2 x tp 2",
                   "llama_text.toml",
                   8,
                   {"strategy.plugin=pipeline", "parallel.pp=2", "parallel.tp=2",
                    "parallel.dp_shard=2", "strategy.micro_batches=4", "loader.batch_size=8"}});
  for (const std::string layout : {"single", "fsdp", "tp"}) {
    std::vector<std::string> sets;
    if (layout == "fsdp") sets = kFsdp;
    if (layout == "tp") sets = {"strategy.plugin=ddp", "parallel.tp=2", "parallel.dp_shard=1"};
    cases.push_back(
        {"llama lora " + layout, "llama_finetune.toml", layout == "single" ? 1 : 2, sets});
  }
  for (const PlanCase& c : cases) expect_plan_matches_run(c);
}

// The --set arguments on one line of plan --fit's output.
std::vector<std::string> sets_on(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    if (word == "--set" && words >> word) out.insert(out.end(), {"--set", word});
  }
  return out;
}

// The median step of a 12-step run of gpt_text on 2 ranks with `sets`, after two warm-up steps.
double measured_step_ms(const std::vector<std::string>& sets, const std::filesystem::path& out) {
  std::vector<std::string> args = {"--set", "run.max_steps=12", "--set", "run.log_every=1",
                                   "--set", "run.eval=false",   "--set", "loader.workers=0"};
  args.insert(args.end(), sets.begin(), sets.end());
  const CommandResult run = run_launched(2, source_dir() / "recipes" / "gpt_text.toml", out, args);
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  std::vector<double> steps;
  for (const auto& record : of_phase(read_metrics(out / "metrics.rank0.jsonl"), "train")) {
    steps.push_back(record.at("step_time_ms"));
  }
  if (steps.size() < 5) return 0;
  steps.erase(steps.begin(), steps.begin() + 2);
  std::sort(steps.begin(), steps.end());
  return steps[steps.size() / 2];
}

// --fit's choice and the four best predicted runners-up that fit, each run for real: none is
// more than 10% faster than the choice.
TEST(MemoryPlanGrid, NoneOfTheFiveBestPredictedLayoutsIsMuchFasterThanTheChoice) {
  TempDir dir;
  const CommandResult fit = run_host({"plan", (source_dir() / "recipes" / "gpt_text.toml").string(),
                                      "--nproc", "2", "--memory", "0.0586", "--fit"});
  ASSERT_EQ(fit.exit_code, 0) << describe(fit);
  std::vector<std::vector<std::string>> layouts;
  std::istringstream lines(fit.out);
  std::string line;
  std::getline(lines, line);
  std::getline(lines, line);
  layouts.push_back(sets_on(line));
  while (std::getline(lines, line)) {
    if (line.find("% step time") == std::string::npos) continue;
    if (std::getline(lines, line)) layouts.push_back(sets_on(line));
  }
  ASSERT_GE(layouts.size(), 2u) << fit.out;
  const double chosen_ms = measured_step_ms(layouts.front(), dir / "chosen");
  ASSERT_GT(chosen_ms, 0);
  for (std::size_t i = 1; i < layouts.size(); ++i) {
    const double other_ms = measured_step_ms(layouts[i], dir / ("other" + std::to_string(i)));
    EXPECT_GE(other_ms, 0.9 * chosen_ms) << "runner-up " << i << " ran in " << other_ms
                                         << " ms against the choice's " << chosen_ms << " ms";
  }
}

}  // namespace
}  // namespace trainyard::testing
