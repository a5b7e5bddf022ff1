#include "device_placement.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trainyard/api/device.hpp"

namespace trainyard {

namespace {

struct DeviceName {
  std::string backend;  // device plugin name
  int index = 0;
};

std::shared_ptr<DeviceBackend> create_backend(const Registry& registry, const std::string& name,
                                              const BuildContext& build) {
  return registry.create<DeviceBackend>(name, Config({}, "device"), build);
}

// The available loaded backend with the highest auto_preference() (ties: by name); the backends
// are asked in that order, so an unavailable accelerator costs no more than its probe.
std::string auto_device(const Registry& registry) {
  struct Candidate {
    std::string name;
    std::shared_ptr<DeviceBackend> backend;
    int preference = 0;
  };
  std::vector<Candidate> candidates;
  BuildContext probe;
  for (const auto& name : registry.names("device")) {
    auto backend = create_backend(registry, name, probe);
    const int preference = backend->auto_preference();
    candidates.push_back({name, std::move(backend), preference});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.preference > b.preference; });
  for (const auto& candidate : candidates) {
    if (candidate.backend->available()) return candidate.name;
  }
  return {};
}

std::string known_devices(const Registry& registry) {
  std::string known;
  for (const auto& device : registry.names("device")) {
    known += (known.empty() ? "" : ", ") + device;
  }
  return known.empty() ? "none loaded" : known;
}

DeviceName parse_device(const Config& run, const std::string& text, const Registry& registry) {
  if (text == "auto") {
    DeviceName name{auto_device(registry), 0};
    if (name.backend.empty()) {
      run.fail("device", "is 'auto', but no loaded device plugin has an available device (known: " +
                             known_devices(registry) + ")");
    }
    return name;
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
    run.fail("device", "names an unknown device '" + name.backend + "' (known: " +
                           known_devices(registry) + ")");
  }
  return name;
}

}  // namespace

DevicePlacement DevicePlacement::choose(const RunOptions& run, const Registry& registry,
                                        std::optional<int> local_rank, const BuildContext& build) {
  const Config& section = run.section;
  DeviceName name = parse_device(section, run.device, registry);
  DevicePlacement placement;
  placement.backend = create_backend(registry, name.backend, build);
  if (!placement.backend->available()) {
    section.fail("device", "names '" + run.device + "', which is not available on this machine");
  }
  placement.index = name.index;
  if (local_rank) {
    if (auto own = placement.backend->device_for_local_rank(*local_rank)) placement.index = *own;
  }
  if (placement.index >= placement.backend->device_count()) {
    section.fail("device", "names device index " + std::to_string(placement.index) + " but only " +
                               std::to_string(placement.backend->device_count()) + " are present");
  }
  placement.device = placement.backend->device(placement.index);
  return placement;
}

void DevicePlacement::make_current() const {
  if (device.is_cpu() || !device.has_index() || !c10::impl::hasDeviceGuardImpl(device.type())) {
    return;
  }
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

}  // namespace trainyard
