// The host CPU as a device: steady-clock events, the process's resident memory, its share of the
// cores it may use, and the dtypes the CPU's instruction set makes fast.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/host_cpu.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

class Cpu final : public DeviceBackend {
 public:
  bool available() const override { return true; }
  int device_count() const override { return 1; }
  torch::Device device(int index) const override {
    if (index != 0) throw Error("the cpu device has index 0 only");
    return torch::kCPU;
  }
  // The host is the fallback of `auto`, below any accelerator; the ranks of a machine share it,
  // each bound to CPUs of its own, and meet over Gloo.
  int auto_preference() const override { return 0; }
  std::string default_comm() const override { return "gloo"; }
  void synchronize(int) override {}
  DeviceMemory memory(int) const override {
    DeviceMemory memory;
    long pages = 0, resident = 0;
    std::ifstream statm("/proc/self/statm");
    if (statm >> pages >> resident) memory.current_bytes = resident * ::sysconf(_SC_PAGESIZE);
    rusage usage{};
    if (::getrusage(RUSAGE_SELF, &usage) == 0) memory.peak_bytes = usage.ru_maxrss * 1024;
    // ru_maxrss lags the resident size (the kernel updates its high-water mark lazily).
    memory.peak_bytes = std::max(memory.peak_bytes, memory.current_bytes);
    memory.total_bytes = ::sysconf(_SC_PHYS_PAGES) * ::sysconf(_SC_PAGESIZE);
    return memory;
  }
  // Memory is left unreported: memory() already gives the process's resident bytes.
  DeviceUtilisation utilisation(int) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceUtilisation utilisation;
    utilisation.compute_share = cpu_usage_.share_since_last();
    return utilisation;
  }
  std::vector<at::ScalarType> fast_compute_dtypes(int) const override {
    return cpu_fast_dtypes(host_cpu_flags());
  }
  std::string device_name(int) const override {
    const std::string model = host_cpu_model_name();
    return model.empty() ? "cpu" : model;
  }
  // The CPU generator is torch's default one, seeded and saved by the engine itself; rng_state()
  // reads it through the default (ATen's default generator of the device).
  void manual_seed(std::uint64_t) override {}
  void save_rng_state(StateDict&) const override {}
  void load_rng_state(const StateDict&) override {}

 protected:
  std::unique_ptr<DeviceEvent> make_event(int) override {
    return std::make_unique<HostClockEvent>();
  }

 private:
  std::mutex mutex_;
  ProcessCpuUsage cpu_usage_;
};

void register_components(Registry& registry) {
  registry.add<DeviceBackend>("cpu", {}, "the host CPU", [](const Config&, const BuildContext&) {
    return std::make_unique<Cpu>();
  });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("cpu", "1.0.0", trainyard::register_components)
