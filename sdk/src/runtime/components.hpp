#pragma once
// The plugins a run trains with, built from the recipe's sections in a fixed order (dataset,
// precision, optimizer, scheduler, strategy), and what the strategy builds its model from.

#include <map>
#include <memory>
#include <string>

#include "trainyard/api/build_context.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

class Dataset;
class LrScheduler;
class GradientCompression;

struct Components {
  std::shared_ptr<Dataset> dataset;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<LrScheduler> scheduler;
  std::shared_ptr<Strategy> strategy;
  std::shared_ptr<GradientCompression> compression;  // null without [compression]
  double base_lr = 0;  // the optimizer's learning rate, which the scheduler scales
  // FLOPs per sample of the first model the strategy builds (0 until then, or unknown).
  std::shared_ptr<double> flops_per_sample = std::make_shared<double>(0);
  // The first model's export_files(), which every checkpoint saves.
  std::shared_ptr<std::map<std::string, std::string>> export_files =
      std::make_shared<std::map<std::string, std::string>>();

  // Builds every component; sets `build.data` from the dataset before the others see it.
  static Components build(const Recipe& recipe, const Registry& registry, BuildContext& build);

  // What the strategy builds from: the model factory (the recipe's [model], built with whatever
  // context the strategy passes), the optimizer, the precision and `build`. The caller adds the
  // device backend, the step options and the phase clock.
  StrategyContext strategy_context(const Recipe& recipe, const Registry& registry,
                                   const BuildContext& build) const;
};

}  // namespace trainyard
