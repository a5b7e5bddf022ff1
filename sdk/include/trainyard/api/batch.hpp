#pragma once
// Named tensors: one sample, one batch, or one entry set of a checkpoint.

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace trainyard {

// Names may be dotted ("input.ids") to express nesting; collation treats every name alike.
using TensorMap = std::map<std::string, torch::Tensor>;

// A batch as the loader hands it to the strategy: tensors stacked along dimension 0.
struct Batch {
  TensorMap tensors;
  std::int64_t size = 0;  // samples in the batch

  const torch::Tensor& at(const std::string& name) const;
  // The batch on `device`; non_blocking copies need pinned sources to overlap.
  Batch to(const torch::Device& device, bool non_blocking = false) const;
};

// Stacks samples that share the same names and shapes. Throws Error when they differ.
Batch collate(const std::vector<TensorMap>& samples);

}  // namespace trainyard
