#include "memory_plan_support.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <utility>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {

namespace fs = std::filesystem;

constexpr std::array<const char*, 6> kPhases = {"data_wait", "h2d",       "forward",
                                                "backward",  "comm_wait", "optimizer"};

namespace {

std::vector<std::string> as_set_arguments(const std::vector<std::string>& sets) {
  std::vector<std::string> out;
  for (const auto& set : sets) {
    out.push_back("--set");
    out.push_back(set);
  }
  return out;
}

}  // namespace

void expect_plan_matches_run(const PlanCase& c) {
  SCOPED_TRACE(c.name);
  TempDir dir;
  const fs::path recipe = source_dir() / "recipes" / c.recipe;
  std::vector<std::string> plan_args = {"plan", recipe.string(), "--json", "--nproc",
                                        std::to_string(c.ranks)};
  for (const auto& arg : as_set_arguments(c.sets)) plan_args.push_back(arg);
  const CommandResult planned = run_host(plan_args);
  ASSERT_EQ(planned.exit_code, 0) << describe(planned);
  const nlohmann::json plan = nlohmann::json::parse(planned.out);

  std::vector<std::string> sets = c.sets;
  for (const char* set : {"run.track_memory=true", "run.max_steps=3", "run.eval=false",
                          "sinks.jsonl.path=\"\"", "loader.workers=0"}) {
    sets.emplace_back(set);
  }
  const fs::path out = dir / "run";
  const CommandResult run = c.ranks == 1
                                ? run_one_process(recipe, out, as_set_arguments(sets))
                                : run_launched(c.ranks, recipe, out, as_set_arguments(sets));
  ASSERT_EQ(run.exit_code, 0) << describe(run);
  // The run checks itself against the plan, on every rank.
  const std::string said = run.out + run.err;
  std::size_t checks = 0;
  for (auto at = said.find("memory, planned / measured by the allocator: parameters");
       at != std::string::npos;
       at = said.find("memory, planned / measured by the allocator: parameters", at + 1)) {
    ++checks;
  }
  EXPECT_EQ(checks, static_cast<std::size_t>(c.ranks)) << describe(run);
  for (int rank = 0; rank < c.ranks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string file =
        c.ranks == 1 ? "metrics.jsonl" : "metrics.rank" + std::to_string(rank) + ".jsonl";
    const auto summaries = of_phase(read_metrics(out / file), "summary");
    ASSERT_EQ(summaries.size(), 1u);
    const MetricLine& measured = summaries.front();
    // A pipeline plans each of its ranks; the stages are the mesh's outermost axis.
    const nlohmann::json& planned =
        plan.contains("pipeline_ranks")
            ? plan.at("pipeline_ranks")
                  .at(static_cast<std::size_t>(rank) /
                      (static_cast<std::size_t>(c.ranks) / plan.at("pipeline_ranks").size()))
            : plan;
    const std::vector<std::pair<std::string, std::string>> figures = {
        {"held_parameters", "held_parameter_bytes"}, {"gradients", "held_gradient_bytes"},
        {"optimizer_state", "held_optimizer_bytes"}, {"forward_held", "memory_activation_bytes"},
        {"step_start", "memory_step_start_bytes"},   {"peak", "memory_step_peak_bytes"}};
    for (const auto& [planned_key, measured_key] : figures) {
      const double expected = measured.at(measured_key);
      const double predicted = planned.at(planned_key).get<double>();
      EXPECT_GT(expected, 0) << measured_key;
      EXPECT_LE(std::abs(predicted - expected), kPlanTolerance * expected)
          << planned_key << ": planned " << predicted << " bytes, measured " << expected;
    }
    // The plan's bytes in the phase the run peaked in are that peak: where two phases' peaks
    // are within a few percent of each other, either may be the run's highest.
    const auto phase = static_cast<std::size_t>(measured.at("memory_step_peak_phase"));
    ASSERT_LT(phase, kPhases.size());
    ASSERT_TRUE(planned.at("phases").contains(kPhases[phase])) << kPhases[phase];
    const double peak = measured.at("memory_step_peak_bytes");
    const double in_phase = planned.at("phases").at(kPhases[phase]).get<double>();
    EXPECT_LE(std::abs(in_phase - peak), kPlanTolerance * peak)
        << "the run peaked in the " << kPhases[phase] << " phase at " << peak
        << " bytes; the plan has " << in_phase << " there (its peak is in the "
        << planned.at("peak_phase").get<std::string>() << " phase)";
  }
}

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

}  // namespace trainyard::testing
