#include "layout_search.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <set>

#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/runtime/byte_size.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace {

// A strategy's layout on the ranks: its settings and how many data-parallel ranks share the
// global batch.
struct StrategyLayout {
  std::vector<std::string> sets;
  int data_ranks = 1;
  int micro_batches = 1;  // a pipeline's per step: the batch must divide by it
};

// The meshes a data-parallel strategy runs on `nproc` ranks: every rank data-parallel, tensor
// parallelism of 2 under the rest, and (`hybrid`, for sharded units) replicas of shards of 2.
std::vector<StrategyLayout> data_parallel_meshes(int nproc, bool hybrid) {
  const auto sizes = [](int replicate, int shard, int tp) {
    return std::vector<std::string>{"parallel.pp=1", "parallel.tp=" + std::to_string(tp),
                                    "parallel.dp_replicate=" + std::to_string(replicate),
                                    "parallel.dp_shard=" + std::to_string(shard)};
  };
  std::vector<StrategyLayout> out = {{sizes(1, nproc, 1), nproc, 1}};
  if (nproc % 2 == 0) out.push_back({sizes(1, nproc / 2, 2), nproc / 2, 1});
  if (hybrid && nproc >= 4 && nproc % 2 == 0) out.push_back({sizes(2, nproc / 2, 1), nproc, 1});
  return out;
}

// Each loaded strategy's layouts on `nproc` ranks, by what its options say about how it holds
// the model: sharded units in each sharding mode that shards, a replica with or without its
// optimizer state sharded (each on the meshes above), or pipeline stages under 1F1B and zero
// bubble; the default strategy on one rank.
std::vector<StrategyLayout> strategy_layouts(const Registry& registry, int nproc) {
  const std::string ranks = std::to_string(nproc);
  std::vector<StrategyLayout> out;
  const auto on_meshes = [&](const std::vector<std::string>& sets, bool hybrid) {
    for (const StrategyLayout& mesh : data_parallel_meshes(nproc, hybrid)) {
      out.push_back({with_settings(sets, mesh.sets), mesh.data_ranks, 1});
    }
  };
  for (const auto& info : registry.list("strategy")) {
    std::set<std::string> options;
    for (const auto& option : info.options) options.insert(option.name);
    const std::string plugin = "strategy.plugin=" + info.name;
    if (info.name == default_plugins::kStrategy) {
      if (nproc == 1) out.push_back({{plugin, "parallel.dp_shard=1"}, 1, 1});
    } else if (nproc > 1 && options.count("sharding") && options.count("prefetch")) {
      for (const char* mode : {"full", "grad_op"}) {
        on_meshes({plugin, std::string("strategy.sharding=\"") + mode + "\""}, true);
      }
    } else if (nproc > 1 && options.count("zero1")) {
      for (const char* zero1 : {"false", "true"}) {
        on_meshes({plugin, std::string("strategy.zero1=") + zero1}, false);
      }
    } else if (nproc > 1 && options.count("schedule") && options.count("micro_batches")) {
      for (const char* schedule : {"1f1b", "zero_bubble"}) {
        out.push_back(
            {{plugin, std::string("strategy.schedule=\"") + schedule + "\"",
              "strategy.micro_batches=" + std::to_string(2 * nproc), "parallel.pp=" + ranks,
              "parallel.dp_shard=1", "parallel.tp=1", "parallel.dp_replicate=1"},
             1,
             2 * nproc});
      }
    }
  }
  return out;
}

// The recipe's global batch on `nproc` ranks: its data-parallel ranks (as its [parallel] sizes
// resolve there, else every rank) times its micro-batch and accumulation.
std::int64_t global_batch(const Recipe& resolved, int nproc) {
  int data_ranks = nproc;
  try {
    data_ranks = MeshLayout::resolve(mesh_request(resolved.section("parallel")), nproc)
                     .size(MeshGroup::kData);
  } catch (const Error&) {
  }
  return data_ranks * resolved.section("loader").get_int("batch_size") *
         resolved.section("run").get_int("grad_accumulation");
}

// Each layout recomputing its blocks or not, with the micro-batch its share of the global batch
// or that split 2, 4 or 8 ways and accumulated: the global batch stays the recipe's.
std::vector<std::vector<std::string>> candidates(const Registry& registry, const Recipe& resolved,
                                                 int nproc) {
  const std::int64_t global = global_batch(resolved, nproc);
  std::vector<std::vector<std::string>> out;
  for (const auto& layout : strategy_layouts(registry, nproc)) {
    if (global % layout.data_ranks != 0) continue;
    const std::int64_t per_rank = global / layout.data_ranks;
    for (std::int64_t accumulation : {1, 2, 4, 8}) {
      if (per_rank % accumulation != 0 || (per_rank / accumulation) % layout.micro_batches != 0) {
        continue;
      }
      const std::vector<std::string> split = {
          "loader.batch_size=" + std::to_string(per_rank / accumulation),
          "run.grad_accumulation=" + std::to_string(accumulation)};
      for (const char* recompute : {"none", "all"}) {
        out.push_back(
            with_settings(with_settings(layout.sets, split),
                          {std::string("run.activation_checkpointing=\"") + recompute + "\""}));
      }
    }
  }
  return out;
}

std::string as_arguments(const std::vector<std::string>& sets) {
  std::string text;
  for (const auto& set : sets) text += (text.empty() ? "" : " ") + ("--set " + set);
  return text;
}

std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  return text;
}

}  // namespace

std::vector<LayoutCandidate> search_layouts(const std::filesystem::path& recipe,
                                            const std::vector<std::string>& overrides, int nproc,
                                            std::int64_t cap_bytes, const Registry& registry) {
  const Recipe resolved = resolve_recipe(load_recipe(recipe, overrides), registry);
  ProbeCache cache;
  std::vector<LayoutCandidate> out;
  for (const auto& sets : candidates(registry, resolved, nproc)) {
    try {
      LayoutPlan plan =
          plan_layout(recipe, with_settings(overrides, sets), nproc, registry, &cache);
      time_communication(plan, registry);
      LayoutCandidate candidate;
      candidate.sets = sets;
      candidate.described = plan.described;
      candidate.peak_bytes = plan.memory.peak.bytes;
      candidate.step_seconds = plan.memory.step_seconds();
      candidate.communication_bytes = plan.memory.communication_bytes;
      candidate.fits = candidate.peak_bytes <= cap_bytes;
      out.push_back(candidate);
    } catch (const Error&) {
      // A layout this model or mesh cannot take (a model that does not build stages): not a
      // candidate.
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutCandidate& a, const LayoutCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.step_seconds < b.step_seconds : a.peak_bytes < b.peak_bytes;
  });
  // Within the estimate's resolution of the fastest, fewer bytes moved first.
  if (!out.empty() && out.front().fits) {
    const double band = out.front().step_seconds * 1.05;
    const auto tied = std::find_if(out.begin(), out.end(), [&](const LayoutCandidate& c) {
      return !c.fits || c.step_seconds > band;
    });
    std::stable_sort(out.begin(), tied, [](const LayoutCandidate& a, const LayoutCandidate& b) {
      return a.communication_bytes < b.communication_bytes;
    });
  }
  return out;
}

int report_search(const std::vector<LayoutCandidate>& ranked, std::int64_t cap_bytes) {
  if (ranked.empty()) throw Error("plan --fit: no layout of this recipe could be planned");
  const LayoutCandidate& best = ranked.front();
  if (!best.fits) {
    std::cout << "nothing the planner tries fits " << format_mib(cap_bytes)
              << " a rank: the smallest predicted peak is " << format_mib(best.peak_bytes) << " ("
              << best.described << ": " << as_arguments(best.sets) << ")\n";
    return 1;
  }
  std::cout << "fastest layout that fits " << format_mib(cap_bytes)
            << " a rank (predicted): " << best.described << "\n  " << as_arguments(best.sets)
            << "\n  step " << milliseconds(best.step_seconds) << ", peak "
            << format_mib(best.peak_bytes) << "\nrunners-up:\n";
  std::size_t shown = 0;
  for (std::size_t i = 1; i < ranked.size() && shown < 4; ++i, ++shown) {
    const LayoutCandidate& other = ranked[i];
    char slower[64];
    std::snprintf(slower, sizeof slower, "%+.0f%% step time",
                  100.0 * (other.step_seconds / best.step_seconds - 1.0));
    std::cout << "  " << other.described << ": "
              << (other.fits ? std::string(slower)
                             : "does not fit (peak " + format_mib(other.peak_bytes) + ")")
              << "\n    " << as_arguments(other.sets) << "\n";
  }
  const auto not_fitting =
      std::count_if(ranked.begin(), ranked.end(), [](const LayoutCandidate& c) { return !c.fits; });
  std::cout << ranked.size() << " layouts planned, " << not_fitting << " over the cap\n";
  return 0;
}

}  // namespace trainyard
