// Sim device memory: 64-byte aligned host allocations, counted per device.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "sim_device_state.hpp"
#include "sim_runtime.hpp"

namespace sim {
namespace {

struct DeviceCounters {
  std::atomic<std::int64_t> allocated{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::int64_t> allocations{0};
};

std::array<DeviceCounters, kMaxDevices> counters;

// What a deleter needs to give the bytes back to the right device's count.
struct Allocation {
  void* data;
  std::size_t bytes;
  int device;
};

void release(void* context) {
  auto* allocation = static_cast<Allocation*>(context);
  counters[allocation->device].allocated -= static_cast<std::int64_t>(allocation->bytes);
  std::free(allocation->data);
  delete allocation;
}

class SimAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    const int index = current_device();
    void* data = nullptr;
    if (bytes > 0) {
      // Rounded up: aligned_alloc wants a multiple of the alignment.
      const std::size_t rounded = (bytes + 63) / 64 * 64;
      data = std::aligned_alloc(64, rounded);
      TORCH_CHECK(data != nullptr, "sim: out of memory allocating ", bytes, " bytes");
    }
    auto& count = counters[index];
    ++count.allocations;
    const std::int64_t now = count.allocated += static_cast<std::int64_t>(bytes);
    std::int64_t peak = count.peak.load();
    while (now > peak && !count.peak.compare_exchange_weak(peak, now)) {
    }
    auto* allocation = new Allocation{data, bytes, index};
    return {data, allocation, &release, c10::Device(c10::DeviceType::PrivateUse1, index)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

SimAllocator allocator;

}  // namespace

MemoryStats memory_stats(int index) {
  check_device_index(index);
  const auto& count = counters[index];
  return {count.allocated.load(), count.peak.load(), count.allocations.load()};
}

void reset_peak_memory(int index) {
  check_device_index(index);
  counters[index].peak = counters[index].allocated.load();
}

// Registered when the library loads, before any sim tensor can exist.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator)

}  // namespace sim
