#pragma once
// How one pipeline stage's parameters are held across the stage's data-parallel ranks, behind one
// interface the pipeline's step drives: replicated, with gradients averaged by the SDK's
// GradientReducer (as ddp), or sharded by the SDK's ShardedUnits (as fsdp: each rank keeps a
// shard of every unit's flat parameters, gathered while the unit runs; with tensor parallelism a
// shard of its tp rank's pieces, and with hybrid sharding replicated across dp_replicate).

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/gradient_reducer.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/parallel/sharded_units.hpp"

namespace c10d {
class Backend;
}
namespace torch::optim {
class Optimizer;
}

namespace trainyard {

class BucketCompressor;

class Optimizer;

class StageParameters {
 public:
  virtual ~StageParameters() = default;

  // The stage's blocks as they must run (sharded: gathering their unit around each call).
  virtual const std::vector<Block>& blocks() const = 0;
  // What the optimizer steps: the parameters, or this rank's shards.
  virtual std::vector<at::Tensor> optimized() const = 0;
  // The gradients of optimized(), those defined.
  std::vector<at::Tensor> gradients() const;

  virtual void zero_gradients() = 0;
  // Around each backward of the stage: whether it synchronises across the data-parallel ranks
  // (the stage's last backward of the step) or accumulates locally.
  virtual void before_backward(bool synchronise) = 0;
  virtual void after_backward() = 0;
  // Before the weight half of a split backward (zero bubble), whose graph was made by a forward
  // long done: sharded parameters are gathered again for it. Then after_backward as usual.
  virtual void before_weight_backward(bool synchronise) { before_backward(synchronise); }
  // After the step's last backward: waits for the gradient reductions in flight.
  virtual void finish() = 0;

  // The whole, synchronised gradient of `parameter` (one of the stage's; zeros when it got
  // none) and its replacement: how tied parameters' gradients are summed across stages.
  // Collective over the data-parallel ranks when sharded.
  virtual at::Tensor whole_gradient(std::size_t parameter) = 0;
  virtual void set_whole_gradient(std::size_t parameter, const at::Tensor& gradient) = 0;
  // The sums of squares of the stage's gradients over the data-parallel ranks, as two elements:
  // those of tensor-parallel pieces (still to be summed over the tp group) and those of whole
  // parameters (every tp rank holds them alike).
  virtual at::Tensor gradient_squares() const = 0;
  // The same per block of the whole model, [2, blocks] (run.grad_norm_blocks).
  virtual at::Tensor block_gradient_squares(const ParameterBlocks& blocks) const = 0;
  // found_inf becomes the maximum over the data-parallel ranks when they hold other gradients.
  virtual void combine_found_inf(at::Tensor& found_inf) const = 0;

  // How each tensor of optimized() maps onto the whole model's parameters, `whole_names[i]`
  // naming parameter i (a tied copy by the tied parameter's name) where the stage holds
  // parameters whole.
  virtual std::vector<HeldLayout> layouts(const std::vector<std::string>& whole_names) const = 0;
  // Every parameter whole, by index. Collective when sharded.
  virtual std::vector<at::Tensor> whole_parameters() const = 0;
  // Frees gathered parameters (after evaluation or loading).
  virtual void release() = 0;
  // The compressor of the stage's gradient buckets, whose state checkpoints hold (null without).
  virtual BucketCompressor* compressor() const { return nullptr; }
  // The bytes plain all-reduces of the stage's gradient buckets carry per step (0: none).
  virtual std::int64_t gradient_bytes() const { return 0; }
  // `optimizer` (null: count no optimizer state) was made by `plugin`.
  virtual HeldBytes held_bytes(const torch::optim::Optimizer* optimizer,
                               const Optimizer& plugin) const = 0;
};

// Parameters replicated across the data-parallel ranks, held as `layouts` say (whole, or the
// model's tensor-parallel shards); `group` null: one data-parallel rank, gradients only
// accumulate.
std::unique_ptr<StageParameters> replicated_stage_parameters(
    std::vector<at::Tensor> parameters, std::vector<std::string> names, std::vector<Block> blocks,
    std::vector<HeldLayout> layouts, const c10::intrusive_ptr<c10d::Backend>& group,
    const GradientReducerOptions& options);

// Parameters sharded over `shard_group` (null: one rank) in units along `blocks`, held as
// `layouts` say (whole, or this tp rank's pieces, which the units flatten); with a
// `replicate_group` (hybrid sharding) each synchronised backward then averages the shards'
// gradients over it.
std::unique_ptr<StageParameters> sharded_stage_parameters(
    std::vector<at::Tensor> parameters, std::vector<std::string> names,
    const std::vector<Block>& blocks, std::vector<HeldLayout> layouts,
    const c10::intrusive_ptr<c10d::Backend>& shard_group,
    const c10::intrusive_ptr<c10d::Backend>& replicate_group, const ShardedUnitsOptions& options);

// The refusal of frozen parameter `name` (a base under adapters) where dp_sharding shards a
// stage's parameters: units shard what trains.
std::string frozen_under_sharding(const std::string& name);

}  // namespace trainyard
