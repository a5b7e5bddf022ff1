#include "trainyard/models/parameter_init.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <mutex>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

constexpr std::uint64_t kFnvOffset = 14695981039346656037ull;
constexpr std::uint64_t kFnvPrime = 1099511628211ull;

// Draws into `tensor` with `draw(values, generator)` from the stream of `seed`: in place when the
// tensor is a contiguous float32 CPU tensor, otherwise into a float32 CPU tensor of its shape
// that is then copied over, which gives the same values.
template <typename Draw>
void draw_into(const torch::Tensor& tensor, std::uint64_t seed, Draw&& draw) {
  torch::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat && tensor.is_contiguous()) {
    draw(tensor, generator);
    return;
  }
  at::Tensor values = at::empty(tensor.sizes(), at::TensorOptions().dtype(at::kFloat));
  draw(values, generator);
  tensor.copy_(values);
}

std::string joined(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// kaiming_uniform_ with a = sqrt(5) for the weight and U(+-1/sqrt(fan_in)) for the bias: what
// LibTorch's Linear and Conv modules draw in reset_parameters().
void linear_like(const ParameterInit& init, const torch::Tensor& weight, const torch::Tensor& bias,
                 const std::string& prefix) {
  init.kaiming_uniform(weight, joined(prefix, "weight"), std::sqrt(5.0));
  if (!bias.defined()) return;
  const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  init.uniform(bias, joined(prefix, "bias"), -bound, bound);
}

void ones_and_zeros(const ParameterInit& init, const torch::Tensor& weight,
                    const torch::Tensor& bias) {
  if (weight.defined()) init.fill(weight, 1.0);
  if (bias.defined()) init.fill(bias, 0.0);
}

template <typename BatchNorm>
bool batch_norm(const ParameterInit& init, torch::nn::Module& module) {
  auto* norm = dynamic_cast<BatchNorm*>(&module);
  if (!norm) return false;
  ones_and_zeros(init, norm->weight, norm->bias);
  if (norm->running_mean.defined()) init.fill(norm->running_mean, 0.0);
  if (norm->running_var.defined()) init.fill(norm->running_var, 1.0);
  if (norm->num_batches_tracked.defined()) init.fill(norm->num_batches_tracked, 0.0);
  return true;
}

template <typename Conv>
bool conv(const ParameterInit& init, torch::nn::Module& module, const std::string& prefix) {
  auto* layer = dynamic_cast<Conv*>(&module);
  if (!layer) return false;
  linear_like(init, layer->weight, layer->bias, prefix);
  return true;
}

// Initialises the parameters `module` holds itself (not its children's); false when its type
// has no known default.
bool initialize_own(const ParameterInit& init, torch::nn::Module& module,
                    const std::string& prefix) {
  if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    linear_like(init, linear->weight, linear->bias, prefix);
    return true;
  }
  if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    init.normal(embedding->weight, joined(prefix, "weight"), 0.0, 1.0);
    if (auto padding = embedding->options.padding_idx()) {
      torch::NoGradGuard no_grad;
      embedding->weight[*padding].fill_(0);
    }
    return true;
  }
  if (auto* norm = dynamic_cast<torch::nn::LayerNormImpl*>(&module)) {
    ones_and_zeros(init, norm->weight, norm->bias);
    return true;
  }
  if (auto* norm = dynamic_cast<torch::nn::GroupNormImpl*>(&module)) {
    ones_and_zeros(init, norm->weight, norm->bias);
    return true;
  }
  return conv<torch::nn::Conv1dImpl>(init, module, prefix) ||
         conv<torch::nn::Conv2dImpl>(init, module, prefix) ||
         conv<torch::nn::Conv3dImpl>(init, module, prefix) ||
         conv<torch::nn::ConvTranspose1dImpl>(init, module, prefix) ||
         conv<torch::nn::ConvTranspose2dImpl>(init, module, prefix) ||
         conv<torch::nn::ConvTranspose3dImpl>(init, module, prefix) ||
         batch_norm<torch::nn::BatchNorm1dImpl>(init, module) ||
         batch_norm<torch::nn::BatchNorm2dImpl>(init, module) ||
         batch_norm<torch::nn::BatchNorm3dImpl>(init, module);
}

}  // namespace

std::uint64_t parameter_seed(std::uint64_t run_seed, std::string_view name) {
  std::uint64_t hash = kFnvOffset;
  auto mix = [&hash](unsigned char byte) {
    hash ^= byte;
    hash *= kFnvPrime;
  };
  for (int shift = 0; shift < 64; shift += 8) mix(static_cast<unsigned char>(run_seed >> shift));
  for (char c : name) mix(static_cast<unsigned char>(c));
  return (hash ^ (hash >> 32)) & 0xffffffffull;
}

void ParameterInit::normal(const torch::Tensor& tensor, std::string_view name, double mean,
                           double std) const {
  draw_into(tensor, parameter_seed(run_seed_, name),
            [&](const at::Tensor& values, const at::Generator& generator) {
              values.normal_(mean, std, generator);
            });
}

void ParameterInit::uniform(const torch::Tensor& tensor, std::string_view name, double low,
                            double high) const {
  draw_into(tensor, parameter_seed(run_seed_, name),
            [&](const at::Tensor& values, const at::Generator& generator) {
              values.uniform_(low, high, generator);
            });
}

void ParameterInit::kaiming_uniform(const torch::Tensor& tensor, std::string_view name,
                                    double a) const {
  const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(tensor));
  if (fan_in == 0) return;  // an empty tensor: nothing to draw
  const double gain = std::sqrt(2.0 / (1.0 + a * a));
  const double bound = std::sqrt(3.0) * gain / std::sqrt(static_cast<double>(fan_in));
  uniform(tensor, name, -bound, bound);
}

void ParameterInit::fill(const torch::Tensor& tensor, double value) const {
  torch::NoGradGuard no_grad;
  tensor.fill_(value);
}

void ParameterInit::initialize_defaults(torch::nn::Module& module,
                                        const std::string& prefix) const {
  auto visit = [this](torch::nn::Module& child, const std::string& name) {
    if (initialize_own(*this, child, name)) return;
    const auto own = child.named_parameters(/*recurse=*/false);
    if (own.is_empty()) return;
    throw Error("no default initialization is known for module '" + name + "' (" + child.name() +
                "), which holds parameter '" + own.keys().front() +
                "'; initialise it with ParameterInit::normal or uniform under its full name");
  };
  // The module itself may live on the stack: only its children are reached as shared_ptrs.
  visit(module, prefix);
  for (const auto& item : module.named_modules(prefix, /*include_self=*/false)) {
    visit(*item.value(), item.key());
  }
}

GlobalGeneratorGuard::GlobalGeneratorGuard() {
  at::Generator global = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(global.mutex());
  saved_state_ = global.get_state();
}

GlobalGeneratorGuard::~GlobalGeneratorGuard() {
  at::Generator global = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(global.mutex());
  global.set_state(saved_state_);
}

}  // namespace trainyard
