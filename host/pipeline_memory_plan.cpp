// plan_pipeline (memory_plan.hpp): what each pipeline rank holds, from its stages' blocks, the
// micro-batches its schedule keeps in flight and, for sharded stages, their units
// (unit_holdings.hpp).

#include <algorithm>
#include <map>
#include <vector>

#include "memory_plan.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"
#include "unit_holdings.hpp"

namespace trainyard {

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

constexpr double kUnit = 1e-4;  // the simulation's time unit, seconds

int simulated_units(double seconds) {
  return std::max(1, static_cast<int>(std::lround(seconds / kUnit)));
}

// Each forward and backward costing the slowest stage's, in the simulation's units: the probe's
// timed forward and backward of a micro-batch, in the share of the forward its blocks took (a
// split backward's halves half each).
PipelineCosts pipeline_costs(const ModelFootprint& model, const PlanLayout& layout,
                             const std::vector<BlockRange>& cut) {
  double slowest = 0;
  for (const BlockRange& range : cut) {
    double share = 0;
    for (std::int64_t b = range.begin; b < range_end(range, model); ++b) {
      share += model.blocks[static_cast<std::size_t>(b + 1)].forward_share;
    }
    slowest = std::max(slowest, share);
  }
  const double forward = model.forward_seconds.at(layout.micro_batch) * slowest;
  const double backward = model.backward_seconds.at(layout.micro_batch) * slowest;
  PipelineCosts costs;
  costs.forward = simulated_units(forward);
  costs.backward = simulated_units(backward);
  costs.backward_input = simulated_units(backward / 2);
  costs.backward_weight = simulated_units(backward / 2);
  return costs;
}

// The schedule's makespan at `costs`, for every micro-batch of the step (each accumulated batch
// runs the schedule once).
double schedule_seconds(const PlanLayout& layout, const PipelineCosts& costs, int transfer) {
  return static_cast<double>(simulate_schedule(layout.schedule, costs, transfer).makespan) * kUnit *
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

// What stages `wanted` of a pipeline hold of the model, as a footprint of their own: their blocks
// in order, each stage with its own copy of a tied parameter, which belongs to the one block of
// the stage that uses it (its unit) or, used by several, to the root (as ShardedUnits cuts a
// stage built alone).
template <typename Wanted>
ModelFootprint stages_footprint(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                                Wanted wanted) {
  ModelFootprint own = model;
  own.blocks = {model.blocks.front()};
  own.blocks.front().parameter_bytes = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (!wanted(s)) continue;
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

// What `rank` of a pipeline holds of the model: its stages' footprint.
ModelFootprint rank_footprint(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                              const PipelineShape& shape, int rank) {
  return stages_footprint(
      model, cut, [&](std::size_t s) { return shape.rank_of_stage(static_cast<int>(s)) == rank; });
}

// How a pipeline rank holds its stages' parameters: replicated (gradients set to none when a
// step starts, unless replicated over data-parallel ranks into flat buckets), or sharded over
// the stage's data-parallel ranks as fsdp's units are (dp_sharding), each stage its own units,
// shards' gradients set to none when a step starts and whole gradients accumulated locally from
// the step's first backward until its last.
Holdings stage_holdings(const ModelFootprint& model, const std::vector<BlockRange>& cut,
                        const PlanLayout& layout, int rank) {
  const PipelineShape& shape = layout.schedule.shape;
  const ModelFootprint own = rank_footprint(model, cut, shape, rank);
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
  units.accumulation = layout.accumulation * shape.micro_batches;
  Holdings held = hold(own, units);
  // One stage's backward runs at a time, beside what every stage's forwards left gathered.
  std::int64_t gathered_forward = 0;
  std::int64_t backward_extra = 0;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    if (shape.rank_of_stage(static_cast<int>(s)) != rank) continue;
    const ModelFootprint stage =
        stages_footprint(model, cut, [&](std::size_t t) { return t == s; });
    Holdings alone = hold(stage, units);
    // A unit's backward adds to the whole gradients accumulating in place (accumulated_whole):
    // no flat copy of them is made until the step's last backward, with one micro-batch left in
    // flight. A unit gathered in backward (fully sharded, or recomputed) is all-gathered on the
    // host through a whole-unit copy the communicator holds while the backward computes.
    const bool gathers_in_backward = layout.sharding == "full" || any_recomputed(stage);
    if (!gathers_in_backward) alone.gathered_backward -= largest_units(stage, 1);
    gathered_forward += alone.gathered_forward;
    backward_extra = std::max(backward_extra, alone.gathered_backward - alone.gathered_forward);
  }
  held.gathered_forward = gathered_forward;
  held.gathered_backward = gathered_forward + backward_extra;
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
  const std::int64_t in_step = fresh || held.shard_gradients_made_at_end
                                   ? plan.step_start - plan.gradients
                                   : plan.step_start;
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
      plan.message_bytes = std::max(plan.message_bytes, stages[s].communicated);
    }
    if (s + 1 < cut.size() && on_other_ranks(shape, s, s + 1)) {
      handed += 2 * stages[s + 1].communicated;
      transfers += 2;
      plan.message_bytes = std::max(plan.message_bytes, stages[s + 1].communicated);
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
  plan.transfer_bytes = round_bytes(micro_batches * static_cast<double>(handed));
  // The gradients' norm is summed over the pipeline's ranks in one all-reduce a step, which
  // waits for the rank that finishes its schedule last.
  const double norm_calls = shape.ranks > 1 ? 1 : 0;
  plan.communication_calls = micro_batches * (transfers + share * model.tensor_parallel_calls) +
                             data_parallel_calls(own, data) + norm_calls;
  plan.posted_calls = micro_batches * transfers + posted_data_parallel_calls(own, data);
  plan.reduce_bytes =
      round_bytes(micro_batches * share *
                  model.tensor_parallel_bytes.at(static_cast<std::int64_t>(samples))) +
      data_parallel_reduce_traffic(own, data);
  plan.reduce_calls = micro_batches * share * model.tensor_parallel_calls +
                      data_parallel_reduce_calls(own, data) + norm_calls;
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
  const PipelineCosts costs = pipeline_costs(model, layout, cut);
  const double compute_seconds = schedule_seconds(layout, costs, 0);
  std::vector<PlannedMemory> plans;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    PlannedMemory plan = plan_pipeline_rank(model, layout, cut, stages, rank);
    plan.compute_seconds = layout.core_sharing * compute_seconds;
    plan.schedule_costs = costs;
    count_pipeline_traffic(model, layout, cut, stages, rank, plan);
    plans.push_back(plan);
  }
  return plans;
}

double pipeline_transfer_seconds(const PlanLayout& layout, const PlannedMemory& rank,
                                 double message_seconds) {
  if (!rank.schedule_costs) return 0;
  const int transfer = static_cast<int>(std::lround(message_seconds / kUnit));
  // The schedule without transfers is the rank's compute time (plan_pipeline).
  return layout.core_sharing * schedule_seconds(layout, *rank.schedule_costs, transfer) -
         rank.compute_seconds;
}

}  // namespace trainyard
