// The `sim` device plugin: trainyard's view of the sim accelerator. Every method is what a
// hardware port implements for its own device; here each one is backed by the sim runtime.

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <mutex>
#include <string>

#include "sim_runtime.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

// An event on the device's stream: recorded and timed by the sim device guard, as a real port's
// events are by its driver.
class SimEvent final : public DeviceEvent {
 public:
  explicit SimEvent(int index)
      : event_(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
        stream_(c10::Stream::DEFAULT, sim::device(index)) {}

  void record() override { event_.record(stream_); }
  double elapsed_ms(const DeviceEvent& later) const override {
    const auto& end = dynamic_cast<const SimEvent&>(later);
    return event_.elapsedTime(end.event_);
  }

 private:
  c10::Event event_;
  c10::Stream stream_;
};

class SimDevice final : public DeviceBackend {
 public:
  bool available() const override { return true; }
  int device_count() const override { return sim::device_count(); }
  torch::Device device(int index) const override { return sim::device(index); }
  // An accelerator: chosen by `run.device = "auto"` over the host CPU when its plugin is loaded.
  int auto_preference() const override { return 1; }
  std::optional<int> device_for_local_rank(int local_rank) const override {
    return local_rank % device_count();
  }
  std::string default_comm() const override { return "sim"; }
  void synchronize(int) override {}
  DeviceMemory memory(int index) const override {
    const sim::MemoryStats stats = sim::memory_stats(index);
    return {stats.allocated_bytes, stats.peak_allocated_bytes, 0};
  }
  void reset_peak_memory(int index) override { sim::reset_peak_memory(index); }
  std::vector<at::ScalarType> fast_compute_dtypes(int) const override { return {at::kFloat}; }
  std::string device_name(int index) const override {
    return "sim device " + std::to_string(index) + " (host memory)";
  }
  std::vector<std::string> doctor_report() const override {
    return {"sim runtime: " + std::to_string(sim::device_count()) +
            " devices (SIM_DEVICE_COUNT), kernels through the CPU"};
  }
  void manual_seed(std::uint64_t seed) override {
    for (int index = 0; index < device_count(); ++index) {
      at::Generator generator = sim::default_generator(index);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(seed);
    }
  }
  void save_rng_state(StateDict& out) const override {
    for (int index = 0; index < device_count(); ++index) {
      out.tensors[state_key(index)] = rng_state(index);
    }
  }
  void load_rng_state(const StateDict& in) override {
    for (int index = 0; index < device_count(); ++index) {
      auto found = in.tensors.find(state_key(index));
      if (found != in.tensors.end()) set_rng_state(index, found->second);
    }
  }
  torch::Tensor rng_state(int index) const override {
    at::Generator generator = sim::default_generator(index);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }
  void set_rng_state(int index, const torch::Tensor& state) override {
    at::Generator generator = sim::default_generator(index);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }

 protected:
  std::unique_ptr<DeviceEvent> make_event(int index) override {
    return std::make_unique<SimEvent>(index);
  }

 private:
  static std::string state_key(int index) { return "engine.rng.sim." + std::to_string(index); }
};

void register_components(Registry& registry) {
  sim::ensure_registered();
  registry.add<DeviceBackend>(
      "sim", {}, "the sim accelerator (host memory, CPU kernels)",
      [](const Config&, const BuildContext&) { return std::make_unique<SimDevice>(); });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("sim", "1.0.0", trainyard::register_components)
