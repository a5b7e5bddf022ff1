#include "trainyard/allocation_tracker.hpp"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <array>
#include <mutex>

namespace trainyard {

struct AllocationTracker::Counters : c10::MemoryReportingInfoBase {
  std::mutex mutex;
  std::array<std::int64_t, c10::COMPILE_TIME_MAX_DEVICE_TYPES> current{};
  std::array<std::int64_t, c10::COMPILE_TIME_MAX_DEVICE_TYPES> peak{};

  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t,
                         c10::Device device) override {
    const auto type = static_cast<std::size_t>(device.type());
    if (type >= current.size()) return;
    std::lock_guard<std::mutex> lock(mutex);
    current[type] += alloc_size;
    peak[type] = std::max(peak[type], current[type]);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

struct AllocationTracker::Installation {
  explicit Installation(std::shared_ptr<c10::DebugInfoBase> info)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)) {}
  c10::DebugInfoGuard guard;
};

AllocationTracker::AllocationTracker()
    : counters_(std::make_shared<Counters>()),
      installation_(std::make_unique<Installation>(counters_)) {}

AllocationTracker::~AllocationTracker() = default;

std::int64_t AllocationTracker::current_bytes(c10::DeviceType device) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return counters_->current[static_cast<std::size_t>(device)];
}

std::int64_t AllocationTracker::peak_bytes(c10::DeviceType device) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return counters_->peak[static_cast<std::size_t>(device)];
}

void AllocationTracker::reset_peak() {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  counters_->peak = counters_->current;
}

}  // namespace trainyard
