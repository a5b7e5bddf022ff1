#pragma once
// What to change when a layout does not fit its memory: the planner (layout_plan.hpp) tries the
// changes a user would (shard more, split the micro-batch and accumulate, recompute blocks) and
// keeps those whose predicted peak fits. The out-of-memory report of `trainyard run` prints them.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/runtime/memory_exhausted.hpp"

namespace trainyard {

class Registry;

struct MemoryChange {
  std::vector<std::string> sets;  // section.key=value, to add to the run's
  std::string why;                // "recompute every block"
  std::int64_t peak_bytes = 0;    // the plan's peak per rank with it
  std::string kind;               // shard, split, recompute, recompute and split
};

struct MemoryAdvice {
  std::int64_t planned_peak = 0;  // the plan's peak as the recipe stands
  std::string planned_phase;
  // Least intrusive first: of each kind the least intrusive that fits, at most three.
  std::vector<MemoryChange> fitting;
  MemoryChange smallest;  // the lowest predicted peak of those tried
};

// The changes to the recipe at `recipe` with `overrides` on `nproc` processes whose predicted
// peak per rank is at most `limit_bytes`. The recipe's plugins must be loaded in `registry`.
MemoryAdvice advise_memory(const std::filesystem::path& recipe,
                           const std::vector<std::string>& overrides, int nproc,
                           std::int64_t limit_bytes, const Registry& registry);

// The changes that fit, each as --set arguments with its predicted peak, or that none does and
// the smallest peak found.
std::vector<std::string> describe_changes(const MemoryAdvice& advice);

// The report of a run that ran out: what was held, the plan beside it, and what would fit.
std::vector<std::string> describe_shortage(const MemoryShortage& shortage,
                                           const MemoryAdvice& advice);

}  // namespace trainyard
