// A ResNet image classifier: torchvision's resnet18, resnet34 (basic blocks) and resnet50
// (bottleneck blocks), with BatchNorm, for the dataset's channels and classes.
//
// Parameters and buffers carry torchvision's names ("conv1.weight", "layer1.0.bn1.running_mean",
// "layer2.0.downsample.0.weight", "fc.bias"), so a torchvision state_dict saved as safetensors
// loads with `weights` and a checkpoint's tensors load back into torchvision.
//
// Blocks, in forward order, each passing one tensor to the next:
//   "stem"       images [B, C, H, W] -> [B, 64, H', W'] (conv1, bn1, ReLU, max-pool)
//   "layerL.I"   one residual block, for each block I of layer L in 1 .. 4
//   "head"       global average pooling and fc -> logits [B, classes]
// so activation checkpointing recomputes, and a pipeline stage holds, whole residual blocks.
//
// Where the values come from: with `weights`, the tensors of the blocks the build holds are read
// from the file (checked against the whole model first); otherwise torchvision's initialisation
// draws each parameter from its own stream (parameter_init.hpp), so a stage holds exactly the
// whole model's values.

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "resnet_architecture.hpp"
#include "resnet_blocks.hpp"
#include "resnet_init.hpp"
#include "resnet_weights.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/models/classification.hpp"
#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/models/pretrained_weights.hpp"
#include "trainyard/parallel/block_selection.hpp"

namespace trainyard {
namespace {

using namespace resnet;

resnet::Architecture architecture_for(const Config& options, const BuildContext& context) {
  const std::int64_t depth = options.get_int("depth");
  if (!is_supported_depth(depth)) {
    options.fail("depth", "must be 18, 34 or 50, got " + std::to_string(depth));
  }
  const auto& shape = context.data.input_shape;
  if (shape.size() != 3 || context.data.num_classes < 2) {
    throw Error("model 'resnet' needs images [channels, height, width] with classes");
  }
  const StemKind stem =
      options.get_string("stem") == "small" ? StemKind::kSmall : StemKind::kImagenet;
  return make_architecture(depth, stem, shape[0], shape[1], shape[2], context.data.num_classes,
                           options.get_int("width"));
}

// channels_last = "auto" follows the device: CUDA's convolutions are faster channels-last.
bool channels_last_for(const Config& options, const BuildContext& context) {
  const std::string choice = options.get_string("channels_last");
  if (choice == "auto") return context.device.is_cuda();
  return choice == "true";
}

// Where the shapes a weights file may get wrong come from, for its error message.
std::map<std::string, std::string> shape_notes(const Config& options, const BuildContext& context) {
  const std::string classes =
      std::to_string(context.data.num_classes) + " classes from the dataset";
  return {
      {"conv1.weight", std::to_string(context.data.input_shape[0]) +
                           " input channels from the dataset, the kernel from " +
                           options.qualified("stem") + " = \"" + options.get_string("stem") + "\""},
      {"fc.weight", classes},
      {"fc.bias", classes}};
}

template <typename ModuleHolder>
Block block_of(const std::string& name, ModuleHolder module) {
  auto shared = module.ptr();
  return Block{name, shared, [shared](const Activations& x) {
                 return x.with_hidden(shared->forward(x.hidden()));
               }};
}

class Resnet final : public Model {
 public:
  Resnet(const Config& options, const BuildContext& context)
      : architecture_(architecture_for(options, context)),
        selection_(context.blocks, static_cast<std::int64_t>(architecture_.blocks.size()),
                   "resnet"),
        reduction_(loss_reduction_from(options)),
        root_(std::make_shared<torch::nn::Module>("resnet")) {
    std::shared_ptr<const PretrainedWeights> weights;
    if (!options.get_string("weights").empty()) {
      weights = std::make_shared<const PretrainedWeights>(options.get_path("weights"));
      check_weights_match(*weights, architecture_.state_shapes(), shape_notes(options, context));
    }
    const bool channels_last = channels_last_for(options, context);
    const bool zero_init_residual = options.get_bool("zero_init_residual");
    const ParameterInit init(context.seed);
    for (std::size_t i = 0; i < architecture_.blocks.size(); ++i) {
      if (!selection_.holds(static_cast<std::int64_t>(i))) continue;
      const BlockSpec& spec = architecture_.blocks[i];
      torch::nn::Module& module = add_block(spec, channels_last);
      if (weights) {
        load_block(*weights, module, spec.prefix);
      } else {
        initialize_block(init, module, spec.prefix);
      }
      multiply_adds_ += spec.multiply_adds;
    }
    if (zero_init_residual && !weights) zero_last_norms();
  }

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
  // 2 FLOPs per multiply-add, forward plus twice that for backward.
  double flops_per_sample() const override { return 6.0 * multiply_adds_; }
  bool builds_stages() const override { return true; }
  std::vector<std::string> block_names() override { return architecture_.block_names(); }

 private:
  resnet::Architecture architecture_;
  BlockSelection selection_;
  LossReduction reduction_;
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<Block> blocks_;
  std::vector<ResidualBlock> residual_blocks_;
  // layer1 .. layer4, registered under the root when the build holds one of their blocks.
  std::map<std::string, std::shared_ptr<torch::nn::Module>> layers_;
  double multiply_adds_ = 0;

  // Builds the block's module, registers its layers under torchvision's names in the root and
  // adds the block; returns the module, whose values are still LibTorch's defaults.
  torch::nn::Module& add_block(const BlockSpec& spec, bool channels_last) {
    // torch::nn modules draw their default values from the global generator as they are built;
    // the run's dropout and shuffling must not see those draws.
    GlobalGeneratorGuard keep_global_stream;
    switch (spec.kind) {
      case BlockKind::kStem: {
        Stem stem(spec, channels_last);
        root_->register_module("conv1", stem->conv1);
        root_->register_module("bn1", stem->bn1);
        blocks_.push_back(block_of(spec.name, stem));
        return *stem;
      }
      case BlockKind::kResidual: {
        ResidualBlock block(spec, channels_last);
        const auto dot = spec.name.find('.');
        layer(spec.name.substr(0, dot)).register_module(spec.name.substr(dot + 1), block);
        residual_blocks_.push_back(block);
        blocks_.push_back(block_of(spec.name, block));
        return *block;
      }
      case BlockKind::kHead: {
        Head head(spec);
        root_->register_module("fc", head->fc);
        blocks_.push_back(block_of(spec.name, head));
        return *head;
      }
    }
    throw Error("model 'resnet': block '" + spec.name + "' is of no known kind");
  }

  torch::nn::Module& layer(const std::string& name) {
    auto& held = layers_[name];
    if (!held) {
      held = std::make_shared<torch::nn::Module>(name);
      root_->register_module(name, held);
    }
    return *held;
  }

  // torchvision's zero_init_residual: each residual block starts as the identity, its last
  // BatchNorm scaling by zero.
  void zero_last_norms() {
    at::NoGradGuard no_grad;
    for (const ResidualBlock& block : residual_blocks_) block->last_norm()->weight.fill_(0.0);
  }
};

void register_components(Registry& registry) {
  registry.add<Model>(
      "resnet",
      {option("depth", 18, "18 or 34 (basic blocks) or 50 (bottleneck blocks), as torchvision's"),
       option("stem", "imagenet",
              "\"imagenet\": 7x7 stride-2 convolution and max-pool; \"small\": one 3x3 stride-1 "
              "convolution and no pooling, for 28-32 pixel images")
           .one_of({"imagenet", "small"}),
       option("width", 64,
              "channels of the stem's output (torchvision's 64); the four layers are 1, 2, 4 and 8 "
              "times as wide. torchvision's weights need 64; 16 trains small images on a CPU in "
              "a sixteenth of the time")
           .at_least(1),
       option("zero_init_residual", false,
              "start each residual block's last BatchNorm at zero scale (the block starts as the "
              "identity)"),
       option("channels_last", "auto",
              "run the convolutions in the channels-last memory format: \"auto\" on CUDA "
              "devices, \"true\" or \"false\"")
           .one_of({"auto", "true", "false"}),
       option("weights", "",
              "a .safetensors file of a torchvision ResNet's state_dict to start from; its "
              "tensors must be exactly the model's"),
       loss_reduction_option("cross-entropy over the batch's samples: their mean or their sum")},
      "ResNet image classifier (torchvision's resnet18/34/50: BatchNorm, basic or bottleneck "
      "blocks, its parameter names and weights)",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<Resnet>(options, context);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("resnet", "1.0.0", trainyard::register_components)
