#pragma once
// A base for classification models built from blocks (torch::nn::Sequential or modules of the
// model's own): logits [B, C]
// against the batch's "target" (cross-entropy, the mean or the sum over the samples), accuracy
// as the evaluation sum. It builds stages: a derived model names all its blocks up front, then
// adds them in order, and only the blocks of the stage are constructed, each initialised per
// parameter (LibTorch's defaults, drawn from the parameters' own streams).

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainyard/parallel/block_selection.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/models/classification.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/models/sequential_block.hpp"

namespace trainyard {

class SequentialClassifier : public Model {
 public:
  // `model` names the plugin in errors; `block_names` are all the whole model's blocks in
  // forward order; `context` says which of them to build (BuildContext::blocks) and the seed;
  // `reduction` how loss() reduces over the samples (the option loss_reduction_from() reads).
  SequentialClassifier(const std::string& model, const BuildContext& context,
                       std::vector<std::string> block_names,
                       LossReduction reduction = LossReduction::kMean)
      : root_(std::make_shared<torch::nn::Module>(model)),
        block_names_(std::move(block_names)),
        selection_(context.blocks, static_cast<std::int64_t>(block_names_.size()), model),
        init_(context.seed),
        reduction_(reduction) {}

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override { return blocks_; }
  torch::Tensor input(const Batch& batch) override {
    selection_.require_first("input()");
    return batch.at("input");
  }
  torch::Tensor loss(const torch::Tensor& output, const Batch& batch) override {
    selection_.require_last("loss()");
    return classification_loss(output, batch, reduction_);
  }
  // The terms are the samples: the default loss_terms() counts them.
  LossReduction loss_reduction() const override { return reduction_; }
  TensorMap eval_sums(const torch::Tensor& output, const Batch& batch) override {
    selection_.require_last("eval_sums()");
    return classification_sums(output, batch);
  }
  // 2 FLOPs per multiply-add forward, and as many for the weight gradients and for the input
  // gradients, except where a layer reads the batch itself: nothing asks for its input's gradient
  // (PyTorch's FLOP counter counts the same).
  double flops_per_sample() const override { return flops_; }
  bool builds_stages() const override { return true; }
  std::vector<std::string> block_names() override { return block_names_; }

 protected:
  // Adds the next block in forward order; `multiply_adds` is its forward cost per sample, of
  // which the first block's `reading_input` (all of them unless given) are in layers that read
  // the batch and so compute no input gradient. `make_module` returns a module holder whose
  // forward maps a tensor to a tensor (a torch::nn::Sequential, or a module class of the model's
  // own, such as a residual block, whose parameters are then named "<name>.<member>.weight"); it
  // runs only when the build holds the block.
  template <typename MakeModule>
  void add_block(const std::string& name, double multiply_adds, const MakeModule& make_module,
                 std::optional<double> reading_input = std::nullopt) {
    const auto index = added_++;
    if (index >= static_cast<std::int64_t>(block_names_.size()) || block_names_[index] != name) {
      throw Error("model '" + root_->name() + "' adds block '" + name +
                  "', which is not the next of the block names it declared");
    }
    if (!selection_.holds(index)) return;
    auto module = [&] {
      GlobalGeneratorGuard keep_global_stream;
      return make_module();
    }();
    init_.initialize_defaults(*module, name);
    blocks_.push_back(module_block(*root_, name, std::move(module)));
    const double without_input_gradient = index == 0 ? reading_input.value_or(multiply_adds) : 0;
    flops_ += 6.0 * multiply_adds - 2.0 * without_input_gradient;
  }

 private:
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<std::string> block_names_;
  BlockSelection selection_;
  ParameterInit init_;
  LossReduction reduction_;
  std::vector<Block> blocks_;
  std::int64_t added_ = 0;
  double flops_ = 0;
};

}  // namespace trainyard
