#include "resnet_init.hpp"

#include <torch/nn/init.h>
#include <torch/nn/modules/conv.h>

#include <cmath>

namespace trainyard::resnet {
namespace {

// torch.nn.init.kaiming_normal_(weight, mode="fan_out", nonlinearity="relu"):
// N(0, 2 / fan_out), fan_out = output channels x kernel area.
void kaiming_normal_fan_out(const ParameterInit& init, const torch::Tensor& weight,
                            const std::string& name) {
  const auto fan_out = std::get<1>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
  init.normal(weight, name, 0.0, std::sqrt(2.0 / static_cast<double>(fan_out)));
}

}  // namespace

void initialize_block(const ParameterInit& init, torch::nn::Module& block,
                      const std::string& prefix) {
  for (const auto& item : block.named_modules("", /*include_self=*/true)) {
    // The layer's full name: "layer1.0." + "conv1" -> "layer1.0.conv1".
    std::string name = prefix + item.key();
    if (item.key().empty() && !name.empty()) name.pop_back();
    torch::nn::Module& layer = *item.value();
    if (auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(&layer)) {
      kaiming_normal_fan_out(init, conv->weight, name + ".weight");
    } else if (!layer.named_parameters(/*recurse=*/false).is_empty()) {
      // BatchNorm's defaults are torchvision's constants, and the classifier keeps nn.Linear's;
      // a layer of any other type with parameters of its own is refused there.
      init.initialize_defaults(layer, name);
    }
  }
}

}  // namespace trainyard::resnet
