// A plugin whose factory throws: the registry must report it as an error, not crash.

#include <stdexcept>

#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace {

void register_components(trainyard::Registry& registry) {
  registry.add<trainyard::MetricsSink>(
      "throwing", {}, "a sink whose factory throws",
      [](const trainyard::Config&, const trainyard::BuildContext&)
          -> std::unique_ptr<trainyard::MetricsSink> {
        throw std::runtime_error("the factory of this plugin always throws");
      });
}

}  // namespace

TRAINYARD_PLUGIN("throwing", "1.0.0", register_components)
