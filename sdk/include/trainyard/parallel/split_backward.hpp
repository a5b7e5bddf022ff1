#pragma once
// A backward pass in two halves that computes nothing twice: the B and W of the zero-bubble
// pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), as
// torch.distributed.pipelining splits it.
//
// The input half runs the graph only where it leads to the stage's inputs, giving their
// gradients, and keeps, at every node where a branch leaves that path for the parameters, the
// gradient that reached the node. The weight half later runs each such node once more for its
// parameter branches alone (the weight-gradient products), then those branches down to the
// parameters, accumulating into their .grad so that their gradient hooks fire as in a plain
// backward. No node computes an output twice. Between the halves the graph is kept: what stays
// in memory is the stage's saved activations, for each micro-batch whose weight half is pending
// (the schedule bounds how many), plus the kept gradients at the branch points. In the weight
// half a branch point that gives large parameter gradients at once (a recomputed block's node
// gives the whole block's) has them accumulated before the next point runs.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace trainyard {

class SplitBackward {
 public:
  SplitBackward();
  ~SplitBackward();
  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;

  // The input half: the gradients of `inputs` (one each, undefined where none flows) from
  // `roots` with `root_grads` (empty: ones, for a scalar loss), as torch::autograd::grad would
  // give them; `parameters` are those whose gradients the weight half is to accumulate (those
  // that require none are left out). Call once.
  std::vector<at::Tensor> input_half(const std::vector<at::Tensor>& roots,
                                     const std::vector<at::Tensor>& root_grads,
                                     const std::vector<at::Tensor>& inputs,
                                     const std::vector<at::Tensor>& parameters);
  // The weight half: accumulates the parameters' gradients into their .grad. Call once, after
  // input_half; the graph is freed as it runs.
  void weight_half();

  // The nodes where a parameter branch leaves the inputs' path (0 when the inputs need no
  // gradient, or reach no parameter: the weight half is then the whole backward).
  std::size_t branch_points() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace trainyard
