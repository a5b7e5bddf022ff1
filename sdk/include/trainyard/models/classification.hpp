#pragma once
// Loss and metrics shared by classification models: logits [B, C] against "target" [B].

#include "trainyard/api/batch.hpp"
#include "trainyard/api/model.hpp"

namespace trainyard {

// Mean cross-entropy of `logits` against the batch's "target" class indices.
torch::Tensor classification_loss(const torch::Tensor& logits, const Batch& batch);
// The same cross-entropy, reduced over the samples as `reduction` says (their mean or sum).
torch::Tensor classification_loss(const torch::Tensor& logits, const Batch& batch,
                                  LossReduction reduction);
// {"accuracy": number of correct predictions} (summed, divided by the sample count later).
TensorMap classification_sums(const torch::Tensor& logits, const Batch& batch);

}  // namespace trainyard
