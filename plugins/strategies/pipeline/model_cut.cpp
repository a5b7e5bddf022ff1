#include "model_cut.hpp"

#include "trainyard/api/error.hpp"

namespace trainyard {

std::vector<std::string> cuttable_block_names(Model& model, int ranks, std::int64_t virtual_stages,
                                              bool stages_named) {
  if (!model.builds_stages()) {
    throw Error("pipeline: model '" + model.module().name() +
                "' does not build stages (Model::builds_stages), so it cannot be cut; use ddp "
                "or fsdp");
  }
  std::vector<std::string> names = model.block_names();
  const auto stage_count = static_cast<std::int64_t>(ranks) * virtual_stages;
  if (!stages_named && static_cast<std::int64_t>(names.size()) < stage_count) {
    throw Error("pipeline: model '" + model.module().name() + "' has " +
                std::to_string(names.size()) + " blocks, fewer than the " +
                std::to_string(stage_count) + " stages (pp " + std::to_string(ranks) +
                " x virtual_stages " + std::to_string(virtual_stages) +
                "); lower pp or virtual_stages");
  }
  return names;
}

}  // namespace trainyard
