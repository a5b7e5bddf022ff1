#include "layout_plan.hpp"

#include <algorithm>

#include "memory_probe.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace {

// The layout of the recipe's [strategy] and [parallel] on `nproc` processes (0: the product of
// the [parallel] sizes), as a rank of it holds the model.
PlanLayout layout_of(const Recipe& resolved, int nproc, std::string& described) {
  const MeshRequest request = mesh_request(resolved.section("parallel"));
  if (nproc <= 0) {
    nproc = request.pp * request.dp_replicate * std::max(request.dp_shard, 1) * request.tp;
  }
  const MeshLayout mesh = MeshLayout::resolve(request, nproc);
  const Config strategy = resolved.section("strategy");
  PlanLayout layout;
  layout.strategy = strategy.get_string("plugin");
  if (mesh.size(MeshAxis::kPipeline) > 1 || mesh.size(MeshAxis::kTensor) > 1) {
    throw Error("plan: pipeline and tensor-parallel layouts are not planned yet (pp " +
                std::to_string(mesh.size(MeshAxis::kPipeline)) + ", tp " +
                std::to_string(mesh.size(MeshAxis::kTensor)) +
                "); plan covers data-parallel layouts");
  }
  // How the strategy holds the model, from the options it declares: units sharded as its
  // `sharding` says, or a replica whose optimizer state `zero1` may shard; the default strategy
  // holds the whole model in one process.
  const std::string name = layout.strategy;
  const int data_ranks = mesh.size(MeshGroup::kData);
  if (name == default_plugins::kStrategy) {
    layout.holding = ModelHolding::kWhole;
    if (nproc != 1) {
      throw Error("plan: " + name + " runs on one rank; choose a data-parallel strategy for " +
                  std::to_string(nproc));
    }
  } else if (strategy.has("sharding") && strategy.has("prefetch")) {
    layout.holding = ModelHolding::kShardedUnits;
    layout.sharding = strategy.get_string("sharding");
    layout.prefetch = strategy.get_bool("prefetch");
    layout.shard_ranks = mesh.size(MeshAxis::kDataShard);
  } else if (strategy.has("zero1")) {
    layout.holding = ModelHolding::kReplicated;
    layout.zero1 = strategy.get_bool("zero1");
    layout.shard_ranks = data_ranks;
  } else {
    throw Error("plan: strategy '" + name +
                "' declares neither 'sharding' nor 'zero1': plan cannot tell how it holds the "
                "model");
  }
  layout.micro_batch = resolved.section("loader").get_int("batch_size");
  layout.accumulation = resolved.section("run").get_int("grad_accumulation");
  described = name +
              (layout.holding == ModelHolding::kShardedUnits ? " (" + layout.sharding + ")" : "") +
              (layout.zero1 ? " (zero1)" : "") + " on " + mesh.describe() + ", micro-batch " +
              std::to_string(layout.micro_batch);
  return layout;
}

}  // namespace

LayoutPlan plan_layout(const std::filesystem::path& recipe,
                       const std::vector<std::string>& overrides, int nproc,
                       const Registry& registry) {
  const Recipe resolved = resolve_recipe(load_recipe(recipe, overrides), registry);
  LayoutPlan plan;
  plan.layout = layout_of(resolved, nproc, plan.described);
  const ModelFootprint footprint =
      probe_model(recipe, overrides, plan.layout.micro_batch, registry);
  plan.memory = plan_memory(footprint, plan.layout);
  return plan;
}

}  // namespace trainyard
