#pragma once
// Gradient helpers every strategy shares.

#include <torch/types.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace trainyard {

// Calls ready(i) each time a backward has finished accumulating parameters[i]'s gradient: a
// post hook on the parameter's gradient accumulator, the moment a bucket or shard holding it can
// start communicating. Returns the accumulators, which hold the hooks: keep them alive as long
// as the hooks should run.
std::vector<std::shared_ptr<torch::autograd::Node>> on_gradient_ready(
    const std::vector<torch::Tensor>& parameters, std::function<void(std::size_t)> ready);

// The defined gradients of `parameters`.
std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& parameters);

// Global L2 norm of `gradients`, as a device tensor (no host sync).
torch::Tensor global_norm(const std::vector<torch::Tensor>& gradients);

// Scales `gradients` in place so their global norm is at most `max_norm`, the rule of
// torch.nn.utils.clip_grad_norm_, without a host sync. `norm` is their global norm (sharded
// strategies pass the norm reduced across shards). Returns `norm`.
torch::Tensor clip_to_norm(const std::vector<torch::Tensor>& gradients, const torch::Tensor& norm,
                           double max_norm);

}  // namespace trainyard
