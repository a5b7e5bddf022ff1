// `trainyard plan` against the allocator (memory_plan_support.hpp): a fast core of bundled
// recipes on data-parallel layouts, and the refusals of what plan cannot plan.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "memory_plan_support.hpp"
#include "metrics_file.hpp"
#include "parity_runs.hpp"
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
           // Each rank's tensor-parallel pieces, sharded over dp_shard.
           {"gpt fsdp 2 x tp 2", "gpt_text.toml", 4, with(kFsdp, {"parallel.tp=2"})},
           // Pipeline stages sharded over their data-parallel ranks, whole gradients
           // accumulating locally across the micro-batches.
           {"gpt pipeline 2 x fsdp 2",
            "gpt_pipeline.toml",
            4,
            {"parallel.dp_shard=2", "strategy.dp_sharding=\"full\""}},
           // Two sharded stages per rank, interleaved: each stage's units gathered apart (one
           // stage's backward at a time), the shards' gradients set to none at a step's start.
           {"gpt pipeline interleaved 2 x fsdp grad_op 2",
            "gpt_pipeline.toml",
            4,
            {"parallel.dp_shard=2", "strategy.dp_sharding=\"grad_op\"",
             "strategy.schedule=\"interleaved_1f1b\"", "strategy.virtual_stages=2"}},
           // Two stages per rank in a V: a split backward's kept gradients, a stage handed over
           // on rank 1, and the tied embedding's two copies on rank 0.
           {"gpt pipeline zero_bubble_v 2",
            "gpt_pipeline.toml",
            2,
            {"strategy.schedule=\"zero_bubble_v\"", "strategy.virtual_stages=2"}},
           // Recomputed blocks under a split backward; the last stage sends an input gradient
           // back for every micro-batch, each released once the first stage's next activations
           // show that it arrived (not held to the step's end).
           {"gpt pipeline zero_bubble 2, recompute all",
            "gpt_pipeline.toml",
            2,
            {"strategy.schedule=\"zero_bubble\"", "run.activation_checkpointing=\"all\""}},
       }) {
    expect_plan_matches_run(c);
  }
}

TEST(MemoryPlan, RefusesWhatItCannotPlanInOneLine) {
  const fs::path gpt = source_dir() / "recipes" / "gpt_text.toml";
  // A tensor-parallel layout the model cannot split: the model's own refusal, in one line.
  const CommandResult heads =
      run_host({"plan", gpt.string(), "--nproc", "3", "--set", "strategy.plugin=ddp", "--set",
                "parallel.tp=3", "--set", "parallel.dp_shard=1"});
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_NE(heads.err.find("does not divide by tp (3)"), std::string::npos) << describe(heads);
  EXPECT_EQ(heads.err.find('\n'), heads.err.size() - 1) << describe(heads);
  const CommandResult world =
      run_host({"plan", (source_dir() / "recipes" / "gpt_3d.toml").string(), "--nproc", "6"});
  EXPECT_NE(world.exit_code, 0);
  EXPECT_NE(world.err.find("needs a world size divisible by 4, but there are 6 ranks"),
            std::string::npos)
      << describe(world);
  const CommandResult no_ranks = run_host({"plan", gpt.string(), "--nproc", "0"});
  EXPECT_NE(no_ranks.exit_code, 0);
  EXPECT_NE(no_ranks.err.find("--nproc must be at least 1"), std::string::npos)
      << describe(no_ranks);
  const CommandResult no_memory = run_host({"plan", gpt.string(), "--memory", "0"});
  EXPECT_NE(no_memory.exit_code, 0);
  EXPECT_NE(no_memory.err.find("--memory must be a positive number of GiB"), std::string::npos)
      << describe(no_memory);
  // A cap no change fits under: said, with the smallest peak the planner found.
  const CommandResult too_small = run_host({"plan", gpt.string(), "--memory", "0.005"});
  EXPECT_EQ(too_small.exit_code, 1) << describe(too_small);
  EXPECT_NE(too_small.out.find("does not fit: the peak"), std::string::npos) << describe(too_small);
  EXPECT_NE(too_small.out.find("no change the planner tries fits: the smallest predicted peak is"),
            std::string::npos)
      << describe(too_small);
  const CommandResult roomy = run_host({"plan", gpt.string(), "--memory", "1"});
  EXPECT_EQ(roomy.exit_code, 0) << describe(roomy);
  EXPECT_NE(roomy.out.find("fits: the peak"), std::string::npos) << describe(roomy);
  const CommandResult single_on_two = run_host({"plan", gpt.string(), "--nproc", "2"});
  EXPECT_NE(single_on_two.exit_code, 0);
  EXPECT_NE(single_on_two.err.find("single runs on one rank"), std::string::npos)
      << describe(single_on_two);
}

// The --set arguments of the first change the out-of-memory report lists ("trainyard:   --set a=b
// --set c=d    peak ..."), empty when it lists none.
std::vector<std::string> first_suggestion(const std::string& report) {
  const std::string header = "changes the planner predicts would fit:\n";
  const auto start = report.find(header);
  if (start == std::string::npos) return {};
  const auto line_start = start + header.size();
  const std::string line = report.substr(line_start, report.find('\n', line_start) - line_start);
  std::vector<std::string> args;
  std::istringstream words(line.substr(0, line.find("    peak")));
  for (std::string word; words >> word;) {
    if (word == "--set") {
      words >> word;
      args.push_back("--set");
      args.push_back(word);
    }
  }
  return args;
}

TEST(MemoryPlan, AnOutOfMemoryRunReportsWhatWouldFitAndItsFirstSuggestionDoes) {
  TempDir dir;
  const fs::path gpt = source_dir() / "recipes" / "gpt_text.toml";
  // The plan's peak for gpt_text is about 82 MiB a rank; 60 MiB does not hold it.
  const std::vector<std::string> limited = {
      "--set", "run.memory_limit=0.0586", "--set", "run.max_steps=2",
      "--set", "run.eval=false",          "--set", "loader.workers=0"};
  const CommandResult exhausted = run_one_process(gpt, dir / "exhausted", limited);
  EXPECT_EQ(exhausted.exit_code, 1) << describe(exhausted);
  EXPECT_NE(exhausted.err.find("rank 0 ran out of memory in the forward phase of step 1"),
            std::string::npos)
      << describe(exhausted);
  EXPECT_NE(exhausted.err.find("over run.memory_limit (60.01 MiB)"), std::string::npos)
      << describe(exhausted);
  EXPECT_NE(exhausted.err.find("held then: parameters 3.21 MiB"), std::string::npos)
      << describe(exhausted);
  const std::vector<std::string> suggestion = first_suggestion(exhausted.err);
  ASSERT_FALSE(suggestion.empty()) << describe(exhausted);
  std::vector<std::string> applied = limited;
  applied.insert(applied.end(), suggestion.begin(), suggestion.end());
  const CommandResult fits = run_one_process(gpt, dir / "fits", applied);
  EXPECT_EQ(fits.exit_code, 0) << describe(fits);

  // A limit nothing the planner tries fits under: it says so, with the smallest peak it found.
  std::vector<std::string> tiny = limited;
  tiny[1] = "run.memory_limit=0.01";
  const CommandResult hopeless = run_one_process(gpt, dir / "hopeless", tiny);
  EXPECT_EQ(hopeless.exit_code, 1);
  EXPECT_NE(hopeless.err.find("no change the planner tries fits: the smallest predicted peak is"),
            std::string::npos)
      << describe(hopeless);
}

// compare puts each variant's planned step peak beside the one its run measured.
TEST(MemoryPlan, CompareShowsThePlanBesideTheMeasurement) {
  TempDir dir;
  const CommandResult compared =
      run_host({"compare", (source_dir() / "recipes" / "gpt_text.toml").string(), "--vary",
                "strategy.plugin=ddp,fsdp", "--nproc", "2", "--steps", "4", "--output",
                (dir / "report").string(), "--set", "loader.workers=0"});
  ASSERT_EQ(compared.exit_code, 0) << describe(compared);
  const std::string table = read_text(dir / "report" / "table.txt");
  EXPECT_NE(table.find("step peak plan / measured"), std::string::npos) << table;
  const std::regex pair(R"(([0-9.]+) MiB / ([0-9.]+) MiB)");
  int rows = 0;
  for (std::sregex_iterator it(table.begin(), table.end(), pair), end; it != end; ++it) {
    const double planned = std::stod((*it)[1]);
    const double measured = std::stod((*it)[2]);
    EXPECT_LE(std::abs(planned - measured), kPlanTolerance * measured) << it->str();
    ++rows;
  }
  EXPECT_EQ(rows, 2) << table;
}

// --fit under a cap: the layout it chooses runs under that cap as run.memory_limit.
TEST(MemoryPlan, FitChoosesALayoutThatRunsUnderTheCap) {
  TempDir dir;
  const fs::path gpt = source_dir() / "recipes" / "gpt_text.toml";
  // gpt_text's own layout on 2 ranks peaks near 85 MiB a rank.
  const CommandResult fit =
      run_host({"plan", gpt.string(), "--nproc", "2", "--memory", "0.0586", "--fit"});
  ASSERT_EQ(fit.exit_code, 0) << describe(fit);
  std::istringstream lines(fit.out);
  std::string line;
  std::getline(lines, line);
  EXPECT_NE(line.find("fastest layout that fits"), std::string::npos) << fit.out;
  std::getline(lines, line);
  std::vector<std::string> chosen;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    if (word == "--set" && words >> word) chosen.insert(chosen.end(), {"--set", word});
  }
  ASSERT_FALSE(chosen.empty()) << fit.out;
  std::vector<std::string> sets = {"--set", "run.memory_limit=0.0586", "--set", "run.max_steps=3",
                                   "--set", "run.eval=false",          "--set", "loader.workers=0"};
  sets.insert(sets.end(), chosen.begin(), chosen.end());
  const CommandResult run = run_launched(2, gpt, dir / "run", sets);
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  // A cap nothing fits under: said, with the smallest peak found.
  const CommandResult hopeless =
      run_host({"plan", gpt.string(), "--nproc", "2", "--memory", "0.005", "--fit"});
  EXPECT_EQ(hopeless.exit_code, 1) << describe(hopeless);
  EXPECT_NE(hopeless.out.find("nothing the planner tries fits"), std::string::npos)
      << describe(hopeless);
  const CommandResult no_cap = run_host({"plan", gpt.string(), "--nproc", "2", "--fit"});
  EXPECT_NE(no_cap.exit_code, 0);
  EXPECT_NE(no_cap.err.find("--fit needs --memory GiB"), std::string::npos) << describe(no_cap);
}

// On a GPU the caching allocator's reserved bytes and fragmentation come beside the plan, in the
// run's records and in its side-by-side lines.
TEST(MemoryPlanCuda, AGpuRunReportsTheCachingAllocatorsReservedBytesAndFragmentation) {
  TempDir dir;
  const CommandResult run = run_host(
      {"run", (source_dir() / "recipes" / "gpt_text.toml").string(), "--set", "run.device=cuda",
       "--set", "run.track_memory=true", "--set", "run.max_steps=6", "--set", "run.log_every=3",
       "--set", "run.eval=false", "--set", "run.output_dir=" + (dir / "run").string()},
      {}, 300);
  if (run.exit_code != 0 && run.err.find("which is not available") != std::string::npos) {
    TRAINYARD_SKIP_WITHOUT_GPU() << "no CUDA device";
  }
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_NE((run.out + run.err).find("the device's caching allocator: reserved at most"),
            std::string::npos)
      << describe(run);
  const auto records = of_phase(read_metrics(dir / "run" / "metrics.jsonl"), "train");
  ASSERT_FALSE(records.empty());
  const auto& last = records.back();
  ASSERT_TRUE(last.has("memory_peak_reserved_bytes")) << "no reserved bytes recorded";
  EXPECT_GE(last.at("memory_peak_reserved_bytes"), last.at("memory_peak_bytes"));
  EXPECT_GE(last.at("memory_reserved_bytes"), last.at("memory_current_bytes"));
  EXPECT_GE(last.at("memory_fragmentation"), 0.0);
  EXPECT_LT(last.at("memory_fragmentation"), 1.0);
}

}  // namespace
}  // namespace trainyard::testing
