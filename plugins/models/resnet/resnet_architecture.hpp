#pragma once
// The shape of a ResNet (torchvision's resnet18, resnet34 and resnet50) as plain data: its blocks,
// the convolutions of each with torchvision's names, and the image size each one sees. The
// modules, the multiply-adds and the tensors a weights file must hold all come from this one
// description, so they cannot disagree.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainyard::resnet {

// "imagenet": torchvision's 7x7 stride-2 convolution and 3x3 stride-2 max-pool. "small": one 3x3
// stride-1 convolution and no pooling, which keeps the resolution of 28-32 pixel images.
enum class StemKind { kImagenet, kSmall };

// A convolution without bias and the BatchNorm after it, named as in their block.
struct ConvNorm {
  std::string conv;  // "conv1", "downsample.0"
  std::string norm;  // "bn1", "downsample.1"
  std::int64_t in = 0;
  std::int64_t out = 0;
  std::int64_t kernel = 1;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t out_height = 0;
  std::int64_t out_width = 0;

  double multiply_adds() const;
};

enum class BlockKind { kStem, kResidual, kHead };

struct BlockSpec {
  std::string name;    // "stem", "layer1.0", ..., "head"
  std::string prefix;  // of its tensors in torchvision's state_dict: "" or "layer1.0."
  BlockKind kind = BlockKind::kResidual;
  // The stem's convolution, or a residual block's main path in order (basic: conv1, conv2;
  // bottleneck: conv1, conv2, conv3).
  std::vector<ConvNorm> convs;
  // A residual block's projection of its input, when the stride or the width changes.
  std::optional<ConvNorm> downsample;
  bool max_pool = false;      // the stem's, after its convolution
  std::int64_t features = 0;  // the head's input width
  std::int64_t classes = 0;   // the head's output width
  double multiply_adds = 0;   // per sample, forward

  // Tensors of torchvision's state_dict this block holds, by full name, with their shapes
  // (BatchNorm's running statistics and num_batches_tracked included).
  std::map<std::string, std::vector<std::int64_t>> state_shapes() const;
};

struct Architecture {
  std::vector<BlockSpec> blocks;  // in forward order

  std::vector<std::string> block_names() const;
  // Every tensor of the whole model's torchvision state_dict, with its shape.
  std::map<std::string, std::vector<std::int64_t>> state_shapes() const;
};

// The depths torchvision builds with these blocks: 18 and 34 (basic), 50 (bottleneck).
bool is_supported_depth(std::int64_t depth);

// The ResNet of `depth` for images of `channels` x `height` x `width` and `classes` classes.
// `depth` must be supported. `stem_width` is the stem's output channels (torchvision's 64); the
// four layers are 1, 2, 4 and 8 times as wide (times 4 more at a bottleneck's output).
Architecture make_architecture(std::int64_t depth, StemKind stem, std::int64_t channels,
                               std::int64_t height, std::int64_t width, std::int64_t classes,
                               std::int64_t stem_width = 64);

}  // namespace trainyard::resnet
