#include "memory_advice.hpp"

#include <algorithm>

#include "layout_plan.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/byte_size.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace {

// The changes tried, least intrusive first: shard the optimizer state or the gradients and
// parameters further (no extra compute), split the micro-batch and accumulate (the same global
// batch, smaller kernels), recompute every block (a second forward), and the last two together.
std::vector<MemoryChange> candidates(const Recipe& resolved, const PlanLayout& layout) {
  std::vector<MemoryChange> out;
  if (layout.holding == ModelHolding::kShardedUnits && layout.sharding != "full") {
    out.push_back({{"strategy.sharding=\"full\""},
                   "shard parameters between forward and backward",
                   0,
                   "shard"});
  }
  if (layout.holding == ModelHolding::kReplicated && !layout.zero1) {
    out.push_back({{"strategy.zero1=true"}, "shard the optimizer state", 0, "shard"});
  }
  std::vector<MemoryChange> splits;
  for (std::int64_t factor = 2; factor <= 8; factor *= 2) {
    if (layout.micro_batch % factor != 0) break;
    splits.push_back({{"loader.batch_size=" + std::to_string(layout.micro_batch / factor),
                       "run.grad_accumulation=" + std::to_string(layout.accumulation * factor)},
                      "micro-batches of " + std::to_string(layout.micro_batch / factor) +
                          " accumulated " + std::to_string(layout.accumulation * factor) +
                          " times, the same global batch",
                      0,
                      "split"});
  }
  out.insert(out.end(), splits.begin(), splits.end());
  if (resolved.section("run").get_string("activation_checkpointing") != "all") {
    const MemoryChange recompute{{"run.activation_checkpointing=\"all\""},
                                 "recompute every block in backward",
                                 0,
                                 "recompute"};
    out.push_back(recompute);
    for (const auto& split : splits) {
      out.push_back({with_settings(recompute.sets, split.sets), recompute.why + ", " + split.why, 0,
                     "recompute and split"});
    }
  }
  return out;
}

}  // namespace

MemoryAdvice advise_memory(const std::filesystem::path& recipe,
                           const std::vector<std::string>& overrides, int nproc,
                           std::int64_t limit_bytes, const Registry& registry) {
  ProbeCache probes;
  const LayoutPlan current = plan_layout(recipe, overrides, nproc, registry, &probes);
  MemoryAdvice advice;
  advice.planned_peak = current.memory.peak.bytes;
  advice.planned_phase = current.memory.peak.phase;
  advice.smallest = {{}, "the recipe as it is", advice.planned_peak, ""};
  const Recipe resolved = resolve_recipe(load_recipe(recipe, overrides), registry);
  for (MemoryChange change : candidates(resolved, current.layout)) {
    change.peak_bytes =
        plan_layout(recipe, with_settings(overrides, change.sets), nproc, registry, &probes)
            .memory.peak.bytes;
    if (change.peak_bytes < advice.smallest.peak_bytes) advice.smallest = change;
    // The least intrusive of each kind that fits: a choice between kinds, not three splits.
    const bool kind_listed =
        std::any_of(advice.fitting.begin(), advice.fitting.end(),
                    [&](const MemoryChange& listed) { return listed.kind == change.kind; });
    if (change.peak_bytes <= limit_bytes && !kind_listed && advice.fitting.size() < 3) {
      advice.fitting.push_back(change);
    }
  }
  return advice;
}

std::vector<std::string> describe_changes(const MemoryAdvice& advice) {
  std::vector<std::string> lines;
  const auto sets = [](const MemoryChange& change) {
    std::string text;
    for (const auto& set : change.sets) text += (text.empty() ? "" : " ") + ("--set " + set);
    return text;
  };
  if (advice.fitting.empty()) {
    lines.push_back("no change the planner tries fits: the smallest predicted peak is " +
                    format_mib(advice.smallest.peak_bytes) + " (" + advice.smallest.why +
                    (advice.smallest.sets.empty() ? "" : ": " + sets(advice.smallest)) + ")");
    return lines;
  }
  lines.push_back("changes the planner predicts would fit:");
  for (const auto& change : advice.fitting) {
    lines.push_back("  " + sets(change) + "    peak " + format_mib(change.peak_bytes) + " (" +
                    change.why + ")");
  }
  return lines;
}

std::vector<std::string> describe_shortage(const MemoryShortage& shortage,
                                           const MemoryAdvice& advice) {
  std::vector<std::string> lines;
  lines.push_back("held then: parameters " + format_mib(shortage.held.parameters) + ", gradients " +
                  format_mib(shortage.held.gradients) + ", optimizer state " +
                  format_mib(shortage.held.optimizer_state) +
                  "; the plan's peak for this layout: " + format_mib(advice.planned_peak) +
                  " in the " + advice.planned_phase + " phase");
  for (const auto& line : describe_changes(advice)) lines.push_back(line);
  return lines;
}

}  // namespace trainyard
