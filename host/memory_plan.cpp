#include "memory_plan.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "trainyard/parallel/pipeline_stages.hpp"

namespace trainyard {

namespace {

std::int64_t round_bytes(double bytes) { return static_cast<std::int64_t>(std::llround(bytes)); }

// A unit's flat buffer is padded to a multiple of the ranks (float32 elements), and each rank
// keeps its share.
std::int64_t shard_bytes(std::int64_t bytes, std::int64_t ranks) {
  const std::int64_t elements = (bytes / 4 + ranks - 1) / ranks;
  return elements * 4;
}

// What a rank of the layout holds between steps, and what moves during a step.
struct Holdings {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  bool gradients_freed_at_start = false;  // set to none when the step starts
  bool shard_gradients_made_at_end = false;  // sharded: set to none at the start, made at the end
  std::int64_t gathered_forward = 0;      // whole parameters gathered at the forward's end
  std::int64_t gathered_backward = 0;     // ... and at backward's peak, with unit gradients
  std::int64_t stepped = 0;               // parameter bytes the optimizer steps
  std::int64_t optimizer_buffers = 0;     // flat copies the optimizer step makes (zero1)
  std::int64_t accumulated_whole = 0;     // whole gradients held between micro-batches
};

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

// A step's gather passes over the units: each micro-batch's forward, and again its backward
// when full sharding frees the units between them.
double gather_passes(const PlanLayout& layout) {
  return (layout.sharding == "full" ? 2 : 1) * static_cast<double>(layout.accumulation);
}

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

}  // namespace

PlannedMemory plan_memory(const ModelFootprint& model, const PlanLayout& layout) {
  const Holdings held = hold(model, layout);
  PlannedMemory plan;
  plan.parameters = held.parameters;
  plan.gradients = held.gradients;
  plan.optimizer_state = held.optimizer_state;
  plan.frozen = model.frozen_bytes;
  const std::int64_t samples = layout.micro_batch;
  plan.activations = round_bytes(model.activations.at(samples));
  plan.gathered_forward = held.gathered_forward;
  plan.forward_held = plan.activations + plan.gathered_forward;
  const std::int64_t batch = round_bytes(model.batch.at(samples));
  const std::int64_t kept = plan.parameters + plan.optimizer_state + plan.frozen;
  plan.step_start = kept + plan.gradients;
  // The first micro-batch of a step, and (with accumulation) the later ones, which find the
  // gradients made and, for sharded units, the whole gradients accumulating locally (no_sync).
  const auto forward_backward = [&](bool later) {
    const bool fresh = held.gradients_freed_at_start && !later;
    const std::int64_t in_step =
        (fresh || held.shard_gradients_made_at_end ? kept : plan.step_start) +
        (later ? held.accumulated_whole : 0);
    const std::int64_t forward = in_step + batch + held.gathered_forward + plan.activations;
    const std::int64_t forward_peak = forward + round_bytes(model.forward_transient.at(samples));
    const double extra = fresh ? model.backward_fresh.at(samples) : model.backward_kept.at(samples);
    return std::pair{forward_peak,
                     forward - held.gathered_forward + held.gathered_backward + round_bytes(extra)};
  };
  auto [forward, backward] = forward_backward(false);
  if (layout.accumulation > 1) {
    const auto [later_forward, later_backward] = forward_backward(true);
    forward = std::max(forward, later_forward);
    backward = std::max(backward, later_backward);
  }
  const std::int64_t optimizer =
      plan.step_start + batch +
      round_bytes(model.optimizer_step_ratio * static_cast<double>(held.stepped)) +
      held.optimizer_buffers;
  plan.phases = {{"h2d", plan.step_start + batch},
                 {"forward", forward},
                 {"backward", backward},
                 {"optimizer", optimizer}};
  plan.compute_seconds = layout.core_sharing * static_cast<double>(layout.accumulation) *
                         (model.forward_seconds.at(samples) + model.backward_seconds.at(samples));
  plan.optimizer_seconds =
      layout.core_sharing * model.optimizer_seconds_per_byte * static_cast<double>(held.stepped);
  plan.communication_bytes =
      data_parallel_traffic(model, layout) + round_bytes(static_cast<double>(layout.accumulation) *
                                                         model.tensor_parallel_bytes.at(samples));
  plan.communication_calls = data_parallel_calls(model, layout) +
                             static_cast<double>(layout.accumulation) * model.tensor_parallel_calls;
  plan.posted_calls = posted_data_parallel_calls(model, layout);
  plan.peak =
      *std::max_element(plan.phases.begin(), plan.phases.end(),
                        [](const PhasePeak& a, const PhasePeak& b) { return a.bytes < b.bytes; });
  return plan;
}

namespace {

struct StageFigures {
  std::int64_t activations = 0;   // its blocks' kept bytes for one micro-batch
  std::int64_t input = 0;         // the received input a later stage keeps for backward
  std::int64_t split_kept = 0;    // kept from a split backward's input half to its weight half
  std::int64_t split_freed = 0;   // of `activations`, freed by a split backward's input half
  std::int64_t communicated = 0;  // its input's bytes (0 for the first stage), handed or received

  std::int64_t total() const { return activations + input + split_kept; }
};

// The cut the pipeline makes: the recipe's named stages, or balanced by the blocks' costs.
std::vector<BlockRange> stage_cut(const ModelFootprint& model, const PlanLayout& layout) {
  std::vector<std::string> names;
  std::vector<double> costs;
  for (std::size_t i = 1; i < model.blocks.size(); ++i) {
    names.push_back(model.blocks[i].name);
    costs.push_back(model.blocks[i].cost);
  }
  const int stages = layout.schedule.shape.stages();
  return layout.stage_names.empty() ? balanced_stages(costs, stages)
                                    : named_stages(layout.stage_names, names, stages);
}

// Whether stages `s` and `peer` sit on different ranks (their hand-over is a transfer).
bool on_other_ranks(const PipelineShape& shape, std::size_t s, std::size_t peer) {
  return shape.rank_of_stage(static_cast<int>(s)) != shape.rank_of_stage(static_cast<int>(peer));
}

std::int64_t range_end(const BlockRange& range, const ModelFootprint& model) {
  return range.end < 0 ? static_cast<std::int64_t>(model.blocks.size()) - 1 : range.end;
}

// What `rank`'s schedule holds in flight when it holds the most: a forward keeps its stage's
// activations, and the input it received, until the stage's backward (or, split, its weight
// half) for that micro-batch; a split backward's input half keeps its branch gradients until
// the weight half.
struct InFlight {
  StageFigures most;
  // The most the forwards since the rank's last backward action keep: what the allocator's
  // forward generation measures (MemoryMeter).
  std::int64_t forward_held = 0;
  // The most held at the end of a forward before the rank's first backward (gradients set to
  // none at a step's start are not made yet), and after it.
  std::int64_t forward_before_gradients = 0;
  std::int64_t forward_after_gradients = 0;
};

// The bytes of a receive's buffer: the input of the stage's forward, or its output's gradient.
std::int64_t receive_bytes(const PipelineAction& receive, const std::vector<StageFigures>& stages) {
  if (receive.kind == PipelineActionKind::kReceiveActivation) {
    return stages[static_cast<std::size_t>(receive.stage)].input;
  }
  return stages[static_cast<std::size_t>(receive.stage + 1)].communicated;
}

// The bytes of the receives a rank allocates just before its action `index`: those posted
// ahead of the compute action there (receives_to_post_before), or, before the rank's first
// compute action, a receive where it stands.
std::int64_t posted_before(const std::vector<PipelineAction>& actions, std::size_t index,
                           bool computed_yet, const std::vector<StageFigures>& stages) {
  const PipelineActionKind kind = actions[index].kind;
  const bool receive = kind == PipelineActionKind::kReceiveActivation ||
                       kind == PipelineActionKind::kReceiveGradient;
  if (receive) return computed_yet ? 0 : receive_bytes(actions[index], stages);
  std::int64_t bytes = 0;
  for (std::size_t ahead : receives_to_post_before(actions, index)) {
    bytes += receive_bytes(actions[ahead], stages);
  }
  return bytes;
}

InFlight most_in_flight(const PipelineSchedule& schedule, int rank,
                        const std::vector<StageFigures>& stages) {
  StageFigures held;
  InFlight result;
  std::int64_t since_backward = 0;
  bool gradients_made = false;
  bool computed_yet = false;
  const auto& actions = schedule.rank_actions[static_cast<std::size_t>(rank)];
  for (std::size_t index = 0; index < actions.size(); ++index) {
    const PipelineAction& action = actions[index];
    const StageFigures& stage = stages[static_cast<std::size_t>(action.stage)];
    // A receive's buffer is allocated when it is posted: in the forward window it is posted in
    // (a backward starts a new one, so what was posted before a backward is not counted after
    // it), including a forward's own input when it was posted before the compute ahead of it.
    const std::int64_t posted = posted_before(actions, index, computed_yet, stages);
    if (!is_compute(action.kind)) {
      since_backward += posted;
    } else if (action.kind == PipelineActionKind::kForward) {
      since_backward += posted + stage.activations;
      result.forward_held = std::max(result.forward_held, since_backward);
    } else {
      since_backward = 0;
    }
    computed_yet = computed_yet || is_compute(action.kind);
    switch (action.kind) {
      case PipelineActionKind::kForward:
        held.activations += stage.activations;
        held.input += stage.input;
        break;
      case PipelineActionKind::kBackwardInput:
        held.split_kept += stage.split_kept;
        held.activations -= stage.split_freed;
        break;
      case PipelineActionKind::kBackwardWeight:
        held.split_kept -= stage.split_kept;
        held.activations -= stage.activations - stage.split_freed;
        held.input -= stage.input;
        break;
      case PipelineActionKind::kBackward:
        held.activations -= stage.activations;
        held.input -= stage.input;
        break;
      default:
        break;
    }
    if (action.kind == PipelineActionKind::kForward) {
      std::int64_t& most =
          gradients_made ? result.forward_after_gradients : result.forward_before_gradients;
      most = std::max(most, held.total());
    }
    gradients_made = gradients_made || action.kind == PipelineActionKind::kBackward ||
                     action.kind == PipelineActionKind::kBackwardWeight;
    if (held.total() > result.most.total()) result.most = held;
  }
  return result;
}

// The schedule's makespan with each forward and backward costing the slowest stage's: the
// probe's timed forward and backward of a micro-batch, in the share of the forward its blocks
// took (a split backward's halves half each).
double pipeline_compute_seconds(const ModelFootprint& model, const PlanLayout& layout,
                                const std::vector<BlockRange>& cut) {
  double slowest = 0;
  for (const BlockRange& range : cut) {
    double share = 0;
    for (std::int64_t b = range.begin; b < range_end(range, model); ++b) {
      share += model.blocks[static_cast<std::size_t>(b + 1)].forward_share;
    }
    slowest = std::max(slowest, share);
  }
  constexpr double kUnit = 1e-4;  // the simulation's time unit, seconds
  const auto units = [&](double seconds) {
    return std::max(1, static_cast<int>(std::lround(seconds / kUnit)));
  };
  const double forward = model.forward_seconds.at(layout.micro_batch) * slowest;
  const double backward = model.backward_seconds.at(layout.micro_batch) * slowest;
  PipelineCosts costs;
  costs.forward = units(forward);
  costs.backward = units(backward);
  costs.backward_input = units(backward / 2);
  costs.backward_weight = units(backward / 2);
  return static_cast<double>(simulate_schedule(layout.schedule, costs).makespan) * kUnit *
         static_cast<double>(layout.accumulation);
}

// A pipeline rank's backward transient: one block's backward at a time, its own peak (the
// gradient arriving for its output included) less the activations the blocks after it in the
// stage have already freed for that micro-batch; the most of any block of any of its stages.
double backward_transient(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                          const PipelineShape& shape, int rank, std::int64_t samples) {
  double transient = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (shape.rank_of_stage(static_cast<int>(s)) != rank) continue;
    double freed = 0;
    for (std::int64_t b = range_end(cut[s], model) - 1; b >= cut[s].begin; --b) {
      const BlockFootprint& block = model.blocks[static_cast<std::size_t>(b + 1)];
      transient = std::max(transient, block.backward_peak.at(samples) - freed);
      freed += block.activations.at(samples);
    }
  }
  return transient;
}

// A pipeline rank's forward transient: the most any block of its stages holds within its
// forward above what it keeps (the last stage's loss included).
std::int64_t forward_transient(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                               const PipelineShape& shape, int rank, std::int64_t samples) {
  double transient = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (shape.rank_of_stage(static_cast<int>(s)) != rank) continue;
    for (std::int64_t b = cut[s].begin; b < range_end(cut[s], model); ++b) {
      transient = std::max(
          transient, model.blocks[static_cast<std::size_t>(b + 1)].forward_transient.at(samples));
    }
  }
  return round_bytes(transient);
}

// What `rank` of a pipeline holds of the model, as a footprint of its own: its stages' blocks
// in order, each stage with its own copy of a tied parameter, which belongs to the one block of
// the stage that uses it (its unit) or, used by several, to the root (as ShardedUnits cuts a
// stage built alone).
ModelFootprint rank_footprint(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                              const PipelineShape& shape, int rank) {
  ModelFootprint own = model;
  own.blocks = {model.blocks.front()};
  own.blocks.front().parameter_bytes = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (shape.rank_of_stage(static_cast<int>(s)) != rank) continue;
    std::map<std::size_t, std::vector<std::size_t>> users;  // shared index -> own.blocks'
    for (std::int64_t b = cut[s].begin; b < range_end(cut[s], model); ++b) {
      const BlockFootprint& block = model.blocks[static_cast<std::size_t>(b + 1)];
      for (std::size_t index : block.shared) users[index].push_back(own.blocks.size());
      own.blocks.push_back(block);
    }
    for (const auto& [index, blocks] : users) {
      const std::size_t holder = blocks.size() == 1 ? blocks.front() : 0;
      own.blocks[holder].parameter_bytes += model.shared_parameter_bytes[index];
    }
  }
  own.parameter_bytes = 0;
  for (const auto& block : own.blocks) own.parameter_bytes += block.parameter_bytes;
  return own;
}

// How a pipeline rank holds its stages' parameters: replicated (gradients set to none when a
// step starts, unless replicated over data-parallel ranks into flat buckets), or sharded over
// the stage's data-parallel ranks as fsdp's units are (dp_sharding), whole gradients accumulated
// locally from the step's first backward until its last.
Holdings stage_holdings(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                        const PlanLayout& layout, int rank) {
  const ModelFootprint own = rank_footprint(model, cut, layout.schedule.shape, rank);
  if (layout.sharding == "none") {
    Holdings held;
    held.parameters = held.gradients = held.stepped = own.parameter_bytes;
    held.gradients_freed_at_start = !layout.replicated_stages;
    held.optimizer_state =
        round_bytes(model.optimizer_state_ratio * static_cast<double>(own.parameter_bytes));
    return held;
  }
  PlanLayout units = layout;
  units.holding = ModelHolding::kShardedUnits;
  units.accumulation = layout.accumulation * layout.schedule.shape.micro_batches;
  Holdings held = hold(own, units);
  // A unit's backward adds to the whole gradients accumulating in place (accumulated_whole),
  // and only the step's last backward, with one micro-batch left in flight, copies them to be
  // reduced: the peak holds the gathered units alone.
  held.gathered_backward -= largest_units(own, 1);
  return held;
}

// One pipeline rank's memory: what its stages hold (stage_holdings), the micro-batches its
// schedule holds in flight at most, and each phase's peak.
PlannedMemory plan_pipeline_rank(const ModelFootprint& model, const PlanLayout& layout,
                                 const std::vector<BlockRange>& cut,
                                 const std::vector<StageFigures>& stages, int rank) {
  const PipelineShape& shape = layout.schedule.shape;
  const std::int64_t samples = layout.micro_batch;
  const Holdings held = stage_holdings(model, cut, layout, rank);
  PlannedMemory plan;
  plan.parameters = held.parameters;
  plan.gradients = held.gradients;
  plan.optimizer_state = held.optimizer_state;
  const InFlight flight = most_in_flight(layout.schedule, rank, stages);
  const StageFigures& in_flight = flight.most;
  plan.activations = in_flight.activations;
  plan.received = in_flight.input;
  plan.gathered_forward = held.gathered_forward;
  plan.forward_held = flight.forward_held + held.gathered_forward;
  plan.step_start = plan.parameters + plan.gradients + plan.optimizer_state;
  const std::int64_t batch = round_bytes(model.batch.at(layout.batch_samples));
  const bool fresh = held.gradients_freed_at_start;
  const std::int64_t in_step = fresh ? plan.step_start - plan.gradients : plan.step_start;
  // From the rank's first backward on, its gradients are made (set to none at the start), or
  // its sharded stages' whole gradients accumulate locally until the step's last backward.
  const std::int64_t made = fresh ? plan.gradients : held.accumulated_whole;
  const std::int64_t forward = in_step + made + batch + plan.activations + plan.received;
  const std::int64_t forward_peak = batch + held.gathered_forward +
                                    forward_transient(model, cut, shape, rank, samples) +
                                    std::max(in_step + flight.forward_before_gradients,
                                             in_step + made + flight.forward_after_gradients);
  // The backward's transient: its blocks' own (backward_transient), with the whole parameters
  // and unit gradients sharded stages gather for it; gradients made by the first backward are
  // counted in `forward`, while the schedule holds the most in flight.
  const double extra = backward_transient(model, cut, shape, rank, samples) +
                       static_cast<double>(held.gathered_backward);
  const std::int64_t optimizer =
      plan.step_start + batch +
      round_bytes(model.optimizer_step_ratio * static_cast<double>(held.stepped)) +
      held.optimizer_buffers;
  // A split backward's kept gradients are held in the backward phase, beside its transient.
  const std::int64_t backward = forward + in_flight.split_kept + round_bytes(extra);
  plan.phases = {{"h2d", plan.step_start + batch},
                 {"forward", forward_peak},
                 {"backward", backward},
                 {"optimizer", optimizer}};
  plan.peak =
      *std::max_element(plan.phases.begin(), plan.phases.end(),
                        [](const PhasePeak& a, const PhasePeak& b) { return a.bytes < b.bytes; });
  plan.optimizer_seconds =
      layout.core_sharing * model.optimizer_seconds_per_byte * static_cast<double>(held.stepped);
  return plan;
}

// What a pipeline rank moves per step, and in how many calls: each micro-batch's input received
// and its gradient sent back on every stage but the first, its output sent and the output's
// gradient received on every stage but the last (between ranks); with tensor parallelism, each
// micro-batch's collectives of the rank's blocks (their share of the model's forward time); and
// the stages' data-parallel reduction (or, sharded, their gathers and reductions).
void count_pipeline_traffic(const ModelFootprint& model, const PlanLayout& layout,
                            const std::vector<BlockRange>& cut,
                            const std::vector<StageFigures>& stages, int rank,
                            PlannedMemory& plan) {
  const PipelineShape& shape = layout.schedule.shape;
  std::int64_t handed = 0;
  double transfers = 0;
  double share = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (shape.rank_of_stage(static_cast<int>(s)) != rank) continue;
    if (s > 0 && on_other_ranks(shape, s, s - 1)) {
      handed += 2 * stages[s].communicated;
      transfers += 2;
    }
    if (s + 1 < cut.size() && on_other_ranks(shape, s, s + 1)) {
      handed += 2 * stages[s + 1].communicated;
      transfers += 2;
    }
    for (std::int64_t b = cut[s].begin; b < range_end(cut[s], model); ++b)
      share += model.blocks[static_cast<std::size_t>(b + 1)].forward_share;
  }
  const auto micro_batches =
      static_cast<double>(shape.micro_batches) * static_cast<double>(layout.accumulation);
  PlanLayout data = layout;
  data.holding =
      layout.sharding == "none" ? ModelHolding::kReplicated : ModelHolding::kShardedUnits;
  data.accumulation = static_cast<std::int64_t>(micro_batches);
  if (!layout.replicated_stages && layout.sharding == "none") data.shard_ranks = 1;
  const ModelFootprint own = rank_footprint(model, cut, shape, rank);
  const double samples = static_cast<double>(layout.micro_batch);
  plan.communication_bytes =
      round_bytes(micro_batches *
                  (static_cast<double>(handed) +
                   share * model.tensor_parallel_bytes.at(static_cast<std::int64_t>(samples)))) +
      data_parallel_traffic(own, data);
  plan.communication_calls = micro_batches * (transfers + share * model.tensor_parallel_calls) +
                             data_parallel_calls(own, data);
  plan.posted_calls = micro_batches * transfers + posted_data_parallel_calls(own, data);
}

}  // namespace

std::vector<PlannedMemory> plan_pipeline(const ModelFootprint& model, const PlanLayout& layout) {
  const std::vector<BlockRange> cut = stage_cut(model, layout);
  const std::int64_t samples = layout.micro_batch;
  std::vector<StageFigures> stages(cut.size());
  const PipelineShape& shape = layout.schedule.shape;
  // A stage's input comes from another rank (a buffer received) or from this rank's previous
  // stage (handed over: the same tensor, nothing more held).
  for (std::size_t s = 0; s < cut.size(); ++s) {
    for (std::int64_t b = cut[s].begin; b < range_end(cut[s], model); ++b) {
      const BlockFootprint& block = model.blocks[static_cast<std::size_t>(b + 1)];
      stages[s].activations += round_bytes(block.activations.at(samples));
      // The first stage's input (the batch) takes no gradient: its input half has nothing to
      // run, and its weight half is the whole backward.
      if (cut[s].begin > 0) {
        stages[s].split_kept += round_bytes(block.split_kept.at(samples));
        stages[s].split_freed += round_bytes(block.split_freed.at(samples));
      }
    }
    stages[s].communicated =
        cut[s].begin > 0
            ? round_bytes(model.blocks[static_cast<std::size_t>(cut[s].begin)].output.at(samples))
            : 0;
    if (s > 0 && on_other_ranks(shape, s, s - 1)) stages[s].input = stages[s].communicated;
  }
  const double compute_seconds = pipeline_compute_seconds(model, layout, cut);
  std::vector<PlannedMemory> plans;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    PlannedMemory plan = plan_pipeline_rank(model, layout, cut, stages, rank);
    plan.compute_seconds = layout.core_sharing * compute_seconds;
    count_pipeline_traffic(model, layout, cut, stages, rank, plan);
    plans.push_back(plan);
  }
  return plans;
}

}  // namespace trainyard
