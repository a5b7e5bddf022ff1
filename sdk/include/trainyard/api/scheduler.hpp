#pragma once
// Learning-rate schedules.

#include <cstdint>

#include "trainyard/api/component.hpp"

namespace trainyard {

// A schedule is a pure function of the step, so resuming needs no state of its own.
// learning_rate(0, ...) is the rate of the first optimizer step.
class LrScheduler : public Component {
 public:
  static constexpr const char* kKind = "scheduler";
  virtual double learning_rate(std::int64_t step, std::int64_t total_steps,
                               double base_lr) const = 0;
};

}  // namespace trainyard
