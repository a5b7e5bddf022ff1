#include "model_export.hpp"

#include <string>

#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/state.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

void export_final_model(const Strategy& strategy, int rank, const std::filesystem::path& file) {
  // Collective: every rank takes part in gathering the state, rank 0 writes it.
  TensorMap model = strategy.full_model_state();
  if (rank != 0) return;
  write_tensor_file(file, model);
}

}  // namespace trainyard
