// A complete model plugin: a small residual network for classification. Copy this folder to
// start a plugin of any kind; the comments say what each part is for.

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

// Every plugin includes the interface it implements and trainyard/api/plugin.hpp, which defines
// the entry point. SequentialClassifier is a Model base that does the classification parts
// (cross-entropy, accuracy, building only a pipeline stage's blocks, per-parameter
// initialisation); a model of another kind implements trainyard::Model directly.
#include <trainyard/models/loss_reduction.hpp>
#include <trainyard/api/plugin.hpp>
#include <trainyard/models/sequential_classifier.hpp>

namespace {

// A block that is not a Sequential: x + fc2(relu(fc1(x))). Any module whose forward maps a
// tensor to a tensor can be a block; registered as "res0", its parameters are named
// "res0.fc1.weight" and so on.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  explicit ResidualBlockImpl(std::int64_t width)
      : fc1_(register_module("fc1", torch::nn::Linear(width, width))),
        fc2_(register_module("fc2", torch::nn::Linear(width, width))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2_->forward(torch::nn::functional::relu(fc1_->forward(x)));
  }

 private:
  torch::nn::Linear fc1_;
  torch::nn::Linear fc2_;
};
TORCH_MODULE(ResidualBlock);

// Every block's name, from the options alone: the pipeline asks before building anything.
std::vector<std::string> residual_mlp_block_names(std::int64_t residual_blocks) {
  std::vector<std::string> names = {"input"};
  for (std::int64_t i = 0; i < residual_blocks; ++i) names.push_back("res" + std::to_string(i));
  names.push_back("head");
  return names;
}

// The model: flatten and project to `width` ("input"), `residual_blocks` residual blocks, then
// a linear "head" to the classes. A model is a sequence of blocks so that strategies can wrap,
// recompute or split it.
class ResidualMlp final : public trainyard::SequentialClassifier {
 public:
  ResidualMlp(const trainyard::Config& options, const trainyard::BuildContext& context)
      : SequentialClassifier("residual_mlp", context,
                             residual_mlp_block_names(options.get_int("residual_blocks")),
                             trainyard::loss_reduction_from(options)) {
    // Options arrive validated against the declarations below (types, ranges, choices), with
    // defaults filled in. What depends on more than one value, or on the dataset, is checked
    // here; options.fail names the recipe key and its file:line:column.
    const std::int64_t width = options.get_int("width");
    const std::int64_t classes = context.data.num_classes;
    if (classes < 2) {
      throw trainyard::Error("model 'residual_mlp' needs a classification dataset");
    }
    if (width < classes) {
      options.fail("width", "must be at least the dataset's classes (" + std::to_string(classes) +
                                "), got " + std::to_string(width));
    }
    std::int64_t features = 1;
    for (auto d : context.data.input_shape) features *= d;

    // Blocks are added in the declared order; each factory runs only when this build (a whole
    // model, or a pipeline stage) holds the block.
    add_block("input", static_cast<double>(features * width), [&] {
      return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(features, width));
    });
    for (std::int64_t i = 0; i < options.get_int("residual_blocks"); ++i) {
      add_block("res" + std::to_string(i), 2.0 * static_cast<double>(width * width),
                [&] { return ResidualBlock(width); });
    }
    add_block("head", static_cast<double>(width * classes),
              [&] { return torch::nn::Linear(width, classes); });
  }
};

// Called once when the host loads the library: register each component under (kind, name)
// with its options, a one-line description and a factory. Each option declares its type and
// default (from the value), its help, and the values it allows (at_least, at_most,
// greater_than, less_than, one_of, or_exactly): `trainyard validate` refuses a recipe that breaks
// them and `trainyard plugins` lists them.
void register_components(trainyard::Registry& registry) {
  registry.add<trainyard::Model>(
      "residual_mlp",
      {trainyard::option("width", 64, "width of the residual stream").at_least(1),
       trainyard::option("residual_blocks", 2, "residual blocks between input and head")
           .at_least(0)
           .at_most(64),
       trainyard::loss_reduction_option("cross-entropy over the batch's samples: mean or sum")},
      "a residual MLP classifier (the plugin template)",
      [](const trainyard::Config& options, const trainyard::BuildContext& context) {
        return std::make_unique<ResidualMlp>(options, context);
      });
}

}  // namespace

// The library's one exported entry point: plugin name, plugin version, register function. The
// macro also records the SDK ABI version and the LibTorch/compiler build tag, which the host
// checks before calling anything here.
TRAINYARD_PLUGIN("residual_mlp", "1.0.0", register_components)
