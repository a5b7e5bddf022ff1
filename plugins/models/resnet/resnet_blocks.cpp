#include "resnet_blocks.hpp"

#include <ATen/ATen.h>

namespace trainyard::resnet {
namespace {

torch::nn::Conv2d make_conv(const ConvNorm& layer) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(layer.in, layer.out, layer.kernel)
                               .stride(layer.stride)
                               .padding(layer.padding)
                               .bias(false));
}

// torchvision's BatchNorm2d defaults, which are LibTorch's: eps 1e-5, momentum 0.1, affine,
// tracking running statistics.
torch::nn::BatchNorm2d make_norm(const ConvNorm& layer) {
  return torch::nn::BatchNorm2d(layer.out);
}

torch::Tensor in_format(const torch::Tensor& input, bool channels_last) {
  return channels_last ? input.contiguous(at::MemoryFormat::ChannelsLast) : input;
}

}  // namespace

StemImpl::StemImpl(const BlockSpec& spec, bool channels_last)
    : max_pool_(spec.max_pool), channels_last_(channels_last) {
  const ConvNorm& layer = spec.convs.front();
  conv1 = register_module(layer.conv, make_conv(layer));
  bn1 = register_module(layer.norm, make_norm(layer));
}

torch::Tensor StemImpl::forward(const torch::Tensor& input) {
  torch::Tensor x = at::relu(bn1->forward(conv1->forward(in_format(input, channels_last_))));
  if (max_pool_) x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  return x;
}

ResidualBlockImpl::ResidualBlockImpl(const BlockSpec& spec, bool channels_last)
    : channels_last_(channels_last) {
  for (const ConvNorm& layer : spec.convs) {
    convs_.push_back(register_module(layer.conv, make_conv(layer)));
    norms_.push_back(register_module(layer.norm, make_norm(layer)));
  }
  if (spec.downsample) {
    // torch::nn::Sequential names its layers "0" and "1", as torchvision's downsample.
    downsample_ = register_module("downsample", torch::nn::Sequential(make_conv(*spec.downsample),
                                                                      make_norm(*spec.downsample)));
  }
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& input) {
  const torch::Tensor x = in_format(input, channels_last_);
  torch::Tensor out = x;
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    out = norms_[i]->forward(convs_[i]->forward(out));
    if (i + 1 < convs_.size()) out = at::relu(out);
  }
  const torch::Tensor identity = downsample_ ? downsample_->forward(x) : x;
  return at::relu(out + identity);
}

HeadImpl::HeadImpl(const BlockSpec& spec) {
  fc = register_module("fc", torch::nn::Linear(spec.features, spec.classes));
}

torch::Tensor HeadImpl::forward(const torch::Tensor& input) {
  return fc->forward(at::adaptive_avg_pool2d(input, {1, 1}).flatten(1));
}

}  // namespace trainyard::resnet
