#include "sync_batch_norm.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/batchnorm.h>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Channel statistics are combined in float64 from each rank's (count, mean, M2), the parallel
// form of Welford's update, so the global variance is as exact as a single pass over the batch.
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean,
                            at::Tensor running_var, at::Tensor batches_tracked, double eps,
                            double momentum, c10d::Backend* group) {
    const std::int64_t channels = input.size(1);
    std::vector<std::int64_t> reduce_dims{0};
    for (std::int64_t d = 2; d < input.dim(); ++d) reduce_dims.push_back(d);
    const double local_count = static_cast<double>(input.numel() / channels);

    at::Tensor x64 = input.to(at::kDouble);
    at::Tensor local_mean = x64.mean(reduce_dims);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
    shape[1] = channels;
    at::Tensor local_m2 = (x64 - local_mean.view(shape)).pow(2).sum(reduce_dims);
    at::Tensor mine = at::cat({at::full({1}, local_count, x64.options()), local_mean, local_m2});

    std::vector<at::Tensor> inputs{mine};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < group->getSize(); ++r) outputs[0].push_back(at::empty_like(mine));
    {
      CollectiveWait wait;
      group->allgather(outputs, inputs)->wait();
    }
    at::Tensor gathered = at::stack(outputs[0]);  // [ranks, 1 + 2C]
    at::Tensor counts = gathered.select(1, 0);
    at::Tensor means = gathered.narrow(1, 1, channels);
    at::Tensor m2s = gathered.narrow(1, 1 + channels, channels);
    const double total = counts.sum().item<double>();
    at::Tensor mean = (means * counts.unsqueeze(1)).sum(0) / total;
    at::Tensor m2 = m2s.sum(0) + ((means - mean).pow(2) * counts.unsqueeze(1)).sum(0);
    at::Tensor var = m2 / total;
    at::Tensor invstd = (var + eps).rsqrt();

    {
      at::NoGradGuard no_grad;
      if (running_mean.defined()) {
        const double unbiased = total > 1 ? total / (total - 1) : 1.0;
        running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype()), momentum);
        running_var.mul_(1 - momentum).add_((var * unbiased).to(running_var.dtype()), momentum);
      }
      if (batches_tracked.defined()) batches_tracked.add_(1);
    }

    at::Tensor mean_f = mean.to(input.scalar_type()).view(shape);
    at::Tensor invstd_f = invstd.to(input.scalar_type()).view(shape);
    at::Tensor normalized = (input - mean_f) * invstd_f;
    at::Tensor output = normalized;
    if (weight.defined()) output = output * weight.view(shape) + bias.view(shape);
    ctx->save_for_backward({input, weight, mean_f, invstd_f});
    ctx->saved_data["total"] = total;
    ctx->saved_data["group"] = reinterpret_cast<std::int64_t>(group);
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double total = ctx->saved_data["total"].toDouble();
    auto* group = reinterpret_cast<c10d::Backend*>(ctx->saved_data["group"].toInt());
    at::Tensor grad_output = grads[0].contiguous();
    const std::int64_t channels = input.size(1);
    std::vector<std::int64_t> reduce_dims{0};
    for (std::int64_t d = 2; d < input.dim(); ++d) reduce_dims.push_back(d);

    at::Tensor centered = input - mean;
    at::Tensor sum_dy = grad_output.sum(reduce_dims);
    at::Tensor sum_dy_xmu = (grad_output * centered).sum(reduce_dims);
    at::Tensor grad_weight, grad_bias;
    if (weight.defined()) {
      grad_weight = sum_dy_xmu * invstd.view({channels});
      grad_bias = sum_dy;
    }
    // The input gradient sees every rank's loss through the shared statistics.
    std::vector<at::Tensor> sums{at::cat({sum_dy, sum_dy_xmu}).to(at::kDouble)};
    {
      CollectiveWait wait;
      group->allreduce(sums)->wait();
    }
    at::Tensor global = sums[0].to(input.scalar_type());
    std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
    shape[1] = channels;
    at::Tensor mean_dy = (global.narrow(0, 0, channels) / total).view(shape);
    at::Tensor mean_dy_xmu = (global.narrow(0, channels, channels) / total).view(shape);
    at::Tensor scale = weight.defined() ? invstd * weight.view(shape) : invstd;
    at::Tensor grad_input = (grad_output - mean_dy - centered * invstd * invstd * mean_dy_xmu) * scale;
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(),   at::Tensor(),  at::Tensor()};
  }
};

// Runs one BatchNorm layer, synchronised while training.
template <typename Layer>
at::Tensor run_layer(Layer& layer, const at::Tensor& input, c10d::Backend* group) {
  if (!layer.is_training()) return layer.forward(input);
  const auto& options = layer.options;
  if (!options.momentum()) {
    throw Error("sync_batchnorm needs BatchNorm layers with a momentum (not a cumulative average)");
  }
  return SyncBatchNormFunction::apply(input, layer.weight, layer.bias, layer.running_mean,
                                      layer.running_var, layer.num_batches_tracked, options.eps(),
                                      *options.momentum(), group);
}

bool is_batch_norm(const std::shared_ptr<torch::nn::Module>& module) {
  return std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module) ||
         std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module) ||
         std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module);
}

}  // namespace

std::optional<std::function<torch::Tensor(const torch::Tensor&)>> sync_batch_norm_forward(
    const Block& block, c10::intrusive_ptr<c10d::Backend> group) {
  bool has_batch_norm = false;
  for (const auto& module : block.module->modules(/*include_self=*/true)) {
    if (is_batch_norm(module)) has_batch_norm = true;
  }
  if (!has_batch_norm) return std::nullopt;
  auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(block.module);
  if (!sequential) {
    throw Error("sync_batchnorm: block '" + block.name +
                "' has BatchNorm layers but is not a torch::nn::Sequential");
  }
  for (const auto& child : sequential->children()) {
    for (const auto& nested : child->modules(/*include_self=*/false)) {
      if (is_batch_norm(nested)) {
        throw Error("sync_batchnorm: block '" + block.name +
                    "' nests a BatchNorm inside another module; only direct layers are synchronised");
      }
    }
  }
  return [sequential, group](const torch::Tensor& input) {
    at::Tensor x = input;
    for (auto& layer : *sequential) {
      auto module = layer.ptr();
      if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module)) {
        x = run_layer(*bn, x, group.get());
      } else if (auto bn2 = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module)) {
        x = run_layer(*bn2, x, group.get());
      } else if (auto bn3 = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(module)) {
        x = run_layer(*bn3, x, group.get());
      } else {
        x = layer.forward<torch::Tensor>(x);
      }
    }
    return x;
  };
}

bool has_batch_norm(torch::nn::Module& module) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (is_batch_norm(child)) return true;
  }
  return false;
}

}  // namespace trainyard
