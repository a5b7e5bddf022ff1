#pragma once
// The memory of the tensors that only an optimizer step changes: the parameters a strategy
// steps (or refreshes from the step) and the optimizer's state. Between two steps nothing else
// writes there, so a checkpoint entry stored in it may be read (written to a file, or copied)
// while the next step's forward and backward run, as long as the optimizer waits for the reading
// to end (optimizer_step_gate.hpp).

#include <ATen/core/Tensor.h>

#include <unordered_set>
#include <vector>

namespace trainyard {

class OptimizerSteppedMemory {
 public:
  OptimizerSteppedMemory() = default;  // none: every entry is copied at once
  explicit OptimizerSteppedMemory(const std::vector<at::Tensor>& tensors);

  // Whether `tensor` (a view, a piece) lives in the memory of one of the tensors.
  bool holds(const at::Tensor& tensor) const;
  bool empty() const { return storages_.empty(); }

 private:
  std::unordered_set<const void*> storages_;
};

}  // namespace trainyard
