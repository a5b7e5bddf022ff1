// Full precision: no autocast, no loss scaling.

#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"

namespace trainyard {
namespace {

class Fp32 final : public Precision {
 public:
  std::optional<torch::ScalarType> autocast_dtype() const override { return std::nullopt; }
};

void register_components(Registry& registry) {
  registry.add<Precision>("fp32", {}, "float32 throughout (the default)",
                          [](const Config&, const BuildContext&) {
                            return std::make_unique<Fp32>();
                          });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("fp32", "1.0.0", trainyard::register_components)
