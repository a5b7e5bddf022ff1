#include "trainyard/runtime/model_check.hpp"

#include <c10/core/Device.h>

#include <memory>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace trainyard {

void check_model_builds(const Recipe& resolved, const Registry& registry) {
  BuildContext build;
  build.recipe_dir = resolved.path.parent_path();
  build.seed = static_cast<std::uint64_t>(resolved.section("run").get_int("seed"));
  build.mesh = std::make_shared<ProcessMesh>();
  const Config dataset_section = resolved.section("dataset");
  build.data =
      registry.create<Dataset>(dataset_section.get_string("plugin"), dataset_section, build)
          ->info();
  build.device = c10::Device(c10::kMeta);
  const Config model_section = resolved.section("model");
  registry.create<Model>(model_section.get_string("plugin"), model_section, build);
}

}  // namespace trainyard
