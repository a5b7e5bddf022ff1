// A multi-layer perceptron classifier: one block per hidden layer, then the output layer.

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/models/sequential_classifier.hpp"

namespace trainyard {
namespace {

std::vector<std::string> mlp_block_names(std::size_t hidden_layers) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < hidden_layers; ++i) names.push_back("hidden" + std::to_string(i));
  names.push_back("head");
  return names;
}

class Mlp final : public SequentialClassifier {
 public:
  Mlp(const Config& options, const BuildContext& context)
      : SequentialClassifier("mlp", context, mlp_block_names(options.get_int_list("hidden").size()),
                             loss_reduction_from(options)) {
    auto hidden = options.get_int_list("hidden");
    double dropout = options.get_float("dropout");
    if (context.data.num_classes < 2) {
      throw Error("model 'mlp' needs a classification dataset (num_classes >= 2)");
    }
    std::int64_t features = 1;
    for (auto d : context.data.input_shape) features *= d;
    std::int64_t width = features;
    for (std::size_t i = 0; i < hidden.size(); ++i) {
      const std::int64_t out = hidden[i];
      add_block("hidden" + std::to_string(i), static_cast<double>(width * out), [&] {
        torch::nn::Sequential layer;
        if (i == 0) layer->push_back(torch::nn::Flatten());
        layer->push_back(torch::nn::Linear(width, out));
        layer->push_back(torch::nn::ReLU());
        if (dropout > 0) layer->push_back(torch::nn::Dropout(dropout));
        return layer;
      });
      width = out;
    }
    const std::int64_t classes = context.data.num_classes;
    add_block("head", static_cast<double>(width * classes), [&] {
      torch::nn::Sequential head;
      if (hidden.empty()) head->push_back(torch::nn::Flatten());
      head->push_back(torch::nn::Linear(width, classes));
      return head;
    });
  }
};

void register_components(Registry& registry) {
  registry.add<Model>("mlp",
                      {option("hidden", std::vector<std::int64_t>{256, 128}, "hidden layer widths")
                           .at_least(1),
                       option("dropout", 0.0, "dropout after each hidden layer")
                           .at_least(0)
                           .less_than(1),
                       loss_reduction_option("cross-entropy over the batch's samples: their mean "
                                             "or their sum")},
                      "multi-layer perceptron classifier",
                      [](const Config& options, const BuildContext& context) {
                        return std::make_unique<Mlp>(options, context);
                      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("mlp", "1.0.0", trainyard::register_components)
