#pragma once
// A recipe's layout planned: how each rank holds the model ([strategy], [parallel], the
// process count) and the memory the plan gives it (memory_plan.hpp). What `trainyard plan`
// prints, and what the out-of-memory report and its suggestions are computed from.

#include <filesystem>
#include <string>
#include <vector>

#include "memory_plan.hpp"

namespace trainyard {

class Registry;

struct LayoutPlan {
  PlanLayout layout;
  std::string described;  // "fsdp (full) on pp 1 x ... , micro-batch 16"
  PlannedMemory memory;   // every rank's, or the pipeline rank's with the highest peak
  std::vector<PlannedMemory> pipeline_ranks;  // each pipeline rank's, in order (stages)
};

// Plans the recipe at `recipe` with `overrides` (section.key=value) on `nproc` processes (0: the
// product of its [parallel] sizes). Its plugins must be loaded in `registry`. Throws Error for a
// layout it cannot plan or a process count the mesh cannot take.
LayoutPlan plan_layout(const std::filesystem::path& recipe,
                       const std::vector<std::string>& overrides, int nproc,
                       const Registry& registry);

}  // namespace trainyard
