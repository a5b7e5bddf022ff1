#pragma once
// Models: a sequence of blocks that strategies can wrap, recompute, split or parallelise.

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "trainyard/batch.hpp"
#include "trainyard/component.hpp"

namespace trainyard {

// One block of a model in forward order. Activations flow from block to block as one tensor,
// which is what lets a pipeline cut between any two blocks and a strategy run a block under
// activation checkpointing or gather its parameters just before it runs.
struct Block {
  std::string name;
  // Owns the block's parameters (shared with the model, never copied).
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

// A model plugin. Contract:
// - module() owns every parameter and buffer; each belongs to exactly one block's module,
//   except parameters tied between blocks (a shared embedding and output head), which appear
//   in both.
// - blocks() returns the same blocks, in forward order, on every call.
// - forward(batch) == last block(... first block(input(batch))).
// - loss() returns a scalar mean over the batch; eval_sums() returns per-batch sums (such as
//   "correct") that the engine adds up and divides by the sample count.
class Model : public Component {
 public:
  static constexpr const char* kKind = "model";
  virtual torch::nn::Module& module() = 0;
  virtual std::vector<Block> blocks() = 0;
  virtual torch::Tensor input(const Batch& batch) = 0;
  virtual torch::Tensor loss(const torch::Tensor& output, const Batch& batch) = 0;
  virtual TensorMap eval_sums(const torch::Tensor& output, const Batch& batch);
  // Forward + backward FLOPs of one sample, for throughput as a fraction of peak.
  virtual double flops_per_sample() const = 0;
};

// Runs `blocks` in order on the model's input: the plain forward pass strategies build on.
torch::Tensor run_blocks(Model& model, const std::vector<Block>& blocks, const Batch& batch);

}  // namespace trainyard
