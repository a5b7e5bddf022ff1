#include "trainyard/parallel/micro_batch.hpp"

#include <ATen/ATen.h>

#include "trainyard/api/precision.hpp"
#include "trainyard/api/step_phases.hpp"

namespace trainyard {

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

}  // namespace trainyard
