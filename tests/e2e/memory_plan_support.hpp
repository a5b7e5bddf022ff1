#pragma once
// What the memory plan tests share: a layout of a bundled recipe planned by `trainyard plan` and
// run with run.track_memory, each figure compared on every rank.

#include <string>
#include <vector>

namespace trainyard::testing {

inline constexpr double kPlanTolerance = 0.10;

struct PlanCase {
  std::string name;
  std::string recipe;  // under recipes/
  int ranks;
  std::vector<std::string> sets;  // section.key=value
};

// The plan's parameters, gradients, optimizer state, what a forward keeps (activations and the
// whole parameters it leaves gathered), bytes at a step's start and peak each within
// kPlanTolerance of the run's on every rank, and its peak in the same phase.
void expect_plan_matches_run(const PlanCase& plan_case);

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more);

}  // namespace trainyard::testing
