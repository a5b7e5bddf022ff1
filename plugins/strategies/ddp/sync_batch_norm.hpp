#pragma once
// SyncBatchNorm: BatchNorm layers that normalise with the statistics of the global batch (every
// rank of a process group) in training, with the gradients of that global normalisation.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/nn/modules/container/sequential.h>

#include <memory>

#include "trainyard/api/model.hpp"

namespace trainyard {

// The forward of a Sequential block whose BatchNorm layers synchronise over `group` while the
// module trains (and run as usual in eval). Returns nullopt when the block has no BatchNorm;
// throws Error when it has BatchNorm layers but is not a torch::nn::Sequential.
std::optional<std::function<torch::Tensor(const torch::Tensor&)>> sync_batch_norm_forward(
    const Block& block, c10::intrusive_ptr<c10d::Backend> group);

// Whether `module` or any module under it is a BatchNorm layer (1d, 2d or 3d).
bool has_batch_norm(torch::nn::Module& module);

}  // namespace trainyard
