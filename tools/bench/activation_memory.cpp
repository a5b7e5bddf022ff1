// Activation memory of a recipe's model with and without activation checkpointing, measured by
// the allocator (AllocationTracker): the bytes the autograd graph holds after forward and the
// peak during forward and backward, above the parameters, their gradients and the input.
//
//   build/bin/activation_memory recipes/fashion_mnist_cnn.toml [--set k=v ...] [SELECTION ...]
//
// SELECTIONs default to "all" and "every:2"; "none" is always measured as the reference. The
// model, batch, device and precision (autocast) are the recipe's.

#include <ATen/ATen.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/runtime/allocation_tracker.hpp"
#include "trainyard/runtime/engine.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "build_paths.hpp"

namespace {

using namespace trainyard;

struct Footprint {
  std::int64_t held_after_forward = 0;
  std::int64_t peak = 0;
};

Footprint measure(Model& model, const std::vector<Block>& blocks, const Batch& batch,
                  const torch::Device& device, std::optional<torch::ScalarType> autocast) {
  auto step = [&] {
    AutocastGuard guard(device.type(), autocast);
    return model.loss(run_blocks(model, blocks, batch), batch);
  };
  // Gradients exist beforehand and accumulate in place, so only activations are counted.
  step().backward();
  model.module().zero_grad(/*set_to_none=*/false);
  Footprint footprint;
  AllocationTracker tracker;
  torch::Tensor loss = step();
  footprint.held_after_forward = tracker.current_bytes(device.type());
  loss.backward();
  loss.reset();
  footprint.peak = tracker.peak_bytes(device.type());
  return footprint;
}

std::string mib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: activation_memory RECIPE [--set section.key=value ...] [SELECTION ...]\n";
    return 2;
  }
  std::vector<std::string> overrides = {"run.eval=false", "loader.workers=0"};
  std::vector<std::string> selections;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" && i + 1 < argc) {
      overrides.push_back(argv[++i]);
    } else {
      selections.push_back(arg);
    }
  }
  if (selections.empty()) selections = {"all", "every:2"};

  static auto* registry = new Registry();  // plugins stay loaded for the whole process
  PluginLoader loader(*registry);
  loader.load_folder(build_paths::plugin_dir());
  Recipe recipe = load_recipe(argv[1], overrides);
  for (const auto& path : recipe_plugin_paths(recipe)) loader.load_path(path);
  Recipe resolved = resolve_recipe(recipe, *registry);
  auto root = std::make_shared<Table>(*resolved.root);
  root->erase("checkpoint");
  root->set("sinks", Value(std::shared_ptr<const Table>(std::make_shared<Table>())));
  resolved.root = root;

  // The engine reads the batch exactly as training would (any dataset, map or stream).
  Engine engine(resolved, *registry);
  Batch batch = engine.next_micro_batches().front();
  const torch::Device device = engine.device();

  BuildContext build;
  build.device = device;
  build.seed = static_cast<std::uint64_t>(resolved.section("run").get_int("seed"));
  build.recipe_dir = resolved.path.parent_path();
  Config dataset_section = resolved.section("dataset");
  build.data = registry->create<Dataset>(dataset_section.get_string("plugin"), dataset_section, build)
                   ->info();
  Config precision_section = resolved.section("precision");
  const auto autocast = registry->create<Precision>(precision_section.get_string("plugin"),
                                                    precision_section, build)
                            ->autocast_dtype();
  Config model_section = resolved.section("model");
  at::manual_seed(build.seed);
  auto model = registry->create<Model>(model_section.get_string("plugin"), model_section, build);
  model->module().to(device);
  model->module().train();
  const std::vector<Block> blocks = model->blocks();

  std::cout << "recipe " << resolved.name() << ", model " << model_section.get_string("plugin")
            << " (" << blocks.size() << " blocks), batch " << batch.size << ", device "
            << device.str() << ", precision " << precision_section.get_string("plugin") << "\n";
  std::printf("%-22s %22s %22s\n", "checkpointing", "held after forward", "peak fwd+bwd");
  const Footprint none = measure(*model, blocks, batch, device, autocast);
  std::printf("%-22s %22s %22s\n", "none", mib(none.held_after_forward).c_str(),
              mib(none.peak).c_str());
  for (const auto& text : selections) {
    auto selected = with_activation_checkpointing(blocks, ActivationCheckpointing::parse(text));
    const Footprint footprint = measure(*model, selected, batch, device, autocast);
    auto cell = [](std::int64_t bytes, std::int64_t reference) {
      char factor[32];
      std::snprintf(factor, sizeof factor, " (%.2fx less)",
                    bytes > 0 ? static_cast<double>(reference) / static_cast<double>(bytes) : 0.0);
      return mib(bytes) + factor;
    };
    std::printf("%-22s %22s %22s\n", text.c_str(),
                cell(footprint.held_after_forward, none.held_after_forward).c_str(),
                cell(footprint.peak, none.peak).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "activation_memory: error: " << error.what() << "\n";
    return 1;
  }
}
