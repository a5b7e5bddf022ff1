#pragma once
// ZeRO stage 1 over one c10d group: parameters and gradients stay replicated (averaged by a
// GradientReducer, say), but each rank of the group keeps optimizer state for one contiguous
// slice of the flattened parameters only: it steps a master copy of its slice, and the updated
// slices are all-gathered back into every rank's parameters.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace c10d {
class Backend;
}
namespace torch::optim {
class Optimizer;
}

namespace trainyard {

class Optimizer;

class ShardedOptimizerState {
 public:
  // Creates `optimizer`'s update rule over this rank's slice of `parameters` (padded to whole
  // slices). A null group is a group of one rank, whose slice is everything.
  ShardedOptimizerState(std::vector<at::Tensor> parameters,
                        const c10::intrusive_ptr<c10d::Backend>& group, Optimizer& optimizer);
  ~ShardedOptimizerState();
  ShardedOptimizerState(const ShardedOptimizerState&) = delete;
  ShardedOptimizerState& operator=(const ShardedOptimizerState&) = delete;

  torch::optim::Optimizer& optimizer();
  // This rank's slice of the flattened parameters: what the optimizer steps and a checkpoint
  // keeps per rank.
  const at::Tensor& master() const;

  // The optimizer step on this rank's slice of the (averaged, unscaled, clipped) gradients in
  // the parameters' .grad, then every rank's updated slice into everyone's parameters
  // (collective: every rank of the group calls it).
  void step();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
