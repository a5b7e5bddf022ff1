#include "trainyard/parallel/replicated_step.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/api/precision.hpp"

namespace trainyard {

void finish_replicated_step(const std::vector<torch::Tensor>& parameters,
                            const std::vector<HeldLayout>& layouts,
                            const StrategyContext& context, torch::optim::Optimizer& optimizer,
                            const torch::Tensor& loss_sum, std::int64_t micro_batches,
                            StepResult& result, const ParameterBlocks* blocks) {
  Precision& precision = *context.precision;
  std::vector<torch::Tensor> held_gradients;
  held_gradients.reserve(parameters.size());
  for (const auto& parameter : parameters) held_gradients.push_back(parameter.grad());
  test_nonfinite_hook(held_gradients, layouts);
  std::vector<torch::Tensor> gradients = gradients_of(parameters);
  const torch::Tensor found_inf = precision.unscale(gradients);
  if (blocks) {
    // Every rank holds whole gradients (reduced already): the local sums are the global ones.
    const at::Tensor squares = block_squares(held_gradients, layouts, *blocks, {},
                                             parameters.front().device());
    set_block_norms(squares.sum(0), *blocks, result);
  }
  const GradientVerdict verdict =
      judge_gradients(context, found_inf, global_norm(gradients), gradients,
                      [&] { return first_nonfinite_parameter(held_gradients, layouts); }, result);
  context.before_optimizer_step();
  if (verdict.step) optimizer.step();
  precision.update(verdict.found_inf);
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
