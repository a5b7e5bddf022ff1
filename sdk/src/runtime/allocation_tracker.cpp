#include "trainyard/runtime/allocation_tracker.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace trainyard {

struct AllocationTracker::Counters : c10::MemoryReportingInfoBase,
                                     std::enable_shared_from_this<AllocationTracker::Counters> {
  std::mutex mutex;
  std::array<std::int64_t, c10::COMPILE_TIME_MAX_DEVICE_TYPES> current{};
  std::array<std::int64_t, c10::COMPILE_TIME_MAX_DEVICE_TYPES> peak{};
  std::array<std::int64_t, c10::COMPILE_TIME_MAX_DEVICE_TYPES> young{};  // this generation's
  std::int64_t generation = 0;
  std::int64_t cpu_limit = 0;  // 0: none
  std::optional<AllocationTracker::Refusal> refusal;
  // The generation of each accelerator allocation still live (CPU ones are kept with the
  // tracking allocator's entries).
  std::unordered_map<void*, std::int64_t> accelerator_generations;

  // Whether `bytes` more would pass the CPU limit; the first time, remembered as the refusal.
  bool refuses_cpu(std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    const std::int64_t live = current[static_cast<std::size_t>(c10::DeviceType::CPU)];
    if (cpu_limit <= 0 || live + bytes <= cpu_limit) return false;
    if (!refusal) refusal = AllocationTracker::Refusal{bytes, live};
    return true;
  }

  // Counts an allocation (bytes > 0) and returns its generation.
  std::int64_t allocated(c10::DeviceType device, std::int64_t bytes) {
    const auto type = static_cast<std::size_t>(device);
    std::lock_guard<std::mutex> lock(mutex);
    if (type >= current.size()) return generation;
    current[type] += bytes;
    young[type] += bytes;
    peak[type] = std::max(peak[type], current[type]);
    return generation;
  }
  void freed(c10::DeviceType device, std::int64_t bytes, std::int64_t of_generation) {
    const auto type = static_cast<std::size_t>(device);
    std::lock_guard<std::mutex> lock(mutex);
    if (type >= current.size()) return;
    current[type] -= bytes;
    if (of_generation == generation) young[type] -= bytes;
  }

  // The accelerators' caching allocators report here. CPU memory is counted by the tracking CPU
  // allocator below instead, because the allocators report a free to the freeing thread's
  // tracker: a tensor a communication worker thread frees would stay counted forever.
  void reportMemoryUsage(void* pointer, int64_t alloc_size, size_t, size_t,
                         c10::Device device) override {
    if (device.type() == c10::DeviceType::CPU) return;
    if (alloc_size >= 0) {
      const std::int64_t of_generation = allocated(device.type(), alloc_size);
      std::lock_guard<std::mutex> lock(mutex);
      accelerator_generations[pointer] = of_generation;
      return;
    }
    std::int64_t of_generation = -1;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (auto found = accelerator_generations.find(pointer);
          found != accelerator_generations.end()) {
        of_generation = found->second;
        accelerator_generations.erase(found);
      }
    }
    freed(device.type(), -alloc_size, of_generation);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

namespace {

// The tracker of the calling thread, if one is installed there (or inherited with the thread's
// local state, as the autograd engine's and intra-op threads do).
std::shared_ptr<AllocationTracker::Counters> current_counters() {
  auto* info = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
  auto* counters = dynamic_cast<AllocationTracker::Counters*>(info);
  if (counters == nullptr) return nullptr;
  return counters->shared_from_this();
}

// Stands in front of LibTorch's CPU allocator once a tracker has been created, for the rest of
// the process (storages keep a pointer to the allocator that made them, so it must never go
// away). An allocation made under a tracker is remembered with that tracker; its free is
// charged back to the same tracker from whichever thread it happens on. Allocations outside
// any tracker pass through untouched.
class TrackingCpuAllocator final : public c10::Allocator {
 public:
  explicit TrackingCpuAllocator(c10::Allocator* inner) : inner_(inner) {
    untracked_deleter() = inner->raw_deleter();
  }

  c10::DataPtr allocate(std::size_t bytes) override {
    auto counters = current_counters();
    if (counters && counters->refuses_cpu(static_cast<std::int64_t>(bytes))) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU allocation of ", bytes,
                       " bytes refused: it would pass the tracker's memory limit");
    }
    c10::DataPtr data = inner_->allocate(bytes);
    const auto inner_deleter = inner_->raw_deleter();
    // Only plain allocations (the data is its own context, freed by the inner raw deleter) can
    // be re-labelled without changing what frees them.
    if (counters == nullptr || inner_deleter == nullptr || data.get() != data.get_context()) {
      return data;
    }
    void* pointer = data.release_context();
    const std::int64_t generation =
        counters->allocated(c10::DeviceType::CPU, static_cast<std::int64_t>(bytes));
    {
      std::lock_guard<std::mutex> lock(live_mutex());
      live()[pointer] =
          Live{std::move(counters), static_cast<std::int64_t>(bytes), inner_deleter, generation};
    }
    return {pointer, pointer, &free_tracked, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_tracked; }

  void copy_data(void* destination, const void* source, std::size_t count) const override {
    inner_->copy_data(destination, source, count);
  }

 private:
  struct Live {
    std::shared_ptr<AllocationTracker::Counters> counters;
    std::int64_t bytes = 0;
    c10::DeleterFnPtr inner_deleter = nullptr;
    std::int64_t generation = 0;
  };

  static std::mutex& live_mutex() {
    static std::mutex mutex;
    return mutex;
  }
  // The inner allocator's raw deleter, set once when this allocator is installed.
  static c10::DeleterFnPtr& untracked_deleter() {
    static c10::DeleterFnPtr deleter = nullptr;
    return deleter;
  }
  static std::unordered_map<void*, Live>& live() {
    static auto* map = new std::unordered_map<void*, Live>();  // outlives static destruction
    return *map;
  }

  static void free_tracked(void* pointer) {
    Live entry;
    {
      std::lock_guard<std::mutex> lock(live_mutex());
      auto found = live().find(pointer);
      if (found == live().end()) {
        // Made outside any tracker and handed back through raw_deallocate, which asks this
        // allocator for its deleter: the inner allocator's frees it.
        if (untracked_deleter() != nullptr) untracked_deleter()(pointer);
        return;
      }
      entry = std::move(found->second);
      live().erase(found);
    }
    entry.counters->freed(c10::DeviceType::CPU, entry.bytes, entry.generation);
    entry.inner_deleter(pointer);
  }

  c10::Allocator* inner_;
};

void install_tracking_cpu_allocator() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    static auto* allocator = new TrackingCpuAllocator(c10::GetCPUAllocator());
    c10::SetAllocator(c10::DeviceType::CPU, allocator, /*priority=*/UINT8_MAX);
  });
}

}  // namespace

struct AllocationTracker::Installation {
  explicit Installation(std::shared_ptr<c10::DebugInfoBase> info)
      : guard(c10::DebugInfoKind::PROFILER_STATE, std::move(info)) {}
  c10::DebugInfoGuard guard;
};

AllocationTracker::AllocationTracker()
    : counters_(std::make_shared<Counters>()) {
  install_tracking_cpu_allocator();
  installation_ = std::make_unique<Installation>(counters_);
}

AllocationTracker::~AllocationTracker() = default;

namespace {

// Stands where a tracker would (a guard without any info changes nothing), so that no tracker
// is found. It must be a memory reporter: the allocators report to whatever the slot holds.
struct NoTracker : c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void*, int64_t, size_t, size_t, c10::Device) override {}
  bool memoryProfilingEnabled() const override { return false; }
};

}  // namespace

AllocationTracker::Untracked::Untracked()
    : installation_(std::make_unique<Installation>(std::make_shared<NoTracker>())) {}

AllocationTracker::Untracked::~Untracked() = default;

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

void AllocationTracker::start_generation() {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  ++counters_->generation;
  counters_->young = {};
}

std::int64_t AllocationTracker::generation_bytes(c10::DeviceType device) const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return counters_->young[static_cast<std::size_t>(device)];
}

void AllocationTracker::limit_cpu_bytes(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  counters_->cpu_limit = bytes;
}

std::optional<AllocationTracker::Refusal> AllocationTracker::refusal() const {
  std::lock_guard<std::mutex> lock(counters_->mutex);
  return counters_->refusal;
}

}  // namespace trainyard
