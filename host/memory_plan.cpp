#include "memory_plan.hpp"

#include <algorithm>
#include <utility>

#include "unit_holdings.hpp"

namespace trainyard {

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
  plan.reduce_bytes = data_parallel_reduce_traffic(model, layout) +
                      round_bytes(static_cast<double>(layout.accumulation) *
                                  model.tensor_parallel_bytes.at(samples));
  plan.reduce_calls = data_parallel_reduce_calls(model, layout) +
                      static_cast<double>(layout.accumulation) * model.tensor_parallel_calls;
  plan.peak =
      *std::max_element(plan.phases.begin(), plan.phases.end(),
                        [](const PhasePeak& a, const PhasePeak& b) { return a.bytes < b.bytes; });
  return plan;
}

}  // namespace trainyard
