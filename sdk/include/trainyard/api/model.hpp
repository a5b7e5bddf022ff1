#pragma once
// Models: a sequence of blocks that strategies can wrap, recompute, split or parallelise.

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "trainyard/api/activations.hpp"
#include "trainyard/api/batch.hpp"
#include "trainyard/api/component.hpp"
#include "trainyard/api/parameter_pieces.hpp"

namespace trainyard {

// One block of a model in forward order. Activations flow from block to block as a bundle of
// named tensors (activations.hpp), which is what lets a pipeline cut between any two blocks and
// a strategy run a block under activation checkpointing or gather its parameters just before it
// runs.
struct Block {
  std::string name;
  // Owns the block's parameters (shared with the model, never copied).
  std::shared_ptr<torch::nn::Module> module;
  std::function<Activations(const Activations&)> forward;
};

// A parameter several blocks share (a tied embedding and output head). The whole model holds
// one tensor; a stage holding some of those blocks but not the one that owns it holds a copy of
// its own, initialised to the same values (as Megatron-LM's word embeddings for the head). A
// pipeline must keep the copies equal: all-reduce their gradients between the stages that hold
// them before every optimizer step.
struct TiedParameter {
  std::string name;                 // in the whole model's module()
  std::vector<std::string> blocks;  // the blocks that use it, in forward order
  std::string held_as;              // its name in this build's module(); empty if not held
};

// How loss() reduces over a batch's terms (samples, or the tokens that count): what lets a
// strategy that splits a batch (pipeline micro-batches) recombine the parts' losses into exactly
// the whole batch's. Data-parallel strategies average the ranks' losses as PyTorch's DDP does,
// which is the global mean when every rank holds equally many terms.
enum class LossReduction {
  kMean,  // the mean over the batch's terms: parts weigh by their share of the terms
  kSum,   // the sum over the batch's terms: parts add up
};

// A model plugin. Contract:
// - module() owns every parameter and buffer; each belongs to exactly one block's module,
//   except parameters tied between blocks (a shared embedding and output head), which appear
//   in both.
// - blocks() returns the same blocks, in forward order, on every call.
// - forward(batch) == last block(... first block(input(batch))).
// - loss() returns a scalar reduced over the batch as loss_reduction() says (by default the mean
//   over its samples); eval_sums() returns per-batch sums (such as "correct") that the engine
//   adds up and divides by the sample count.
// Stage builds (pipeline parallelism), for models whose builds_stages() is true:
// - With BuildContext::blocks set, the model creates only those blocks' modules, parameters and
//   buffers (an empty range creates none); blocks() returns only them, and module() and each
//   block's module name them as the whole model does. Tied parameters are the exception above.
// - Every parameter and buffer holds exactly the values the whole model built with the same
//   BuildContext::seed holds (per-parameter streams, parameter_init.hpp), and building draws
//   nothing from the global generator.
// - input(batch) needs the first block, loss() and eval_sums() the last; a stage without it
//   throws Error. Running a stage's blocks on the previous stage's output continues the whole
//   model's forward exactly.
// - block_names() and tied_parameters() describe the whole model on any stage.
class Model : public Component {
 public:
  static constexpr const char* kKind = "model";
  virtual torch::nn::Module& module() = 0;
  virtual std::vector<Block> blocks() = 0;
  virtual torch::Tensor input(const Batch& batch) = 0;
  virtual torch::Tensor loss(const torch::Tensor& output, const Batch& batch) = 0;
  virtual TensorMap eval_sums(const torch::Tensor& output, const Batch& batch);
  // Default: kMean.
  virtual LossReduction loss_reduction() const;
  // How many terms loss() reduces over for `batch`: its samples by default; a per-token loss
  // counts the tokens it scores (those whose target is not ignored). Read on the host, so a
  // model that counts tokens pays one device sync per part.
  virtual double loss_terms(const Batch& batch) const;
  // Forward + backward FLOPs of one sample through the blocks this build holds (the whole
  // model's unless it is a stage), for throughput as a fraction of peak.
  virtual double flops_per_sample() const = 0;

  // Whether the model honours BuildContext::blocks. A model that does not always builds whole,
  // and a pipeline must refuse it. Default: false.
  virtual bool builds_stages() const;
  // The names of all the whole model's blocks, in forward order, known from the options alone:
  // how a pipeline learns the block count before it splits (build an empty range to allocate
  // nothing). Default: the names of blocks(), right for models that always build whole.
  virtual std::vector<std::string> block_names();
  // The parameters several blocks share (see TiedParameter). Default: none.
  virtual std::vector<TiedParameter> tied_parameters();
  // How this build holds its parameter `name` (its name in module(), whose tensor is `held`) as
  // pieces of the whole model's parameters: whole by default; a tensor-parallel shard as the
  // box (or boxes: a fused q/k/v weight split by heads holds three) of the whole parameter it
  // covers. Strategies save, load and re-slice checkpoints with it, and a parameter held whole
  // is one every tensor-parallel rank holds alike (its gradient norm counted once).
  virtual HeldLayout parameter_layout(const std::string& name, const torch::Tensor& held) const;
  // Files another framework needs beside this model's exported weights to load them, keyed by
  // "<format>/<file name>": a model transformers knows gives {"hf/config.json": its config}, and
  // its parameter names are the ones transformers uses. They describe the whole model on any
  // build (a stage, a tensor-parallel piece). The engine saves them with every checkpoint, and
  // `trainyard checkpoint export --format hf` writes them beside the weights. Default: none.
  virtual std::map<std::string, std::string> export_files() const;
};

// parameter_layout of each of the model's parameters, in module().named_parameters() order.
std::vector<HeldLayout> parameter_layouts(Model& model);

// Runs `blocks` in order on the model's input: the plain forward pass strategies build on.
torch::Tensor run_blocks(Model& model, const std::vector<Block>& blocks, const Batch& batch);

}  // namespace trainyard
