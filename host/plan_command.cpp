#include "plan_command.hpp"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "cli.hpp"
#include "memory_plan.hpp"
#include "memory_probe.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace po = boost::program_options;

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
  described = name +
              (layout.holding == ModelHolding::kShardedUnits ? " (" + layout.sharding + ")" : "") +
              (layout.zero1 ? " (zero1)" : "") + " on " + mesh.describe() + ", micro-batch " +
              std::to_string(layout.micro_batch);
  return layout;
}

std::string mib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%10.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

nlohmann::json plan_json(const PlannedMemory& plan, const std::string& layout, int ranks) {
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& phase : plan.phases) phases[phase.phase] = phase.bytes;
  return {{"layout", layout},
          {"ranks", ranks},
          {"parameters", plan.parameters},
          {"gradients", plan.gradients},
          {"optimizer_state", plan.optimizer_state},
          {"frozen", plan.frozen},
          {"activations", plan.activations},
          {"gathered_forward", plan.gathered_forward},
          {"forward_held", plan.activations + plan.gathered_forward},
          {"step_start", plan.step_start},
          {"peak", plan.peak.bytes},
          {"peak_phase", plan.peak.phase},
          {"phases", phases}};
}

void print_plan(const PlannedMemory& plan, const std::string& layout) {
  std::cout << "plan: " << layout << "; each rank holds\n"
            << "  parameters        " << mib(plan.parameters) << "\n"
            << "  gradients         " << mib(plan.gradients) << "\n"
            << "  optimizer state   " << mib(plan.optimizer_state) << "\n"
            << "  frozen, buffers   " << mib(plan.frozen) << "\n"
            << "  activations       " << mib(plan.activations) << "  (one micro-batch)\n"
            << "  gathered, forward " << mib(plan.gathered_forward)
            << "  (whole parameters a forward leaves gathered)\n"
            << "  at a step's start " << mib(plan.step_start) << "\n"
            << "  peak              " << mib(plan.peak.bytes) << "  in the " << plan.peak.phase
            << " phase\n  by phase:";
  for (const auto& phase : plan.phases) std::cout << " " << phase.phase << " " << mib(phase.bytes);
  std::cout << "\n";
}

}  // namespace

int command_plan(const std::vector<std::string>& args, Registry& registry) {
  CommonOptions common;
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc = 0;
  bool json = false;
  po::options_description options("plan options");
  options.add_options()("recipe", po::value(&recipe_path)->required(), "recipe file")(
      "set", po::value(&overrides)->composing(), "override a recipe value: section.key=value")(
      "nproc", po::value(&nproc),
      "the processes the run will have (default: the product of the [parallel] sizes)")(
      "json", po::bool_switch(&json), "print the plan as JSON");
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("recipe", 1);
  auto values = parse(args, options, positional, "usage: trainyard plan RECIPE [options]");
  if (!values) return 0;
  if (values->count("nproc") && nproc < 1) {
    throw Error("plan: --nproc must be at least 1 (got " + std::to_string(nproc) + ")");
  }

  const Recipe recipe = load_recipe(recipe_path, overrides);
  PluginLoader loader(registry);
  load_plugins(loader, common, recipe_plugin_paths(recipe));
  const Recipe resolved = resolve_recipe(recipe, registry);
  std::string described;
  const PlanLayout layout = layout_of(resolved, nproc, described);
  const ModelFootprint footprint =
      probe_model(recipe_path, overrides, layout.micro_batch, registry);
  const PlannedMemory plan = plan_memory(footprint, layout);
  if (json) {
    std::cout << plan_json(plan, described, std::max(nproc, 1)).dump(2) << "\n";
  } else {
    print_plan(plan, described);
  }
  return 0;
}

}  // namespace trainyard
