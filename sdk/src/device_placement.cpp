#include "device_placement.hpp"

#include <string>

#include "trainyard/device.hpp"

namespace trainyard {

namespace {

struct DeviceName {
  std::string backend;  // device plugin name ("cpu", "cuda")
  int index = 0;
};

DeviceName parse_device(const Config& run, const std::string& text, const Registry& registry) {
  if (text == "auto") {
    if (registry.contains("device", "cuda")) {
      BuildContext probe;
      auto cuda = registry.create<DeviceBackend>("cuda", Config({}, "device"), probe);
      if (cuda->available()) return {"cuda", 0};
    }
    return {"cpu", 0};
  }
  DeviceName name;
  auto colon = text.find(':');
  name.backend = text.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      name.index = std::stoi(text.substr(colon + 1));
    } catch (const std::exception&) {
      run.fail("device", "has a bad device index: '" + text + "'");
    }
  }
  if (!registry.contains("device", name.backend)) {
    std::string known;
    for (const auto& device : registry.names("device")) {
      known += (known.empty() ? "" : ", ") + device;
    }
    run.fail("device", "names an unknown device '" + name.backend + "' (known: " + known + ")");
  }
  return name;
}

}  // namespace

DevicePlacement DevicePlacement::choose(const RunOptions& run, const Registry& registry,
                                        std::optional<int> local_rank, const BuildContext& build) {
  const Config& section = run.section;
  DeviceName name = parse_device(section, run.device, registry);
  if (local_rank && name.backend == "cuda") name.index = *local_rank;
  DevicePlacement placement;
  placement.index = name.index;
  placement.backend = registry.create<DeviceBackend>(name.backend, Config({}, "device"), build);
  if (!placement.backend->available()) {
    section.fail("device", "names '" + run.device + "', which is not available on this machine");
  }
  if (placement.index >= placement.backend->device_count()) {
    section.fail("device", "names device index " + std::to_string(placement.index) + " but only " +
                               std::to_string(placement.backend->device_count()) + " are present");
  }
  placement.device = placement.backend->device(placement.index);
  return placement;
}

}  // namespace trainyard
