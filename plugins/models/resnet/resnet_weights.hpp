#pragma once
// A torchvision ResNet's state_dict saved as safetensors (safetensors.torch.save_file(
// model.state_dict(), path)), checked against the model as a whole and copied into the blocks a
// build holds.

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainyard/models/pretrained_weights.hpp"

namespace trainyard::resnet {

using TensorShapes = std::map<std::string, std::vector<std::int64_t>>;

// Throws Error unless `weights` holds exactly the tensors of `expected` with their shapes: a
// missing, extra or wrongly shaped tensor is named with both shapes, and a floating-point
// tensor stored as integers (or the reverse) with its dtype. `notes` adds to the message of a
// tensor's wrong shape where its shape comes from (the dataset's channels, its classes).
void check_weights_match(const PretrainedWeights& weights, const TensorShapes& expected,
                         const std::map<std::string, std::string>& notes);

// Copies into each parameter and buffer of `block` the tensor named `prefix` + its name in the
// block, in the parameter's dtype.
void load_block(const PretrainedWeights& weights, torch::nn::Module& block,
                const std::string& prefix);

}  // namespace trainyard::resnet
