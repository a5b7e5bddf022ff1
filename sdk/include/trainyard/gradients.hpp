#pragma once
// Gradient helpers every strategy shares.

#include <torch/types.h>

#include <vector>

namespace trainyard {

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
