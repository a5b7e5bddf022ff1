#include "model_export.hpp"

#include <string>

#include "trainyard/distributed.hpp"
#include "trainyard/state.hpp"
#include "trainyard/strategy.hpp"

namespace trainyard {

void export_final_model(const Strategy& strategy, int rank, const std::filesystem::path& file) {
  // Buffers (and, for replicated strategies, the parameters too) come from the strategy's saved
  // state, which may gather as well (a consolidated save): every rank calls both.
  TensorMap parameters = strategy.full_parameters();
  CheckpointState state;
  strategy.save_state(state);
  if (rank != 0) return;
  TensorMap model;
  const std::string prefix = "model.";
  for (const auto& [name, tensor] : state.shared.tensors) {
    if (name.rfind(prefix, 0) == 0) model[name.substr(prefix.size())] = tensor;
  }
  for (auto& [name, tensor] : parameters) model[name] = tensor;
  write_tensor_file(file, model);
}

}  // namespace trainyard
