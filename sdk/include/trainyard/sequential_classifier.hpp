#pragma once
// A base for classification models built from torch::nn::Sequential blocks: logits [B, C]
// against the batch's "target", accuracy as the evaluation sum.

#include <memory>
#include <string>
#include <vector>

#include "trainyard/classification.hpp"
#include "trainyard/model.hpp"
#include "trainyard/sequential_block.hpp"

namespace trainyard {

class SequentialClassifier : public Model {
 public:
  explicit SequentialClassifier(const std::string& name)
      : root_(std::make_shared<torch::nn::Module>(name)) {}

  torch::nn::Module& module() override { return *root_; }
  std::vector<Block> blocks() override { return blocks_; }
  torch::Tensor input(const Batch& batch) override { return batch.at("input"); }
  torch::Tensor loss(const torch::Tensor& output, const Batch& batch) override {
    return classification_loss(output, batch);
  }
  TensorMap eval_sums(const torch::Tensor& output, const Batch& batch) override {
    return classification_sums(output, batch);
  }
  // 2 FLOPs per multiply-add, forward plus twice that for backward.
  double flops_per_sample() const override { return 6.0 * multiply_adds_; }

 protected:
  // Appends a block; `multiply_adds` is its forward cost per sample.
  void add_block(const std::string& name, torch::nn::Sequential layers, double multiply_adds) {
    blocks_.push_back(sequential_block(*root_, name, std::move(layers)));
    multiply_adds_ += multiply_adds;
  }

 private:
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<Block> blocks_;
  double multiply_adds_ = 0;
};

}  // namespace trainyard
