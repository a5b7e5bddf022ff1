#include "trainyard/parallel/gradients.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace trainyard {

std::vector<std::shared_ptr<torch::autograd::Node>> on_gradient_ready(
    const std::vector<torch::Tensor>& parameters, std::function<void(std::size_t)> ready) {
  auto callback = std::make_shared<std::function<void(std::size_t)>>(std::move(ready));
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  accumulators.reserve(parameters.size());
  for (std::size_t index = 0; index < parameters.size(); ++index) {
    // The accumulator is the autograd node that adds a backward's gradient into .grad; its post
    // hook runs once the parameter's gradient of this backward is complete.
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters[index]);
    accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [callback, index](const torch::autograd::variable_list& outputs,
                          const torch::autograd::variable_list&) {
          (*callback)(index);
          return outputs;
        }));
    accumulators.push_back(std::move(accumulator));
  }
  return accumulators;
}

std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> out;
  out.reserve(parameters.size());
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) out.push_back(parameter.grad());
  }
  return out;
}

torch::Tensor global_norm(const std::vector<torch::Tensor>& gradients) {
  if (gradients.empty()) return torch::zeros({}, torch::kFloat32);
  // As torch.nn.utils.clip_grad_norm_ computes it: _foreach_norm, then the norm of the stack.
  std::vector<torch::Tensor> detached;
  detached.reserve(gradients.size());
  for (const auto& gradient : gradients) detached.push_back(gradient.detach());
  std::vector<torch::Tensor> norms = at::_foreach_norm(detached, 2);
  for (auto& norm : norms) norm = norm.to(torch::kFloat32);
  return at::linalg_vector_norm(torch::stack(norms), 2);
}

torch::Tensor clip_to_norm(const std::vector<torch::Tensor>& gradients, const torch::Tensor& norm,
                           double max_norm) {
  // Same rule and epsilon as torch.nn.utils.clip_grad_norm_.
  // Python's `max_norm / tensor` is `tensor.reciprocal() * max_norm`, which rounds differently
  // from a division.
  torch::Tensor coefficient = ((norm + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  for (const auto& gradient : gradients) gradient.detach().mul_(coefficient.to(gradient.dtype()));
  return norm;
}

}  // namespace trainyard
