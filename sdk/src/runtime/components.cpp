#include "components.hpp"

#include "trainyard/api/dataset.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/api/scheduler.hpp"

namespace trainyard {

namespace {

template <typename Kind>
std::shared_ptr<Kind> create(const Recipe& recipe, const Registry& registry,
                             const std::string& name, const BuildContext& build) {
  const Config section = recipe.section(name);
  return registry.create<Kind>(section.get_string("plugin"), section, build);
}

}  // namespace

Components Components::build(const Recipe& recipe, const Registry& registry, BuildContext& build) {
  Components built;
  built.dataset = create<Dataset>(recipe, registry, "dataset", build);
  build.data = built.dataset->info();
  built.precision = create<Precision>(recipe, registry, "precision", build);
  built.precision->check_device(build.device);
  if (const auto compute = built.precision->autocast_dtype()) {
    build.extensions[kComputeDtypeExtension] = *compute;
  }
  built.optimizer = create<Optimizer>(recipe, registry, "optimizer", build);
  built.base_lr = built.optimizer->learning_rate();
  built.scheduler = create<LrScheduler>(recipe, registry, "scheduler", build);
  built.strategy = create<Strategy>(recipe, registry, "strategy", build);
  if (recipe.has_section("compression")) {
    built.compression = create<GradientCompression>(recipe, registry, "compression", build);
  }
  return built;
}

StrategyContext Components::strategy_context(const Recipe& recipe, const Registry& registry,
                                             const BuildContext& build) const {
  StrategyContext context;
  const Registry* models = &registry;
  const Config model_section = recipe.section("model");
  std::shared_ptr<double> flops = flops_per_sample;
  auto files = export_files;
  context.make_model = [models, model_section, flops, files](const BuildContext& model_build) {
    auto model =
        models->create<Model>(model_section.get_string("plugin"), model_section, model_build);
    if (*flops == 0) *flops = model->flops_per_sample();
    if (files->empty()) *files = model->export_files();
    return model;
  };
  context.optimizer = optimizer;
  context.precision = precision;
  context.compression = compression;
  context.communicator = build.communicator;
  context.build = build;
  return context;
}

}  // namespace trainyard
