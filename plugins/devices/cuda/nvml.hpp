#pragma once
// NVIDIA's management library (NVML), opened at run time: a GPU's utilisation and memory as the
// driver sees them. Machines without the driver's library simply have no readings; nothing here
// throws or prints.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace trainyard {

// What NVML reports for one device; a field is empty when its query failed.
struct NvmlReading {
  // Percent of NVML's last sample period (1/6 s to 1 s, by device) during which a kernel ran.
  std::optional<unsigned> gpu_busy_percent;
  std::optional<std::uint64_t> memory_used_bytes;  // by every process and the driver
};

class Nvml {
 public:
  static constexpr const char* kLibraryName = "libnvidia-ml.so.1";

  // `library` opened and initialised, or null when it cannot be opened, lacks one of the
  // functions used here, or fails to initialise (no driver, no device).
  static std::unique_ptr<Nvml> open(const std::string& library = kLibraryName);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // The device on PCI bus `pci_bus_id` ("0000:3B:00.0", as cudaDeviceGetPCIBusId writes it), or
  // NVML's device `index` when the bus id is empty. Empty when there is no such device.
  std::optional<NvmlReading> read(const std::string& pci_bus_id, unsigned index) const;

 private:
  struct Functions;
  Nvml(void* handle, std::unique_ptr<Functions> functions);
  void* handle_;
  std::unique_ptr<Functions> functions_;
};

}  // namespace trainyard
