#pragma once
// How a rank holds a model's parameters under a data-parallel strategy (a whole model, a
// replica, or fsdp's sharded units), and what that strategy's collectives move per step: the
// pieces plan_memory composes into a rank's plan and plan_pipeline into a sharded stage's.

#include <cstddef>
#include <cstdint>

#include "memory_plan.hpp"

namespace trainyard {

// What a rank of the layout holds between steps, and what moves during a step.
struct Holdings {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  bool gradients_freed_at_start = false;     // set to none when the step starts
  bool shard_gradients_made_at_end = false;  // sharded: set to none at the start, made at the end
  std::int64_t gathered_forward = 0;         // whole parameters gathered at the forward's end
  std::int64_t gathered_backward = 0;        // ... and at backward's peak, with unit gradients
  std::int64_t stepped = 0;                  // parameter bytes the optimizer steps
  std::int64_t optimizer_buffers = 0;        // flat copies the optimizer step makes (zero1)
  std::int64_t accumulated_whole = 0;        // whole gradients held between micro-batches
};

std::int64_t round_bytes(double bytes);

Holdings hold(const ModelFootprint& model, const PlanLayout& layout);

// The largest `count` units' bytes, summed (at most two units are gathered at a time).
std::int64_t largest_units(const ModelFootprint& model, std::size_t count);

bool any_recomputed(const ModelFootprint& model);

// The bytes a data-parallel step's collectives move per rank, their calls, and of those the
// ones posted ahead of the compute that waits for them.
std::int64_t data_parallel_traffic(const ModelFootprint& model, const PlanLayout& layout);
double data_parallel_calls(const ModelFootprint& model, const PlanLayout& layout);
// Of that traffic and those calls, a replica's gradient all-reduces (ddp's buckets), which the
// plan prices on the communicator's all-reduce path.
std::int64_t data_parallel_reduce_traffic(const ModelFootprint& model, const PlanLayout& layout);
double data_parallel_reduce_calls(const ModelFootprint& model, const PlanLayout& layout);
double posted_data_parallel_calls(const ModelFootprint& model, const PlanLayout& layout);

}  // namespace trainyard
