#include "resnet_architecture.hpp"

#include <array>

namespace trainyard::resnet {
namespace {

struct DepthPlan {
  std::int64_t depth;
  bool bottleneck;
  std::array<std::int64_t, 4> blocks;  // residual blocks in layer1 .. layer4
};

// torchvision's resnet18, resnet34 and resnet50.
constexpr DepthPlan kDepths[] = {
    {18, false, {2, 2, 2, 2}},
    {34, false, {3, 4, 6, 3}},
    {50, true, {3, 4, 6, 3}},
};

// Each layer's width as a multiple of the stem's (torchvision: 64, so 64, 128, 256, 512).
constexpr std::array<std::int64_t, 4> kLayerWidthMultiples = {1, 2, 4, 8};
constexpr std::int64_t kBottleneckExpansion = 4;

struct Size {
  std::int64_t height = 0;
  std::int64_t width = 0;
};

std::int64_t output_size(std::int64_t in, std::int64_t kernel, std::int64_t stride,
                         std::int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// torchvision pads every convolution by half its kernel (1x1: 0, 3x3: 1, 7x7: 3).
ConvNorm conv_norm(std::string conv, std::string norm, std::int64_t in, std::int64_t out,
                   std::int64_t kernel, std::int64_t stride, const Size& input) {
  ConvNorm layer;
  layer.conv = std::move(conv);
  layer.norm = std::move(norm);
  layer.in = in;
  layer.out = out;
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = kernel / 2;
  layer.out_height = output_size(input.height, kernel, stride, layer.padding);
  layer.out_width = output_size(input.width, kernel, stride, layer.padding);
  return layer;
}

Size output_of(const ConvNorm& layer) { return {layer.out_height, layer.out_width}; }

BlockSpec make_stem(StemKind kind, std::int64_t channels, std::int64_t stem_width, Size& size) {
  BlockSpec stem;
  stem.name = "stem";
  stem.kind = BlockKind::kStem;
  const bool imagenet = kind == StemKind::kImagenet;
  stem.convs.push_back(
      conv_norm("conv1", "bn1", channels, stem_width, imagenet ? 7 : 3, imagenet ? 2 : 1, size));
  stem.max_pool = imagenet;
  stem.multiply_adds = stem.convs.front().multiply_adds();
  size = output_of(stem.convs.front());
  if (stem.max_pool) size = {output_size(size.height, 3, 2, 1), output_size(size.width, 3, 2, 1)};
  return stem;
}

// torchvision's BasicBlock (two 3x3 convolutions, the first strided) or Bottleneck (1x1, strided
// 3x3, 1x1 widening by 4: the stride on the 3x3, as torchvision's "ResNet v1.5").
BlockSpec make_residual(std::size_t layer, std::int64_t index, bool bottleneck, std::int64_t in,
                        std::int64_t planes, std::int64_t stride, Size& size) {
  BlockSpec block;
  block.name = "layer" + std::to_string(layer + 1) + "." + std::to_string(index);
  block.prefix = block.name + ".";
  block.kind = BlockKind::kResidual;
  const std::int64_t out = bottleneck ? planes * kBottleneckExpansion : planes;
  if (bottleneck) {
    block.convs.push_back(conv_norm("conv1", "bn1", in, planes, 1, 1, size));
    block.convs.push_back(conv_norm("conv2", "bn2", planes, planes, 3, stride, size));
    block.convs.push_back(
        conv_norm("conv3", "bn3", planes, out, 1, 1, output_of(block.convs.back())));
  } else {
    block.convs.push_back(conv_norm("conv1", "bn1", in, planes, 3, stride, size));
    block.convs.push_back(
        conv_norm("conv2", "bn2", planes, planes, 3, 1, output_of(block.convs.back())));
  }
  if (stride != 1 || in != out) {
    block.downsample = conv_norm("downsample.0", "downsample.1", in, out, 1, stride, size);
  }
  for (const ConvNorm& layer_conv : block.convs) block.multiply_adds += layer_conv.multiply_adds();
  if (block.downsample) block.multiply_adds += block.downsample->multiply_adds();
  size = output_of(block.convs.back());
  return block;
}

void add_conv_norm(std::map<std::string, std::vector<std::int64_t>>& shapes,
                   const std::string& prefix, const ConvNorm& layer) {
  shapes[prefix + layer.conv + ".weight"] = {layer.out, layer.in, layer.kernel, layer.kernel};
  for (const char* tensor : {".weight", ".bias", ".running_mean", ".running_var"}) {
    shapes[prefix + layer.norm + tensor] = {layer.out};
  }
  shapes[prefix + layer.norm + ".num_batches_tracked"] = {};
}

}  // namespace

double ConvNorm::multiply_adds() const {
  return static_cast<double>(out_height * out_width) * static_cast<double>(out * in) *
         static_cast<double>(kernel * kernel);
}

std::map<std::string, std::vector<std::int64_t>> BlockSpec::state_shapes() const {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const ConvNorm& layer : convs) add_conv_norm(shapes, prefix, layer);
  if (downsample) add_conv_norm(shapes, prefix, *downsample);
  if (kind == BlockKind::kHead) {
    shapes[prefix + "fc.weight"] = {classes, features};
    shapes[prefix + "fc.bias"] = {classes};
  }
  return shapes;
}

std::vector<std::string> Architecture::block_names() const {
  std::vector<std::string> names;
  for (const BlockSpec& block : blocks) names.push_back(block.name);
  return names;
}

std::map<std::string, std::vector<std::int64_t>> Architecture::state_shapes() const {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const BlockSpec& block : blocks) shapes.merge(block.state_shapes());
  return shapes;
}

bool is_supported_depth(std::int64_t depth) {
  for (const DepthPlan& plan : kDepths) {
    if (plan.depth == depth) return true;
  }
  return false;
}

Architecture make_architecture(std::int64_t depth, StemKind stem, std::int64_t channels,
                               std::int64_t height, std::int64_t width, std::int64_t classes,
                               std::int64_t stem_width) {
  const DepthPlan* plan = &kDepths[0];
  for (const DepthPlan& candidate : kDepths) {
    if (candidate.depth == depth) plan = &candidate;
  }
  Architecture architecture;
  Size size{height, width};
  architecture.blocks.push_back(make_stem(stem, channels, stem_width, size));
  std::int64_t in = stem_width;
  for (std::size_t layer = 0; layer < kLayerWidthMultiples.size(); ++layer) {
    for (std::int64_t index = 0; index < plan->blocks[layer]; ++index) {
      // The first block of every layer after the first halves the resolution.
      const std::int64_t stride = layer > 0 && index == 0 ? 2 : 1;
      architecture.blocks.push_back(
          make_residual(layer, index, plan->bottleneck, in,
                        stem_width * kLayerWidthMultiples[layer], stride, size));
      in = architecture.blocks.back().convs.back().out;
    }
  }
  BlockSpec head;
  head.name = "head";
  head.kind = BlockKind::kHead;
  head.features = in;
  head.classes = classes;
  head.multiply_adds = static_cast<double>(in * classes);
  architecture.blocks.push_back(std::move(head));
  return architecture;
}

}  // namespace trainyard::resnet
