#pragma once
// Fully sharded parameters over one c10d group (PyTorch's FSDP FlatParameter, ZeRO-3): a
// model's parameters are cut into units along its blocks, each unit's parameters flattened into
// one buffer padded to a multiple of the group's size, and each rank keeps only its contiguous
// shard of it, which is what the optimizer steps. A unit's parameters exist in full only while
// it runs: all-gathered just before its block's forward (the next unit's gather already in
// flight), freed after it, gathered again when the gradient of its output arrives, and after
// its backward its gradients are reduce-scattered so each rank receives the average of its own
// shard. Any strategy can shard over any group: fsdp over the mesh's dp_shard group; a pipeline
// stage over its own.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainyard/api/held_bytes.hpp"

namespace c10d {
class Backend;
}

namespace trainyard {

class DeferredParameters;
class Optimizer;

struct Block;

enum class UnitSharding {
  kFull,    // FULL_SHARD: parameters freed between forward and backward
  kGradOp,  // SHARD_GRAD_OP: parameters stay gathered from forward to the end of backward
  kNone,    // replicated parameters, gradients all-reduced per unit (as ddp)
};

struct ShardedUnitsOptions {
  UnitSharding sharding = UnitSharding::kFull;
  // All-gather the next unit (the previous one in backward) while the current one computes; at
  // most two units are gathered at a time.
  bool prefetch = true;
  // The dtype parameters are gathered in (the shards stay float32 masters); kNone gathers
  // nothing and keeps float32.
  c10::ScalarType gather_dtype = c10::kFloat;
  // The dtype gradients are reduced in.
  c10::ScalarType reduce_dtype = c10::kFloat;
};

// Where one unit's parameters live in its flat buffer.
struct ShardedUnitLayout {
  // The block's name, or "root" for the parameters no single block owns.
  std::string name;
  std::vector<std::size_t> parameters;  // indices into the parameter list, in flat order
  std::vector<std::int64_t> offsets;    // of each parameter in the flat buffer
  std::int64_t numel = 0;               // unpadded
  std::int64_t shard_numel = 0;         // padded numel / shard ranks
};

class ShardedUnits {
 public:
  // Cuts `parameters` (all trainable float32, named by `names`) into units along `blocks`: a
  // parameter used by exactly one block belongs to that block's unit; the rest (tied between
  // blocks, or in no block) form the root unit, first, gathered for the whole forward and
  // backward. The parameters keep their identity and now view the gathered buffers. A null
  // group is a group of one rank. Every rank of the group must call it alike.
  ShardedUnits(std::vector<at::Tensor> parameters, std::vector<std::string> names,
               const std::vector<Block>& blocks, const c10::intrusive_ptr<c10d::Backend>& group,
               const ShardedUnitsOptions& options);
  // The same, where parameters that `deferred` holds (placeholders, deferred_parameters.hpp)
  // are made one at a time and only this rank's part of each kept: building holds the shards
  // and one parameter, never the whole model. Buffers are made on `device`; the deferred
  // parameters then view them there.
  ShardedUnits(std::vector<at::Tensor> parameters, std::vector<std::string> names,
               const std::vector<Block>& blocks, const c10::intrusive_ptr<c10d::Backend>& group,
               const ShardedUnitsOptions& options, const DeferredParameters& deferred,
               c10::Device device);
  ~ShardedUnits();
  ShardedUnits(const ShardedUnits&) = delete;
  ShardedUnits& operator=(const ShardedUnits&) = delete;

  // The blocks given to the constructor, whose forwards gather their unit (and the root)
  // before running, prefetch the next, and free it after (and gather it again before its
  // backward) as the sharding mode says.
  const std::vector<Block>& blocks() const;

  std::size_t unit_count() const;
  const ShardedUnitLayout& layout(std::size_t unit) const;
  // This rank's shard of the unit's flat parameters: what the optimizer steps; after a
  // synchronised backward its .grad holds the averaged gradient of the shard.
  const at::Tensor& shard(std::size_t unit) const;
  std::vector<at::Tensor> shards() const;
  // Ranks the units are sharded over (1 when replicated) and this rank's shard.
  std::int64_t shard_ranks() const;
  std::int64_t shard_rank() const;

  // Before each micro-batch's backward: whether it reduces gradients (the last micro-batch) or
  // accumulates whole gradients locally (no_sync).
  void prepare_backward(bool synchronise);
  // After each micro-batch's backward: units whose gradients are not all there (parameters the
  // step did not use count as zero) are completed, reductions awaited, shards' .grad set (when
  // synchronised) and whole parameters freed.
  void finish_backward();
  // Hybrid sharding: each synchronised backward also averages every shard's gradient over
  // `replicate_group` (the ranks of the other replicate groups that hold the same shard, null:
  // none), in the reduce dtype. Each unit's all-reduce starts as soon as its reduce-scatter is
  // done, in the same order on every rank, while the backward goes on; finish_backward waits.
  void average_over(const c10::intrusive_ptr<c10d::Backend>& replicate_group);
  // Frees every gathered unit (after evaluation, or after loading shards).
  void release_all();
  // Gathers every unit (waiting for the all-gathers): before a backward that reuses a graph
  // whose forward has long finished, such as the weight half of a split backward (zero bubble),
  // whose blocks' gradient hooks already ran in the input half and the units may have been
  // freed since. finish_backward frees them again.
  void gather_all();

  // Every rank's `shard` of `unit` (by default its parameter shard) in one padded flat tensor,
  // the unit's own buffers untouched. Collective.
  at::Tensor gather_copy(std::size_t unit, const at::Tensor& shard = {}) const;
  // Whole parameters by name. Collective.
  std::map<std::string, at::Tensor> full_parameters() const;

  // found_inf (one element) becomes its maximum over the ranks, which hold different shards'
  // gradients. Collective when sharded.
  void combine_found_inf(at::Tensor& found_inf) const;
  // The L2 norm of `gradients` (this rank's shards' gradients) over every rank. Collective when
  // sharded.
  at::Tensor gradient_norm(const std::vector<at::Tensor>& gradients) const;

  // Shards, their gradients and `optimizer`'s state, gathered buffers while they hold memory,
  // whole gradients while accumulating, and flat gradients being reduced.
  HeldBytes held_bytes(const torch::optim::Optimizer* optimizer) const;
  // The same, with state of a type only `plugin` knows counted through it (held_bytes.hpp).
  HeldBytes held_bytes(const torch::optim::Optimizer* optimizer, const Optimizer& plugin) const;

 private:
  // What held_bytes counts: shards, gathered buffers, the model's parameters; flat gradients into
  // `gradient_buffers`.
  std::vector<at::Tensor> held_tensors(std::vector<at::Tensor>& gradient_buffers) const;

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
