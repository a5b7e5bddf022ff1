#pragma once
// Every run with run.track_memory checks the plan: before it starts, this rank's plan
// (layout_plan.hpp); after it ends, plan and the allocator's measurement side by side.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memory_plan.hpp"
#include "trainyard/runtime/engine.hpp"

namespace trainyard {

class Registry;

// The processes of the run this one belongs to: a launched rank's WORLD_SIZE, else 1.
int launched_world_size();

// The plan of this process's rank (a launched rank reads RANK and WORLD_SIZE), or nullopt when
// the layout cannot be planned: `log` is told why, and the run goes on.
std::optional<PlannedMemory> plan_this_rank(const std::filesystem::path& recipe,
                                            const std::vector<std::string>& overrides,
                                            const Registry& registry,
                                            const std::function<void(const std::string&)>& log);

// "memory, planned / measured: parameters 3.21 / 3.21 MiB, ..." and the peaks with their phases.
std::vector<std::string> compare_plan(const PlannedMemory& plan, const MeasuredMemory& measured);

}  // namespace trainyard
