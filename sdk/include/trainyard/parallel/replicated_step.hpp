#pragma once
// The parts of a step that strategies holding whole gradients on every rank (single, ddp) share.

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/api/strategy.hpp"

namespace torch::optim {
class Optimizer;
}

namespace trainyard {

class ParameterBlocks;
class Precision;

// After backward of `micro_batches` micro-batches: unscales the gradients, judges them
// (judge_gradients: norm, non-finite check, clipping), passes the optimizer step gate, steps the
// optimizer unless a gradient is non-finite, and moves the precision's state. Sets
// result.grad_norm, result.skipped and result.loss (the mean of `loss_sum` over the
// micro-batches). `layouts[i]` is how parameters[i] is held (whole, for these strategies). With
// `blocks` (context.step.block_grad_norms), also result.block_grad_norms.
void finish_replicated_step(const std::vector<torch::Tensor>& parameters,
                            const std::vector<HeldLayout>& layouts,
                            const StrategyContext& context, torch::optim::Optimizer& optimizer,
                            const torch::Tensor& loss_sum, std::int64_t micro_batches,
                            StepResult& result, const ParameterBlocks* blocks = nullptr);

// One evaluation batch through `blocks` under autocast, parameters and training mode untouched.
EvalResult evaluate_blocks(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                           torch::DeviceType device_type,
                           std::optional<torch::ScalarType> autocast_dtype);

}  // namespace trainyard
