#pragma once
// torchvision's initialisation of a ResNet, each parameter drawn from its own stream
// (parameter_init.hpp) under its full torchvision name, so a stage built alone holds the values
// of the same blocks of the whole model.

#include <torch/nn/module.h>

#include <string>

#include "trainyard/models/parameter_init.hpp"

namespace trainyard::resnet {

// Initialises every layer of `block`, whose parameters are named `prefix` + their name in it:
// convolutions kaiming_normal_ (fan_out, ReLU gain), BatchNorms weight 1, bias 0 and fresh running
// statistics, the classifier LibTorch's Linear default (as torchvision leaves nn.Linear's).
void initialize_block(const ParameterInit& init, torch::nn::Module& block,
                      const std::string& prefix);

}  // namespace trainyard::resnet
