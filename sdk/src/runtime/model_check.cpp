#include "trainyard/runtime/model_check.hpp"

#include <c10/core/Device.h>

#include <algorithm>
#include <memory>
#include <string>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace trainyard {

namespace {

// Builds the recipe's model on the meta device as the rank that `mesh` places would, and asks
// the recipe's strategy whether it can run it.
void build_on_meta(const Recipe& resolved, const Registry& registry,
                   std::shared_ptr<ProcessMesh> mesh) {
  BuildContext build;
  build.recipe_dir = resolved.path.parent_path();
  build.seed = static_cast<std::uint64_t>(resolved.section("run").get_int("seed"));
  build.rank = mesh->rank();
  build.world_size = mesh->world_size();
  build.mesh = std::move(mesh);
  const Config dataset_section = resolved.section("dataset");
  build.data =
      registry.create<Dataset>(dataset_section.get_string("plugin"), dataset_section, build)
          ->info();
  build.device = c10::Device(c10::kMeta);
  const Config precision_section = resolved.section("precision");
  if (const auto compute =
          registry.create<Precision>(precision_section.get_string("plugin"), precision_section, build)
              ->autocast_dtype()) {
    build.extensions[kComputeDtypeExtension] = *compute;
  }
  const Config model_section = resolved.section("model");
  auto model = registry.create<Model>(model_section.get_string("plugin"), model_section, build);
  const Config strategy_section = resolved.section("strategy");
  registry.create<Strategy>(strategy_section.get_string("plugin"), strategy_section, build)
      ->check_model(*model, build);
}

}  // namespace

void check_model_builds(const Recipe& resolved, const Registry& registry) {
  build_on_meta(resolved, registry, std::make_shared<ProcessMesh>());
}

std::string check_layout_builds(const Recipe& resolved, const Registry& registry,
                                int world_size) {
  const MeshRequest request = mesh_request(resolved.section("parallel"));
  if (world_size <= 0) {
    world_size = request.pp * request.dp_replicate * std::max(request.dp_shard, 1) * request.tp;
  }
  const MeshLayout layout = MeshLayout::resolve(request, world_size);
  // Built as rank 0 builds it: a tensor-parallel split that does not divide fails on every tp
  // rank alike.
  build_on_meta(resolved, registry, std::make_shared<ProcessMesh>(layout, 0));
  return layout.describe();
}

}  // namespace trainyard
