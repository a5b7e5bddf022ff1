// A convolutional classifier: stages of (3x3 conv, BatchNorm, ReLU, 2x2 max-pool), then a
// two-layer head. Each stage is a block, and so is the head.

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/models/sequential_classifier.hpp"

namespace trainyard {
namespace {

std::vector<std::string> cnn_block_names(std::size_t stages) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < stages; ++i) names.push_back("stage" + std::to_string(i));
  names.push_back("head");
  return names;
}

class Cnn final : public SequentialClassifier {
 public:
  Cnn(const Config& options, const BuildContext& context)
      : SequentialClassifier("cnn", context,
                             cnn_block_names(options.get_int_list("channels").size()),
                             loss_reduction_from(options)) {
    auto channels = options.get_int_list("channels");
    std::int64_t hidden = options.get_int("hidden");
    double dropout = options.get_float("dropout");
    bool batch_norm = options.get_bool("batch_norm");
    if (channels.empty()) options.fail("channels", "must list at least one stage");
    const auto& shape = context.data.input_shape;
    if (shape.size() != 3 || context.data.num_classes < 2) {
      throw Error("model 'cnn' needs images [channels, height, width] with classes");
    }
    std::int64_t in = shape[0], height = shape[1], width = shape[2];
    for (std::size_t i = 0; i < channels.size(); ++i) {
      if (height < 2 || width < 2) options.fail("channels", "has more stages than the image allows");
      const std::int64_t out = channels[i];
      add_block("stage" + std::to_string(i), static_cast<double>(height * width * out * in * 9),
                [&] {
                  torch::nn::Sequential stage;
                  stage->push_back(torch::nn::Conv2d(
                      torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(!batch_norm)));
                  if (batch_norm) stage->push_back(torch::nn::BatchNorm2d(out));
                  stage->push_back(torch::nn::ReLU());
                  stage->push_back(torch::nn::MaxPool2d(2));
                  return stage;
                });
      in = out;
      height /= 2;
      width /= 2;
    }
    const std::int64_t features = in * height * width;
    const std::int64_t classes = context.data.num_classes;
    add_block("head", static_cast<double>(features * hidden + hidden * classes), [&] {
      torch::nn::Sequential head;
      head->push_back(torch::nn::Flatten());
      head->push_back(torch::nn::Linear(features, hidden));
      head->push_back(torch::nn::ReLU());
      if (dropout > 0) head->push_back(torch::nn::Dropout(dropout));
      head->push_back(torch::nn::Linear(hidden, classes));
      return head;
    });
  }
};

void register_components(Registry& registry) {
  registry.add<Model>("cnn",
                      {option("channels", std::vector<std::int64_t>{32, 64},
                              "output channels of each conv stage")
                           .at_least(1),
                       option("hidden", 128, "width of the head's hidden layer").at_least(1),
                       option("dropout", 0.0, "dropout before the output layer")
                           .at_least(0)
                           .less_than(1),
                       option("batch_norm", true, "BatchNorm after each convolution"),
                       loss_reduction_option("cross-entropy over the batch's samples: their mean "
                                             "or their sum")},
                      "convolutional classifier (conv-BN-ReLU-pool stages and an MLP head)",
                      [](const Config& options, const BuildContext& context) {
                        return std::make_unique<Cnn>(options, context);
                      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("cnn", "1.0.0", trainyard::register_components)
