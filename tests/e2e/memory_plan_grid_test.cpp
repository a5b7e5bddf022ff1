// `trainyard plan` against the allocator (memory_plan_support.hpp) on single, ddp and fsdp in each
// sharding mode, for two bundled recipes with and without activation checkpointing, by label.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memory_plan_support.hpp"

namespace trainyard::testing {
namespace {

const std::vector<std::string> kFsdp = {"strategy.plugin=fsdp", "parallel.dp_shard=2"};

TEST(MemoryPlanGrid, EveryDataParallelLayoutWithinTenPercentOfTheAllocator) {
  std::vector<PlanCase> cases;
  // Not yet within 10%: zero1's bytes at a step's start (on gloo the all-gather's flat output is
  // sometimes still live then) and the mlp's fsdp backward, whose communication buffers
  // outweigh its activations.
  for (const std::string recipe : {"gpt_text.toml", "fashion_mnist_cnn.toml"}) {
    for (const std::string checkpointing : {"none", "all"}) {
      const std::string name = recipe + " " + checkpointing;
      const std::vector<std::string> base = {"run.activation_checkpointing=\"" + checkpointing +
                                             "\""};
      cases.push_back({name + " single", recipe, 1, base});
      cases.push_back(
          {name + " ddp 2", recipe, 2, with(base, {"strategy.plugin=ddp", "parallel.dp_shard=2"})});
      for (const std::string sharding : {"full", "grad_op", "none"}) {
        cases.push_back({name + " fsdp " + sharding + " 2", recipe, 2,
                         with(base, with(kFsdp, {"strategy.sharding=" + sharding}))});
      }
    }
  }
  for (const PlanCase& c : cases) expect_plan_matches_run(c);
}

}  // namespace
}  // namespace trainyard::testing
