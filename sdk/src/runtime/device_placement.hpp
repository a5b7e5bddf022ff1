#pragma once
// Which device this rank computes on, and the device plugin that drives it.

#include <c10/core/Device.h>

#include <memory>
#include <optional>

#include "run_options.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard {

class DeviceBackend;

struct DevicePlacement {
  std::shared_ptr<DeviceBackend> backend;
  int index = 0;
  c10::Device device = c10::Device(c10::kCPU);

  // The device `run.device` names ("auto": the available device whose backend prefers itself
  // most, DeviceBackend::auto_preference). In a multi-process run (`local_rank` set) the backend
  // may give each rank of a machine its own device (DeviceBackend::device_for_local_rank).
  // Throws Error, located at run.device, for an unknown, unavailable or absent device.
  static DevicePlacement choose(const RunOptions& run, const Registry& registry,
                                std::optional<int> local_rank, const BuildContext& build);

  // Makes `device` the calling thread's current device of its type (through c10's device guard),
  // so that what is created on the index-less device or on the current device lands on this
  // rank's device, as a torchrun script arranges by setting the device of its local rank.
  // Nothing for the CPU.
  void make_current() const;
};

}  // namespace trainyard
