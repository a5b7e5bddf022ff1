#include "group_resize.hpp"

#include "trainyard/api/config.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {
namespace {

// The recipe as the ranks will read it: the file and its --set overrides, in order.
Recipe recipe_of(const std::vector<std::string>& run_args) {
  if (run_args.empty()) throw Error("launch: no recipe given");
  std::vector<std::string> overrides;
  for (std::size_t i = 1; i < run_args.size(); ++i) {
    const std::string& arg = run_args[i];
    if (arg == "--set" && i + 1 < run_args.size()) {
      overrides.push_back(run_args[++i]);
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    }
  }
  return load_recipe(run_args.front(), overrides);
}

int data_parallel_size(const MeshRequest& request, int world_size) {
  return MeshLayout::resolve(request, world_size).size(MeshGroup::kData);
}

}  // namespace

GroupSize resize_group(const std::vector<std::string>& run_args, int planned_world, int survivors,
                       int minimum) {
  const Recipe recipe = recipe_of(run_args);
  const Config run = recipe.section("run");
  const std::int64_t planned_accumulation =
      run.has("grad_accumulation") ? run.get_int("grad_accumulation") : 1;
  const MeshRequest request = mesh_request(recipe.section("parallel"));
  const std::int64_t planned_dp = data_parallel_size(request, planned_world);
  std::string reason;
  for (int world = survivors; world >= minimum && world >= 1; --world) {
    std::int64_t dp = 0;
    try {
      dp = data_parallel_size(request, world);
    } catch (const Error& error) {
      reason = error.what();
      continue;
    }
    const std::int64_t micro_batches = planned_dp * planned_accumulation;
    if (micro_batches % dp != 0) {
      reason = std::to_string(planned_dp) + " data-parallel ranks x grad_accumulation " +
               std::to_string(planned_accumulation) + " is not a multiple of " +
               std::to_string(dp) + " data-parallel ranks";
      continue;
    }
    return {world, micro_batches / dp};
  }
  throw Error("launch: cannot keep the global batch on " + std::to_string(minimum) + " to " +
              std::to_string(survivors) + " ranks: " + reason);
}

}  // namespace trainyard
