// [run] profile_steps: the Kineto profile of chosen steps is a Chrome trace JSON (the format
// chrome://tracing and Perfetto open) holding the ATen ops of those steps alone, each step under
// its own range, one file per rank.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard::testing {
namespace {

const char* const kRecipe = "recipes/fashion_mnist_mlp.toml";

// How often each event name occurs in a Chrome trace, after checking the trace's shape: an
// object with a traceEvents array whose complete events ("ph": "X") have a name, a start and a
// duration.
std::map<std::string, int> event_counts(const std::filesystem::path& file) {
  const nlohmann::json trace = parse_strict_json(read_text(file), file.string());
  std::map<std::string, int> counts;
  EXPECT_TRUE(trace.is_object());
  const auto& events = trace.at("traceEvents");
  EXPECT_TRUE(events.is_array());
  for (const auto& event : events) {
    if (!event.contains("ph") || event.at("ph") != "X") continue;
    EXPECT_TRUE(event.at("name").is_string()) << event.dump();
    EXPECT_TRUE(event.at("ts").is_number()) << event.dump();
    EXPECT_TRUE(event.at("dur").is_number()) << event.dump();
    ++counts[event.at("name").get<std::string>()];
  }
  return counts;
}

void expect_steps_five_to_seven(const std::map<std::string, int>& counts, int linear_layers) {
  for (int step = 1; step <= 8; ++step) {
    const bool profiled = step >= 5 && step <= 7;
    EXPECT_EQ(counts.count("trainyard step " + std::to_string(step)), profiled ? 1u : 0u)
        << "step " << step;
  }
  // The mlp's linear layers each run one addmm per forward.
  ASSERT_TRUE(counts.count("aten::addmm"));
  EXPECT_EQ(counts.at("aten::addmm"), 3 * linear_layers);
}

TEST(ProfileRun, StepsFiveToSevenAreAChromeTraceOfTheirOps) {
  TempDir dir;
  const CommandResult result =
      run_host({"run", kRecipe, "--set", "run.max_steps=8", "--set", "run.eval=false", "--set",
                "run.profile_steps=[5, 7]", "--set", "run.output_dir=" + dir.path().string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_HAS(result.err, "profile of steps 5..7 written to ");
  EXPECT_EQ(result.err.find("ERROR:"), std::string::npos) << result.err;
  expect_steps_five_to_seven(event_counts(dir / "profile.rank0.json"), 3);
}

TEST(ProfileRun, EachDdpRankWritesItsOwn) {
  TempDir dir;
  const CommandResult result =
      run_host({"launch", "--nproc-per-node", "2", kRecipe, "--set", "run.max_steps=8", "--set",
                "run.eval=false", "--set", "strategy.plugin=ddp", "--set",
                "run.profile_steps=[5, 7]", "--set", "run.output_dir=" + dir.path().string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (int rank = 0; rank < 2; ++rank) {
    const auto counts = event_counts(dir / ("profile.rank" + std::to_string(rank) + ".json"));
    expect_steps_five_to_seven(counts, 3);
    // ddp's gradient all-reduce is recorded with the ops, from its launch in backward to its
    // completion (shared_memory:all_reduce on one host, gloo:all_reduce over TCP).
    bool collective = false;
    for (const auto& [name, count] : counts) {
      collective = collective || name.find("all_reduce") != std::string::npos;
    }
    EXPECT_TRUE(collective) << "rank " << rank;
  }
}

TEST(ProfileRun, MalformedStepsAreRefused) {
  for (const char* steps : {"[7, 5]", "[0, 3]", "[5]"}) {
    const CommandResult result =
        run_host({"validate", kRecipe, "--set", std::string("run.profile_steps=") + steps});
    EXPECT_NE(result.exit_code, 0) << steps;
    EXPECT_HAS(result.err, "run.profile_steps must be [FIRST, LAST] with 1 <= FIRST <= LAST");
  }
}

}  // namespace
}  // namespace trainyard::testing
