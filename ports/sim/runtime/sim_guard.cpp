// The device guard: current device, streams and events. Sim kernels run synchronously on the
// calling thread, so a stream is an ordering label only, and an event is the time it was recorded.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

#include "sim_device_state.hpp"
#include "sim_runtime.hpp"

namespace sim {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  Clock::time_point recorded;
};

class SimGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }

  c10::Device exchangeDevice(c10::Device next) const override {
    const c10::Device previous = getDevice();
    if (next.index() != previous.index()) setDevice(next);
    return previous;
  }
  c10::Device getDevice() const override {
    return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device())};
  }
  void setDevice(c10::Device next) const override {
    if (next.index() >= 0) set_current_device(next.index());
  }
  void uncheckedSetDevice(c10::Device next) const noexcept override {
    if (next.index() >= 0 && next.index() < device_count()) set_current_device(next.index());
  }

  // One stream per device: work is issued in order and completes before the call returns.
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new Event{};
    static_cast<Event*>(*event)->recorded = Clock::now();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "sim: elapsed time needs two recorded events");
    const auto from = static_cast<Event*>(start)->recorded;
    const auto to = static_cast<Event*>(end)->recorded;
    return std::chrono::duration<double, std::milli>(to - from).count();
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, SimGuard)

}  // namespace sim
