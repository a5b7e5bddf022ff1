// A multi-layer perceptron classifier: one block per hidden layer, then the output layer.

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "trainyard/classification.hpp"
#include "trainyard/model.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/sequential_block.hpp"

namespace trainyard {
namespace {

class Mlp final : public Model {
 public:
  Mlp(const Config& options, const BuildContext& context) {
    auto hidden = options.get_int_list("hidden");
    double dropout = options.get_float("dropout");
    if (dropout < 0 || dropout >= 1) options.fail("dropout", "must be in [0, 1)");
    if (context.data.num_classes < 2) {
      throw Error("model 'mlp' needs a classification dataset (num_classes >= 2)");
    }
    std::int64_t features = 1;
    for (auto d : context.data.input_shape) features *= d;
    std::int64_t width = features;
    for (std::size_t i = 0; i < hidden.size(); ++i) {
      if (hidden[i] < 1) options.fail("hidden", "must have positive widths");
      torch::nn::Sequential layer;
      if (i == 0) layer->push_back(torch::nn::Flatten());
      layer->push_back(torch::nn::Linear(width, hidden[i]));
      layer->push_back(torch::nn::ReLU());
      if (dropout > 0) layer->push_back(torch::nn::Dropout(dropout));
      blocks_.push_back(sequential_block(*root_, "hidden" + std::to_string(i), layer));
      macs_ += static_cast<double>(width * hidden[i]);
      width = hidden[i];
    }
    torch::nn::Sequential head;
    if (hidden.empty()) head->push_back(torch::nn::Flatten());
    head->push_back(torch::nn::Linear(width, context.data.num_classes));
    blocks_.push_back(sequential_block(*root_, "head", head));
    macs_ += static_cast<double>(width * context.data.num_classes);
  }

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
  double flops_per_sample() const override { return 6.0 * macs_; }

 private:
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>("Mlp");
  std::vector<Block> blocks_;
  double macs_ = 0;
};

void register_components(Registry& registry) {
  registry.add<Model>("mlp",
                      {option("hidden", std::vector<std::int64_t>{256, 128}, "hidden layer widths"),
                       option("dropout", 0.0, "dropout after each hidden layer")},
                      "multi-layer perceptron classifier",
                      [](const Config& options, const BuildContext& context) {
                        return std::make_unique<Mlp>(options, context);
                      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("mlp", "1.0.0", trainyard::register_components)
