#include "plan_check.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "layout_plan.hpp"
#include "trainyard/runtime/byte_size.hpp"

namespace trainyard {

namespace {

int environment_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

std::string pair(std::int64_t planned, std::int64_t measured) {
  const double ratio =
      measured > 0 ? static_cast<double>(planned) / static_cast<double>(measured) : 0.0;
  char text[32];
  std::snprintf(text, sizeof text, " (%.2fx)", ratio);
  return format_mib(planned) + " / " + format_mib(measured) + text;
}

}  // namespace

int launched_world_size() { return std::max(1, environment_int("WORLD_SIZE", 1)); }

std::optional<PlannedMemory> plan_this_rank(const std::filesystem::path& recipe,
                                            const std::vector<std::string>& overrides,
                                            const Registry& registry,
                                            const std::function<void(const std::string&)>& log) {
  const int world = launched_world_size();
  const int rank = environment_int("RANK", 0);
  try {
    const LayoutPlan plan = plan_layout(recipe, overrides, world, registry);
    if (plan.pipeline_ranks.empty()) return plan.memory;
    // Pipeline stages are the mesh's outermost axis.
    const auto per_stage = world / static_cast<int>(plan.pipeline_ranks.size());
    return plan.pipeline_ranks[static_cast<std::size_t>(rank / std::max(1, per_stage))];
  } catch (const std::exception& error) {
    log(std::string("trainyard: note: no memory plan to check this run against: ") + error.what());
    return std::nullopt;
  }
}

std::vector<std::string> compare_plan(const PlannedMemory& plan, const MeasuredMemory& measured) {
  std::vector<std::string> lines = {
      "memory, planned / measured by the allocator: parameters " +
          pair(plan.held_parameters(), measured.held.parameters) + ", gradients " +
          pair(plan.gradients, measured.held.gradients) + ", optimizer state " +
          pair(plan.optimizer_state, measured.held.optimizer_state),
      "memory, planned / measured: kept by a forward " +
          pair(plan.forward_held, measured.activations) + ", at a step's start " +
          pair(plan.step_start, measured.step_start) + ", peak " +
          pair(plan.peak.bytes, measured.peak) + " in the " + plan.peak.phase + " / " +
          measured.peak_phase + " phase"};
  if (measured.peak_reserved > 0) {
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%", 100.0 * measured.fragmentation);
    lines.push_back("memory, the device's caching allocator: reserved at most " +
                    format_mib(measured.peak_reserved) + ", of which " + share +
                    " never handed out at once (fragmentation and cached blocks), above the "
                    "peak the plan predicts for what is allocated");
  }
  return lines;
}

}  // namespace trainyard
