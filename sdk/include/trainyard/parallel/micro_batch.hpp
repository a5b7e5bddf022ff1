#pragma once
// One micro-batch's forward and backward, the part of a training step every strategy shares.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

// Runs `batch` through `blocks` under the precision's autocast (`autocast_dtype`), then backward
// of its loss divided by `micro_batches` (K micro-batches of B equal one batch of K*B) and scaled
// by the precision's loss scale. Marks Forward and Backward on the context's phase clock.
// Returns the unscaled loss, detached.
torch::Tensor forward_backward(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                               std::int64_t micro_batches, const StrategyContext& context,
                               std::optional<torch::ScalarType> autocast_dtype);

// The same, calling `after_forward` between the forward and the backward: the point where a
// strategy can start communication that the backward then hides (ddp's buffer broadcast).
torch::Tensor forward_backward(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                               std::int64_t micro_batches, const StrategyContext& context,
                               std::optional<torch::ScalarType> autocast_dtype,
                               const std::function<void()>& after_forward);

}  // namespace trainyard
