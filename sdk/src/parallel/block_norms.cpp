#include "trainyard/parallel/block_norms.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>

#include "trainyard/api/error.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

ParameterBlocks::ParameterBlocks(Model& model) : names_(model.block_names()) {
  std::vector<at::Tensor> parameters;
  std::vector<std::string> whole_names;
  for (const auto& named : model.module().named_parameters(true)) {
    for (const ParameterPiece& piece : model.parameter_layout(named.key(), named.value())) {
      parameters.push_back(named.value());
      whole_names.push_back(piece.name);
    }
  }
  add(model, parameters, whole_names);
}

std::int64_t ParameterBlocks::block_index(const std::string& block) const {
  const auto at = std::find(names_.begin(), names_.end(), block);
  if (at == names_.end()) throw Error("block '" + block + "' is not among the model's blocks");
  return static_cast<std::int64_t>(at - names_.begin());
}

void ParameterBlocks::add(Model& model, const std::vector<at::Tensor>& parameters,
                          const std::vector<std::string>& whole_names) {
  if (names_.empty()) names_ = model.block_names();
  std::unordered_map<const void*, std::int64_t> block_of_tensor;
  for (const Block& block : model.blocks()) {
    const std::int64_t index = block_index(block.name);
    for (const auto& parameter : block.module->parameters(true)) {
      block_of_tensor.emplace(parameter.unsafeGetTensorImpl(), index);  // the first block's
    }
  }
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto found = block_of_tensor.find(parameters[i].unsafeGetTensorImpl());
    if (found != block_of_tensor.end()) {
      block_of_.emplace(whole_names[i], found->second);
    } else if (parameters[i].requires_grad()) {
      throw Error("parameter '" + whole_names[i] + "' is in no block: its gradient norm has none");
    }
  }
  for (const TiedParameter& tied : model.tied_parameters()) {
    if (!tied.blocks.empty()) block_of_[tied.name] = block_index(tied.blocks.front());
  }
}

std::int64_t ParameterBlocks::index(const std::string& parameter) const {
  const auto found = block_of_.find(parameter);
  if (found == block_of_.end()) throw Error("parameter '" + parameter + "' belongs to no block");
  return found->second;
}

at::Tensor block_squares(const std::vector<at::Tensor>& gradients,
                         const std::vector<HeldLayout>& layouts, const ParameterBlocks& blocks,
                         const std::function<bool(std::size_t, const ParameterPiece&)>& is_split,
                         const at::Device& device, const std::function<bool(std::size_t)>& skip) {
  at::Tensor squares = at::zeros({2, blocks.count()}, at::TensorOptions(at::kFloat).device(device));
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    if (!gradients[i].defined() || (skip && skip(i))) continue;
    const at::Tensor flat = gradients[i].detach().reshape({-1});
    for (const ParameterPiece& piece : layouts.at(i)) {
      const at::Tensor part = flat.narrow(0, piece.offset, piece.length).to(at::kFloat);
      const std::int64_t row = is_split && is_split(i, piece) ? 0 : 1;
      squares[row][blocks.index(piece.name)] += part.square().sum().to(device);
    }
  }
  return squares;
}

void set_block_norms(const at::Tensor& squares, const ParameterBlocks& blocks, StepResult& result) {
  result.block_grad_norms = squares.clamp_min(0).sqrt();
  result.block_names = blocks.names();
}

}  // namespace trainyard
