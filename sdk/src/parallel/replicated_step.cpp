#include "trainyard/parallel/replicated_step.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "trainyard/parallel/gradients.hpp"
#include "trainyard/api/precision.hpp"

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
