#pragma once
// The measured half of a plan: the recipe's model, optimizer and precision run on the host CPU at
// the layout's micro-batch and at half of it, under the allocation tracker, and then timed. What
// the step holds per sample and what it holds regardless (the parameters, their gradients, the
// optimizer's state per parameter byte, each block's activations and hand-over and what a split
// backward of it keeps and frees between its halves, the transients of backward and of the
// optimizer step) and how long its forward, backward and optimizer step
// take are what every layout's plan is composed from (memory_plan.hpp), so a third party's model
// or optimizer is planned as a bundled one is, with no code of its own. It needs the model to
// fit the host's memory for one micro-batch: LibTorch's C++ build lacks the meta-device kernels
// (convolution, batch norm, index_select, where) a shape-only dry run would need.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/api/registry.hpp"

namespace trainyard {

// A figure that grows with the micro-batch: fixed + per_sample * samples.
struct PerSample {
  double fixed = 0;
  double per_sample = 0;
  double at(std::int64_t samples) const {
    return fixed + per_sample * static_cast<double>(samples);
  }
};

struct BlockFootprint {
  std::string name;                  // the block's, or "root" for parameters no single block owns
  std::int64_t parameter_bytes = 0;  // of the parameters it alone uses
  bool recomputed = false;           // under run.activation_checkpointing
  std::vector<std::size_t> shared;   // the shared parameters it uses (ModelFootprint's indices)
  PerSample activations;             // what its forward keeps for backward (the root: none)
  PerSample output;                  // what it hands to the next block (a stage's send)
  PerSample forward_transient;       // its forward's peak above its end (the last: the loss's)
  // A split backward's input half, with the block's input needing a gradient: what it keeps
  // until the weight half (the gradients at its branch points), and how much of the forward's
  // activations it frees (those only the input gradients needed).
  PerSample split_kept;
  PerSample split_freed;
  // A plain backward of the block alone (gradients already made): its peak above where it
  // started, with the gradient of its output that arrives (what the next block hands back).
  PerSample backward_peak;
  double cost = 0;  // what a pipeline balances stages by: its FLOPs, or its parameter count
  double forward_share = 0;  // of the whole forward's time
};

struct ModelFootprint {
  std::int64_t parameter_bytes = 0;    // trainable parameters
  std::int64_t frozen_bytes = 0;       // parameters that take no gradient, and buffers
  std::vector<BlockFootprint> blocks;  // the root first, then the model's blocks in order
  // Parameters several blocks use (a tied embedding and head): a pipeline stage holding any of
  // those blocks holds its own copy.
  std::vector<std::int64_t> shared_parameter_bytes;
  // The optimizer's state bytes per trainable parameter byte, after its first step.
  double optimizer_state_ratio = 0;
  // The optimizer step's transient peak above what it starts with, per trainable parameter byte.
  double optimizer_step_ratio = 0;
  PerSample batch;        // the micro-batch itself
  PerSample activations;  // held from the end of the forward (loss included) for backward
  // The forward's peak above its end: what a layer or the loss allocates and frees within it
  // (a vocabulary-parallel loss's temporaries, a collective's buffers).
  PerSample forward_transient;
  // The backward's peak above the forward's end: with the gradients already made (accumulated in
  // place, as flat buckets do), and with the backward making them (gradients set to none).
  PerSample backward_kept;
  PerSample backward_fresh;
  // Seconds of a micro-batch's forward and backward, and of the optimizer step per trainable
  // parameter byte, on the intra-op threads the probe ran with.
  PerSample forward_seconds;
  PerSample backward_seconds;
  double optimizer_seconds_per_byte = 0;
  // Bytes a micro-batch's forward and backward move over the tensor-parallel group, per rank
  // (none without one).
  PerSample tensor_parallel_bytes;
  double tensor_parallel_calls = 0;  // the collectives that takes
};

// Runs the probe (see the top of the file) on the recipe at `recipe` with `overrides`
// (section.key=value) for micro-batches of `micro_batch` samples, timed on `threads` intra-op
// threads (what each rank of the layout gets), with the model built as a rank of a
// tensor-parallel group of `tp` builds it (lone_tensor_parallel_rank.hpp): every figure is then
// that rank's. Its strategy and [parallel] sizes are otherwise ignored (the probe is one
// process); its precision (autocast) and run.activation_checkpointing are applied.
ModelFootprint probe_model(const std::filesystem::path& recipe,
                           const std::vector<std::string>& overrides, std::int64_t micro_batch,
                           int threads, int tp, const Registry& registry);

}  // namespace trainyard
