#include "resnet_weights.hpp"

#include <ATen/ATen.h>

#include "trainyard/api/error.hpp"

namespace trainyard::resnet {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// BatchNorm's counter is the only integer tensor of the state_dict.
bool holds_integers(const std::string& name) {
  const std::string counter = "num_batches_tracked";
  return name.size() >= counter.size() &&
         name.compare(name.size() - counter.size(), counter.size(), counter) == 0;
}

bool is_integer_dtype(const std::string& dtype) {
  return dtype.front() == 'I' || dtype.front() == 'U' || dtype == "BOOL";
}

}  // namespace

void check_weights_match(const PretrainedWeights& weights, const TensorShapes& expected,
                         const std::map<std::string, std::string>& notes) {
  const std::string where = "weights " + weights.location().string() + ": ";
  for (const auto& [name, shape] : expected) {
    if (!weights.contains(name)) {
      throw Error(where + "tensor '" + name + "' of shape " + shape_text(shape) + " is missing");
    }
    const PretrainedWeights::TensorInfo& info = weights.info(name);
    if (info.shape != shape) {
      auto note = notes.find(name);
      throw Error(where + "tensor '" + name + "' has shape " + shape_text(info.shape) +
                  " but the model makes it " + shape_text(shape) +
                  (note == notes.end() ? "" : " (" + note->second + ")"));
    }
    if (is_integer_dtype(info.dtype) != holds_integers(name)) {
      throw Error(where + "tensor '" + name + "' is stored as " + info.dtype + ", expected " +
                  (holds_integers(name) ? "an integer" : "a floating-point") + " dtype");
    }
  }
  for (const auto& [name, info] : weights.tensors()) {
    if (!expected.count(name)) {
      throw Error(where + "tensor '" + name + "' (in " + info.file.filename().string() +
                  ") is not a parameter or buffer of the configured model");
    }
  }
}

void load_block(const PretrainedWeights& weights, torch::nn::Module& block,
                const std::string& prefix) {
  at::NoGradGuard no_grad;
  auto copy_in = [&](const std::string& name, const torch::Tensor& tensor) {
    tensor.copy_(weights.read(prefix + name, tensor.scalar_type()));
  };
  for (const auto& item : block.named_parameters(/*recurse=*/true))
    copy_in(item.key(), item.value());
  for (const auto& item : block.named_buffers(/*recurse=*/true)) copy_in(item.key(), item.value());
}

}  // namespace trainyard::resnet
