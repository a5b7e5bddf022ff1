#pragma once
// A step that ran out of memory: the allocator refused an allocation (a device's, or the host's
// under run.memory_limit). What the engine knows about it, for a report that says what to change
// rather than a bare allocator message.

#include <cstdint>
#include <string>

#include "trainyard/api/error.hpp"
#include "trainyard/api/held_bytes.hpp"

namespace trainyard {

struct MemoryShortage {
  int rank = 0;
  std::int64_t step = 0;         // counted from 1
  std::string phase;             // step_phase_name() of the phase in progress
  std::int64_t live_bytes = 0;   // counted by the run's tracker when the allocation failed
  std::int64_t asked_bytes = 0;  // 0 when the device's allocator did not say
  std::int64_t limit_bytes = 0;  // run.memory_limit; 0 for a device's own capacity
  HeldBytes held;                // the strategy's parameters, gradients and optimizer state
};

class MemoryExhausted : public Error {
 public:
  explicit MemoryExhausted(MemoryShortage shortage);
  const MemoryShortage& shortage() const { return shortage_; }

 private:
  MemoryShortage shortage_;
};

}  // namespace trainyard
