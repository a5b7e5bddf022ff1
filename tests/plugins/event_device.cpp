// A device backend on the host whose events are this library's own classes, for the tests that
// objects a plugin hands out keep its library loaded after the backend and the registry are gone.

#include <atomic>
#include <chrono>

#include "trainyard/api/device.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

// Ticks of a counter shared by every event of the library: an event's code and data both live
// here, so calling one after the library is unloaded would crash.
std::atomic<std::int64_t> ticks{0};

class TickEvent final : public DeviceEvent {
 public:
  void record() override { tick_ = ++ticks; }
  double elapsed_ms(const DeviceEvent& later) const override {
    return static_cast<double>(dynamic_cast<const TickEvent&>(later).tick_ - tick_);
  }

 private:
  std::int64_t tick_ = 0;
};

class EventDevice final : public DeviceBackend {
 public:
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int) const override { return torch::kCPU; }
  void synchronize(int) override {}
  DeviceMemory memory(int) const override { return {}; }
  void manual_seed(std::uint64_t) override {}
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override { return std::make_unique<TickEvent>(); }
};

void register_components(Registry& registry) {
  registry.add<DeviceBackend>(
      "test_events", {}, "the host, with events counted in ticks",
      [](const Config&, const BuildContext&) { return std::make_unique<EventDevice>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("test_events", "1.0.0", trainyard::register_components)
