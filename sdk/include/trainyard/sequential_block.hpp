#pragma once
// Models built from torch::nn::Sequential layers turn each into a block with this.

#include <torch/nn/modules/container/sequential.h>

#include <string>

#include "trainyard/model.hpp"

namespace trainyard {

// Registers `layers` under `name` in `root` and returns the block that runs it.
inline Block sequential_block(torch::nn::Module& root, const std::string& name,
                              torch::nn::Sequential layers) {
  root.register_module(name, layers);
  auto module = layers.ptr();
  return Block{name, module, [module](const Activations& x) {
                 return x.with_hidden(module->forward(x.hidden()));
               }};
}

}  // namespace trainyard
