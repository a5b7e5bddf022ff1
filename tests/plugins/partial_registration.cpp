// A plugin whose register callback adds one component and then throws: loading it must fail
// and leave nothing of it registered.

#include <stdexcept>

#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace {

class QuietSink final : public trainyard::MetricsSink {
 public:
  void write(const trainyard::MetricRecord&) override {}
};

void register_components(trainyard::Registry& registry) {
  registry.add<trainyard::MetricsSink>(
      "partial_first", {}, "registered before the callback fails",
      [](const trainyard::Config&, const trainyard::BuildContext&) {
        return std::make_unique<QuietSink>();
      });
  throw std::runtime_error("registration fails after its first component");
}

}  // namespace

TRAINYARD_PLUGIN("partial_registration", "1.0.0", register_components)
