#pragma once
// A recipe's layout planned: how each rank holds the model ([strategy], [parallel], the
// process count) and the memory the plan gives it (memory_plan.hpp). What `trainyard plan`
// prints, and what the out-of-memory report and its suggestions are computed from.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "link_probe.hpp"
#include "memory_plan.hpp"

namespace trainyard {

class Registry;

struct LayoutPlan {
  PlanLayout layout;
  std::string described;  // "fsdp (full) on pp 1 x ... , micro-batch 16"
  PlannedMemory memory;   // every rank's, or the pipeline rank's with the highest peak
  std::vector<PlannedMemory> pipeline_ranks;  // each pipeline rank's, in order (stages)
  LinkCost link;  // what the communication time was reckoned with (time_communication)
};

// Probes of one recipe kept by what they depend on beyond the recipe's model, optimizer and
// precision (the micro-batch, the recomputed blocks, the threads), so that a search plans many
// layouts of it from few probes.
class ProbeCache {
 public:
  const ModelFootprint& probe(const std::filesystem::path& recipe,
                              const std::vector<std::string>& overrides, std::int64_t micro_batch,
                              int threads, int tp, const std::string& checkpointing,
                              const Registry& registry);

 private:
  std::map<std::tuple<std::int64_t, int, int, std::string>, ModelFootprint> probes_;
};

// `settings` (section.key=value) followed by `more`, which win where they name the same key.
std::vector<std::string> with_settings(std::vector<std::string> settings,
                                       const std::vector<std::string>& more);

// Plans the recipe at `recipe` with `overrides` (section.key=value) on `nproc` processes (0: the
// product of its [parallel] sizes). Its plugins must be loaded in `registry`. Throws Error for a
// layout it cannot plan or a process count the mesh cannot take. With `cache`, probes are shared
// with the other plans made through it.
LayoutPlan plan_layout(const std::filesystem::path& recipe,
                       const std::vector<std::string>& overrides, int nproc,
                       const Registry& registry, ProbeCache* cache = nullptr);

// Adds each rank's communication time to `plan`: its collectives and sends over the link of the
// layout's ranks on this machine (link_probe.hpp: cached, or measured now, about a second). Not
// for a rank of a running job (plan_this_rank), whose peers are computing.
void time_communication(LayoutPlan& plan, const Registry& registry);

}  // namespace trainyard
