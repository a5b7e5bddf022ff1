#include "unit_holdings.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainyard {

std::int64_t round_bytes(double bytes) { return static_cast<std::int64_t>(std::llround(bytes)); }

namespace {

// A unit's flat buffer is padded to a multiple of the ranks (float32 elements), and each rank
// keeps its share.
std::int64_t shard_bytes(std::int64_t bytes, std::int64_t ranks) {
  const std::int64_t elements = (bytes / 4 + ranks - 1) / ranks;
  return elements * 4;
}

}  // namespace

// The largest `count` units' bytes, summed (at most two units are gathered at a time).
std::int64_t largest_units(const ModelFootprint& model, std::size_t count) {
  std::vector<std::int64_t> units;
  for (std::size_t i = 1; i < model.blocks.size(); ++i)
    units.push_back(model.blocks[i].parameter_bytes);
  std::sort(units.rbegin(), units.rend());
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < std::min(count, units.size()); ++i) sum += units[i];
  return sum;
}

namespace {

// A step's gather passes over the units: each micro-batch's forward, and again its backward
// when full sharding frees the units between them.
double gather_passes(const PlanLayout& layout) {
  return (layout.sharding == "full" ? 2 : 1) * static_cast<double>(layout.accumulation);
}

}  // namespace

// What a data-parallel step's collectives move per rank: gradients all-reduced (a replica,
// replicated units, and sharded units on the host CPU the plan times, which all-reduce their flat
// gradients in place), with sharded units whole parameters gathered for each micro-batch's forward
// (and again for its backward when freed between them); zero1 also gathers the stepped slices.
std::int64_t data_parallel_traffic(const ModelFootprint& model, const PlanLayout& layout) {
  const double ranks = static_cast<double>(layout.shard_ranks);
  if (layout.holding == ModelHolding::kWhole || ranks <= 1) return 0;
  const double whole = static_cast<double>(model.parameter_bytes);
  const double share = (ranks - 1) / ranks;
  double moved = 2 * share * whole;  // an all-reduce of the gradients
  if (layout.holding == ModelHolding::kReplicated && layout.zero1) moved += share * whole;
  if (layout.holding == ModelHolding::kShardedUnits && layout.sharding != "none") {
    moved += gather_passes(layout) * share * whole;
  }
  return round_bytes(moved);
}

// The collectives of that traffic: an all-reduce per gradient bucket (ddp's 25 MiB) and zero1's
// gather, or per unit a gather for each micro-batch's forward (and backward, under full) and one
// reduction, or a replicated unit's all-reduce.
double data_parallel_calls(const ModelFootprint& model, const PlanLayout& layout) {
  if (layout.holding == ModelHolding::kWhole || layout.shard_ranks <= 1) return 0;
  const auto units = static_cast<double>(model.blocks.size());
  if (layout.holding == ModelHolding::kShardedUnits) {
    if (layout.sharding == "none") return units;
    return units * (gather_passes(layout) + 1);
  }
  constexpr double kBucketBytes = 25.0 * 1024 * 1024;
  return std::ceil(static_cast<double>(model.parameter_bytes) / kBucketBytes) +
         (layout.zero1 ? 1 : 0);
}

std::int64_t data_parallel_reduce_traffic(const ModelFootprint& model, const PlanLayout& layout) {
  const double ranks = static_cast<double>(layout.shard_ranks);
  if (layout.holding != ModelHolding::kReplicated || ranks <= 1) return 0;
  return round_bytes(2 * (ranks - 1) / ranks * static_cast<double>(model.parameter_bytes));
}

double data_parallel_reduce_calls(const ModelFootprint& model, const PlanLayout& layout) {
  if (layout.holding != ModelHolding::kReplicated || layout.shard_ranks <= 1) return 0;
  return data_parallel_calls(model, layout) - (layout.zero1 ? 1 : 0);
}

// Of those, the ones issued before the compute that waits for them: with prefetch, each pass's
// gathers but its first (the next unit's is issued as a unit computes), and the reductions but
// the last (each is waited for only when the backward ends).
double posted_data_parallel_calls(const ModelFootprint& model, const PlanLayout& layout) {
  if (layout.holding != ModelHolding::kShardedUnits || layout.shard_ranks <= 1) return 0;
  const auto units = static_cast<double>(model.blocks.size());
  const double reductions = units - 1;
  if (layout.sharding == "none" || !layout.prefetch) return reductions;
  return gather_passes(layout) * (units - 1) + reductions;
}

bool any_recomputed(const ModelFootprint& model) {
  return std::any_of(model.blocks.begin(), model.blocks.end(),
                     [](const BlockFootprint& block) { return block.recomputed; });
}

Holdings hold(const ModelFootprint& model, const PlanLayout& layout) {
  const std::int64_t whole = model.parameter_bytes;
  const auto state = [&](std::int64_t stepped) {
    return round_bytes(model.optimizer_state_ratio * static_cast<double>(stepped));
  };
  Holdings held;
  if (layout.holding == ModelHolding::kWhole) {
    held.parameters = held.gradients = held.stepped = whole;
    held.gradients_freed_at_start = true;
  } else if (layout.holding == ModelHolding::kReplicated) {
    held.parameters = held.gradients = held.stepped = whole;
    if (layout.zero1) {
      // The optimizer steps a float32 master copy of this rank's slice of the flat parameters,
      // from a flat copy of the gradients, and all-gathers the slices into a flat buffer.
      held.stepped = shard_bytes(whole, layout.shard_ranks);
      held.parameters += held.stepped;
      held.optimizer_buffers = whole + held.stepped + whole;
    }
  } else {
    const std::int64_t ranks = layout.sharding == "none" ? 1 : layout.shard_ranks;
    for (const auto& unit : model.blocks)
      held.parameters += shard_bytes(unit.parameter_bytes, ranks);
    held.gradients = held.stepped = held.parameters;
    if (layout.accumulation > 1 && ranks > 1) held.accumulated_whole = whole;
    const std::int64_t root = model.blocks.empty() ? 0 : model.blocks.front().parameter_bytes;
    held.shard_gradients_made_at_end = layout.sharding != "none";
    if (layout.sharding == "full") {
      // In backward a unit runs gathered beside the one before it, prefetched; a recomputed
      // block's forward in backward prefetches nothing and keeps its unit for the backward.
      const std::int64_t running = largest_units(model, layout.prefetch ? 2 : 1);
      // The root stays gathered through the step; the last unit from its forward into its
      // backward, which comes next, unless the block is recomputed (gathered again then).
      const bool last_kept = model.blocks.size() > 1 && !model.blocks.back().recomputed;
      held.gathered_forward = root + (last_kept ? model.blocks.back().parameter_bytes : 0);
      // In backward a unit also holds its gradients' flat copy (the whole ones: backward_kept).
      held.gathered_backward = root + running + largest_units(model, 1);
    } else if (layout.sharding == "grad_op") {
      // Units stay gathered from their forward to their backward, except recomputed blocks'.
      held.gathered_forward = root;
      for (std::size_t i = 1; i < model.blocks.size(); ++i) {
        if (!model.blocks[i].recomputed) held.gathered_forward += model.blocks[i].parameter_bytes;
      }
      // A recomputed block's unit is gathered again for its backward (with the one before it
      // prefetched), beside the units its forward left gathered.
      const bool recomputing = any_recomputed(model);
      held.gathered_backward = held.gathered_forward +
                               (recomputing ? largest_units(model, layout.prefetch ? 2 : 1) : 0) +
                               largest_units(model, 1);
    } else {
      // Replicated units: gradients are set to none when a step starts and made by the backward
      // as one process makes them, each unit's all-reduced from a flat copy.
      held.gradients_freed_at_start = true;
      held.gathered_backward = largest_units(model, 1);
    }
  }
  held.optimizer_state = state(held.stepped);
  return held;
}

}  // namespace trainyard
