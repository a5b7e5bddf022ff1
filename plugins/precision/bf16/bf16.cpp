// bfloat16 autocast: forward and loss in bfloat16 where autocast deems it safe; parameters,
// gradients and optimizer state stay float32. bfloat16 has float32's exponent range, so no loss
// scaling is needed.

#include "trainyard/api/device.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"

namespace trainyard {
namespace {

class Bf16 final : public Precision {
 public:
  explicit Bf16(std::shared_ptr<DeviceBackend> device_backend)
      : device_backend_(std::move(device_backend)) {}
  // bfloat16 must be one of the dtypes the device computes natively (a GPU without it would
  // emulate it at a fraction of the speed); the host CPU's autocast runs it on any CPU.
  void check_device(const torch::Device& device) const override {
    check_native_dtype("bf16", device, torch::kBFloat16, device_backend_.get(), "fp16' or 'fp32");
  }
  std::optional<torch::ScalarType> autocast_dtype() const override { return torch::kBFloat16; }

 private:
  std::shared_ptr<DeviceBackend> device_backend_;
};

void register_components(Registry& registry) {
  registry.add<Precision>("bf16", {},
                          "bfloat16 autocast around forward and loss; float32 master weights "
                          "and optimizer state",
                          [](const Config&, const BuildContext& context) {
                            return std::make_unique<Bf16>(context.device_backend);
                          });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("bf16", "1.0.0", trainyard::register_components)
