// The out-of-line members of the strategy interface, which every strategy plugin links.
#include "trainyard/api/strategy.hpp"

#include <string>
#include <vector>

#include "trainyard/runtime/optimizer_step_gate.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

TensorMap Strategy::full_model_state() const {
  // Buffers (and, for replicated strategies, the parameters too) come from the strategy's saved
  // state, which may gather as well (a consolidated save): every rank calls both.
  TensorMap parameters = full_parameters();
  CheckpointState state;
  save_state(state);
  TensorMap model;
  const std::string prefix = "model.";
  for (const auto& [name, tensor] : state.shared.tensors) {
    if (name.rfind(prefix, 0) == 0) model[name.substr(prefix.size())] = tensor;
  }
  for (auto& [name, tensor] : parameters) model[name] = tensor;
  return model;
}

std::string Strategy::describe_layout() const { return {}; }

std::vector<torch::Tensor> Strategy::optimizer_stepped_tensors() const { return {}; }

void Strategy::check_model(Model& /*model*/, const BuildContext& /*build*/) const {}

void StrategyContext::before_optimizer_step() const {
  if (optimizer_step_gate) optimizer_step_gate->enter();
}

}  // namespace trainyard
