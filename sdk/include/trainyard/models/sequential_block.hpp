#pragma once
// Models turn each of their modules (a torch::nn::Sequential, or a module of their own) into a
// block with these.

#include <torch/nn/modules/container/sequential.h>

#include <string>

#include "trainyard/api/model.hpp"

namespace trainyard {

// Registers `module` under `name` in `root` and returns the block that runs it on the hidden
// tensor. Any module holder whose forward maps one tensor to one tensor will do (a residual
// block, a torch::nn::Sequential): its parameters are named `name.<its own names>`
// ("res0.fc1.weight"), with no container in between.
template <typename ModuleHolder>
Block module_block(torch::nn::Module& root, const std::string& name, ModuleHolder module) {
  root.register_module(name, module);
  auto shared = module.ptr();
  return Block{name, shared, [shared](const Activations& x) {
                 return x.with_hidden(shared->forward(x.hidden()));
               }};
}

// Registers `layers` under `name` in `root` and returns the block that runs it.
inline Block sequential_block(torch::nn::Module& root, const std::string& name,
                              torch::nn::Sequential layers) {
  return module_block(root, name, std::move(layers));
}

}  // namespace trainyard
