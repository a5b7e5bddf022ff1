#pragma once
// Counts the bytes LibTorch's allocators hand out while a tracker lives: live bytes now and
// their peak, per device type, from the allocators themselves, not from estimates. Accelerator
// memory comes from the caching allocators' reporting hook (the one torch.profiler's
// profile_memory uses); CPU memory from a thin allocator placed in front of LibTorch's CPU
// allocator when the first tracker is created, which remembers which tracker each allocation
// belongs to, so a free is charged back to it from whichever thread frees (a communication
// worker often drops the last reference to a collective's tensors).
// Only memory allocated while the tracker lives is counted; it covers the creating thread and
// the threads that inherit its thread-local state (the autograd engine's, intra-op workers).

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace trainyard {

class AllocationTracker {
 public:
  AllocationTracker();
  ~AllocationTracker();
  AllocationTracker(const AllocationTracker&) = delete;
  AllocationTracker& operator=(const AllocationTracker&) = delete;

  // Bytes allocated since the tracker started (or since reset_peak) and not yet freed.
  std::int64_t current_bytes(c10::DeviceType device = c10::DeviceType::CPU) const;
  // The highest current_bytes reached since the tracker started or reset_peak().
  std::int64_t peak_bytes(c10::DeviceType device = c10::DeviceType::CPU) const;
  // Starts a new peak from the current value.
  void reset_peak();
  // Starts a generation: generation_bytes() counts the bytes allocated from now on that are
  // still live, whatever else is freed meanwhile (what a forward keeps for backward, even when
  // the step freed last step's gradients before it).
  void start_generation();
  std::int64_t generation_bytes(c10::DeviceType device = c10::DeviceType::CPU) const;

  // From now on a CPU allocation that would take current_bytes() past `bytes` fails with
  // c10::OutOfMemoryError, as a device's allocator fails when it runs out (0: no limit).
  void limit_cpu_bytes(std::int64_t bytes);
  // The first allocation the limit refused: the bytes it asked for and the bytes live then.
  struct Refusal {
    std::int64_t asked = 0;
    std::int64_t live = 0;
  };
  std::optional<Refusal> refusal() const;

  struct Counters;
  struct Installation;

  // While one lives, what the calling thread (and threads inheriting its state) allocates is
  // counted by no tracker: data a run loads after its tracker started is not the step's memory.
  class Untracked {
   public:
    Untracked();
    ~Untracked();
    Untracked(const Untracked&) = delete;
    Untracked& operator=(const Untracked&) = delete;

   private:
    std::unique_ptr<Installation> installation_;
  };

 private:
  std::shared_ptr<Counters> counters_;
  std::unique_ptr<Installation> installation_;
};

}  // namespace trainyard
