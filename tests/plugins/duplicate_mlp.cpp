// A plugin that registers a model named "mlp" again: loading it next to the bundled plugins
// must fail with a duplicate error naming both libraries.

#include "trainyard/api/model.hpp"
#include "trainyard/api/plugin.hpp"

namespace {

void register_components(trainyard::Registry& registry) {
  registry.add<trainyard::Model>("mlp", {}, "a second mlp",
                                 [](const trainyard::Config&, const trainyard::BuildContext&)
                                     -> std::unique_ptr<trainyard::Model> { return nullptr; });
}

}  // namespace

TRAINYARD_PLUGIN("duplicate_mlp", "1.0.0", register_components)
