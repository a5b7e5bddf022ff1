#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <sstream>

#include "trainyard/error.hpp"
#include "trainyard/gradients.hpp"
#include "trainyard/micro_batch.hpp"
#include "trainyard/module_state.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/replicated_step.hpp"
#include "trainyard/step_phases.hpp"

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

torch::Tensor forward_backward(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                               std::int64_t micro_batches, const StrategyContext& context,
                               std::optional<torch::ScalarType> autocast_dtype) {
  return forward_backward(model, blocks, batch, micro_batches, context, autocast_dtype, {});
}

torch::Tensor forward_backward(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                               std::int64_t micro_batches, const StrategyContext& context,
                               std::optional<torch::ScalarType> autocast_dtype,
                               const std::function<void()>& after_forward) {
  torch::Tensor loss;
  {
    AutocastGuard autocast(context.build.device.type(), autocast_dtype);
    loss = model.loss(run_blocks(model, blocks, batch), batch);
  }
  if (context.phases) context.phases->mark(StepPhase::Forward);
  if (after_forward) after_forward();
  torch::Tensor scaled = micro_batches > 1 ? loss / static_cast<double>(micro_batches) : loss;
  context.precision->scale_loss(scaled).backward();
  if (context.phases) context.phases->mark(StepPhase::Backward);
  return loss.detach();
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

namespace trainyard {

void finish_replicated_step(const std::vector<torch::Tensor>& parameters,
                            const StrategyContext& context, torch::optim::Optimizer& optimizer,
                            const torch::Tensor& loss_sum, std::int64_t micro_batches,
                            StepResult& result) {
  Precision& precision = *context.precision;
  std::vector<torch::Tensor> gradients = gradients_of(parameters);
  const bool finite = precision.unscale_and_check(gradients);
  if (context.step.max_grad_norm > 0) {
    result.grad_norm = clip_to_norm(gradients, global_norm(gradients), context.step.max_grad_norm);
  }
  context.before_optimizer_step();
  if (finite) optimizer.step();
  precision.update(!finite);
  result.skipped = !finite;
  result.loss = micro_batches > 1 ? loss_sum / static_cast<double>(micro_batches) : loss_sum;
}

EvalResult evaluate_blocks(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                           torch::DeviceType device_type,
                           std::optional<torch::ScalarType> autocast_dtype) {
  at::NoGradGuard no_grad;
  model.module().eval();
  EvalResult result;
  {
    AutocastGuard autocast(device_type, autocast_dtype);
    torch::Tensor output = run_blocks(model, blocks, batch);
    result.loss_sum = model.loss(output, batch).to(at::kDouble) * static_cast<double>(batch.size);
    result.sums = model.eval_sums(output, batch);
  }
  result.samples = batch.size;
  model.module().train();
  return result;
}

}  // namespace trainyard
