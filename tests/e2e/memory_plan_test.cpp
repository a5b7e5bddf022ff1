// `trainyard plan` against the allocator (memory_plan_support.hpp): a fast core of bundled
// recipes on data-parallel layouts, and the refusals of what plan cannot plan.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "memory_plan_support.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kFsdp = {"strategy.plugin=fsdp", "parallel.dp_shard=2"};

TEST(MemoryPlan, FastCoreWithinTenPercentOfTheAllocator) {
  for (const PlanCase& c : std::vector<PlanCase>{
           {"gpt single", "gpt_text.toml", 1, {}},
           {"gpt fsdp full 2", "gpt_text.toml", 2, with(kFsdp, {"strategy.sharding=full"})},
           {"cnn ddp 2",
            "fashion_mnist_cnn.toml",
            2,
            {"strategy.plugin=ddp", "parallel.dp_shard=2"}},
       }) {
    expect_plan_matches_run(c);
  }
}

TEST(MemoryPlan, RefusesWhatItCannotPlanInOneLine) {
  const fs::path gpt = source_dir() / "recipes" / "gpt_text.toml";
  const CommandResult pipeline =
      run_host({"plan", (source_dir() / "recipes" / "gpt_pipeline.toml").string()});
  EXPECT_NE(pipeline.exit_code, 0);
  EXPECT_NE(pipeline.err.find("pipeline and tensor-parallel layouts are not planned yet"),
            std::string::npos)
      << describe(pipeline);
  const CommandResult no_ranks = run_host({"plan", gpt.string(), "--nproc", "0"});
  EXPECT_NE(no_ranks.exit_code, 0);
  EXPECT_NE(no_ranks.err.find("--nproc must be at least 1"), std::string::npos)
      << describe(no_ranks);
  const CommandResult single_on_two = run_host({"plan", gpt.string(), "--nproc", "2"});
  EXPECT_NE(single_on_two.exit_code, 0);
  EXPECT_NE(single_on_two.err.find("single runs on one rank"), std::string::npos)
      << describe(single_on_two);
}

}  // namespace
}  // namespace trainyard::testing
