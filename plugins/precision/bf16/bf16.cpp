// bfloat16 autocast: forward and loss in bfloat16 where autocast deems it safe; parameters,
// gradients and optimizer state stay float32. bfloat16 has float32's exponent range, so no loss
// scaling is needed.

#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>

#include "trainyard/error.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/precision.hpp"

namespace trainyard {
namespace {

class Bf16 final : public Precision {
 public:
  void check_device(const torch::Device& device) const override {
    const std::string name = device.str();
    if (device.is_cpu()) return;
    if (device.is_cuda()) {
      // Native bfloat16 arithmetic starts with compute capability 8.0 (Ampere); older GPUs
      // would emulate it at a fraction of the speed.
      c10::DeviceGuard guard(device);
      if (!at::detail::getCUDAHooks().supportsBFloat16ConvolutionWithCuDNNv8()) {
        throw Error("precision 'bf16' cannot run on device '" + name +
                    "': it has no native bfloat16 support (compute capability 8.0 or newer); "
                    "use precision 'fp16' or 'fp32'");
      }
      return;
    }
    throw Error("precision 'bf16' cannot run on device '" + name +
                "': bfloat16 autocast is supported on cpu and cuda only");
  }
  std::optional<torch::ScalarType> autocast_dtype() const override { return torch::kBFloat16; }
};

void register_components(Registry& registry) {
  registry.add<Precision>("bf16", {},
                          "bfloat16 autocast around forward and loss; float32 master weights "
                          "and optimizer state",
                          [](const Config&, const BuildContext&) {
                            return std::make_unique<Bf16>();
                          });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("bf16", "1.0.0", trainyard::register_components)
