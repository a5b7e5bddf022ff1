#include "nvml.hpp"

#include <dlfcn.h>

namespace trainyard {
namespace {

// The few NVML declarations used here, as nvml.h spells them (its ABI is stable across driver
// releases: the _v2 names are the current entry points), so building needs no NVML header.
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// The symbol `name` of `handle` as a function of type `Function`, or null.
template <typename Function>
Function* symbol(void* handle, const char* name) {
  return reinterpret_cast<Function*>(::dlsym(handle, name));
}

}  // namespace

struct Nvml::Functions {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_pci_bus_id)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization_rates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*) = nullptr;

  bool complete() const {
    return init && shutdown && handle_by_index && handle_by_pci_bus_id && utilization_rates &&
           memory_info;
  }
};

std::unique_ptr<Nvml> Nvml::open(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    ::dlerror();  // leave no pending error behind for others' dlerror()
    return nullptr;
  }
  auto functions = std::make_unique<Functions>();
  functions->init = symbol<nvmlReturn_t()>(handle, "nvmlInit_v2");
  functions->shutdown = symbol<nvmlReturn_t()>(handle, "nvmlShutdown");
  functions->handle_by_index =
      symbol<nvmlReturn_t(unsigned int, nvmlDevice_t*)>(handle, "nvmlDeviceGetHandleByIndex_v2");
  functions->handle_by_pci_bus_id =
      symbol<nvmlReturn_t(const char*, nvmlDevice_t*)>(handle, "nvmlDeviceGetHandleByPciBusId_v2");
  functions->utilization_rates = symbol<nvmlReturn_t(nvmlDevice_t, nvmlUtilization_t*)>(
      handle, "nvmlDeviceGetUtilizationRates");
  functions->memory_info =
      symbol<nvmlReturn_t(nvmlDevice_t, nvmlMemory_t*)>(handle, "nvmlDeviceGetMemoryInfo");
  ::dlerror();
  if (!functions->complete() || functions->init() != NVML_SUCCESS) {
    ::dlclose(handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(functions)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Functions> functions)
    : handle_(handle), functions_(std::move(functions)) {}

Nvml::~Nvml() {
  functions_->shutdown();
  ::dlclose(handle_);
}

std::optional<NvmlReading> Nvml::read(const std::string& pci_bus_id, unsigned index) const {
  nvmlDevice_t device = nullptr;
  const nvmlReturn_t found = pci_bus_id.empty()
                                 ? functions_->handle_by_index(index, &device)
                                 : functions_->handle_by_pci_bus_id(pci_bus_id.c_str(), &device);
  if (found != NVML_SUCCESS) return std::nullopt;
  NvmlReading reading;
  nvmlUtilization_t utilization{};
  if (functions_->utilization_rates(device, &utilization) == NVML_SUCCESS) {
    reading.gpu_busy_percent = utilization.gpu;
  }
  nvmlMemory_t memory{};
  if (functions_->memory_info(device, &memory) == NVML_SUCCESS) {
    reading.memory_used_bytes = memory.used;
  }
  return reading;
}

}  // namespace trainyard
