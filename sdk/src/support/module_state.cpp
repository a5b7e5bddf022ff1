#include "trainyard/support/module_state.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <sstream>

#include "trainyard/api/error.hpp"

namespace trainyard {

void save_module_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& item : module.named_parameters(true)) {
    out.tensors[prefix + item.key()] = item.value().detach().clone();
  }
  for (const auto& item : module.named_buffers(true)) {
    out.tensors[prefix + item.key()] = item.value().detach().clone();
  }
}

void load_module_state(torch::nn::Module& module, const std::string& prefix, const StateDict& in) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  auto plan = [&](const std::string& name, const torch::Tensor& target) {
    auto it = in.tensors.find(prefix + name);
    if (it == in.tensors.end()) throw Error("checkpoint lacks '" + prefix + name + "'");
    if (!it->second.sizes().equals(target.sizes())) {
      std::ostringstream message;
      message << "checkpoint entry '" << prefix << name << "' has shape " << it->second.sizes()
              << ", the model has " << target.sizes();
      throw Error(message.str());
    }
    copies.emplace_back(target, it->second);
  };
  for (const auto& item : module.named_parameters(true)) plan(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) plan(item.key(), item.value());
  at::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace trainyard
