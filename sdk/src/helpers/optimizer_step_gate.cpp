#include "trainyard/runtime/optimizer_step_gate.hpp"

#include <utility>

namespace trainyard {

void OptimizerStepGate::hold(std::shared_future<void> done) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = std::move(done);
}

void OptimizerStepGate::enter() {
  std::shared_future<void> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = std::move(done_);
    done_ = {};
  }
  if (done.valid()) done.wait();
}

bool OptimizerStepGate::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_.valid();
}

}  // namespace trainyard
