#pragma once
// A batch cut into the pipeline's micro-batches.

#include <cstdint>
#include <vector>

#include "trainyard/api/batch.hpp"

namespace trainyard {

// Splits a batch along its first dimension into `count` micro-batches whose sizes differ by at
// most one, as torch.tensor_split does. Throws Error for a batch of fewer than `count` samples.
std::vector<Batch> split_batch(const Batch& batch, std::int64_t count);

}  // namespace trainyard
