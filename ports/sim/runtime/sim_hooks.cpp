// What ATen asks of an accelerator it does not know: availability, generators, pinned memory.

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>

#include "sim_device_state.hpp"
#include "sim_generator.hpp"
#include "sim_runtime.hpp"

namespace sim {
namespace {

class SimHooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(current_device());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const int previous = current_device();
    set_current_device(index);
    return static_cast<c10::DeviceIndex>(previous);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index < 0 ? current_device() : index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<SimGenerator>(index < 0 ? current_device() : index,
                                            c10::default_rng_seed_val);
  }
  // Sim memory is host memory; which device a pointer belongs to is not recorded.
  at::Device getDeviceFromPtr(void*) const override { return device(current_device()); }
  // Host memory is what a sim copy reads anyway: page-locking would buy nothing.
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
};

// Registered when the library loads, like the allocator and the guard.
const bool hooks_registered = [] {
  static SimHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace
}  // namespace sim
