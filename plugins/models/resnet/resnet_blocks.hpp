#pragma once
// The modules of a ResNet's blocks, holding their layers under torchvision's names (conv1, bn1,
// downsample.0, fc), so that a block's parameters and buffers, with the block's prefix, are the
// keys of torchvision's state_dict.

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <vector>

#include "resnet_architecture.hpp"

namespace trainyard::resnet {

// Blocks that take `channels_last` move their input to the channels-last memory format: the
// convolutions and BatchNorms after it then run their channels-last kernels, while the parameters
// keep their usual layout for strategies and checkpoints.

// The first convolution, its BatchNorm and ReLU, and with the imagenet stem the max-pool.
class StemImpl : public torch::nn::Module {
 public:
  StemImpl(const BlockSpec& spec, bool channels_last);
  torch::Tensor forward(const torch::Tensor& input);

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};

 private:
  bool max_pool_;
  bool channels_last_;
};
TORCH_MODULE(Stem);

// torchvision's BasicBlock or Bottleneck: conv-BN(-ReLU) pairs, the input (or its downsample
// projection) added before the last ReLU.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(const BlockSpec& spec, bool channels_last);
  torch::Tensor forward(const torch::Tensor& input);

  // The BatchNorm whose output joins the residual: what zero_init_residual zeroes.
  torch::nn::BatchNorm2d last_norm() const { return norms_.back(); }

 private:
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<torch::nn::BatchNorm2d> norms_;
  torch::nn::Sequential downsample_{nullptr};
  bool channels_last_;
};
TORCH_MODULE(ResidualBlock);

// Global average pooling and the linear classifier.
class HeadImpl : public torch::nn::Module {
 public:
  explicit HeadImpl(const BlockSpec& spec);
  torch::Tensor forward(const torch::Tensor& input);

  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Head);

}  // namespace trainyard::resnet
