#pragma once
// Parameters and buffers of a module as checkpoint entries.

#include <torch/nn/module.h>

#include <string>

#include "trainyard/api/state.hpp"

namespace trainyard {

// Adds every parameter and buffer of `module` as "<prefix><dotted name>" (detached copies).
void save_module_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out);

// Copies entries saved by save_module_state back into `module`. A missing entry or a shape
// mismatch is an Error naming the entry; the module is unchanged then.
void load_module_state(torch::nn::Module& module, const std::string& prefix, const StateDict& in);

}  // namespace trainyard
